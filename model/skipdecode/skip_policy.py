"""The learned parts of a skip policy, built so that they act ONLY where layers are bypassed.

A position that runs every layer must give exactly the original model (so "1x" in the app IS
the full model). Two pieces respect that by construction:

* gated LoRA: the LoRA delta of every adapted linear is multiplied by a per-position gate,
  1 where the position bypasses at least one layer, 0 where it runs them all. In the cached
  decoder the same thing is two weight sets: full-depth steps (and a full-depth prefill) run the
  original weights, skipping steps run the merged ones; the KV cache each step writes is exactly
  what the gated teacher-forced forward computes at that position.
* the entry bridge: a small identity-initialised low-rank residual map, one per entry layer,
  applied to the hidden state where it jumps over bypassed layers (before the first layer that
  runs after a gap). At full depth there is no gap, so it never runs.

Files: an adapter folder holds peft's adapter (adapter_config.json, adapter_model.safetensors)
and, when trained with a bridge, bridge.safetensors + bridge.json.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Sequence

import torch
from torch import nn

from model.common.checks import check_int, check_number

BRIDGE_WEIGHTS = "bridge.safetensors"
BRIDGE_CONFIG = "bridge.json"


class EntryBridge(nn.Module):
    """h -> h + up_j(down_j(rms(h))) for entry layer j; up is zero-initialised (identity at start).

    The input is RMS-normalised first because residual streams of pre-norm models carry large
    outlier dimensions; the map then learns a correction in the residual's own scale.
    """

    def __init__(self, num_layers: int, hidden_size: int, rank: int = 16) -> None:
        super().__init__()
        self.num_layers, self.hidden_size, self.rank = num_layers, hidden_size, rank
        self.down = nn.Parameter(torch.randn(num_layers, hidden_size, rank) * hidden_size ** -0.5)  # (L, C, r)
        self.up = nn.Parameter(torch.zeros(num_layers, rank, hidden_size))  # (L, r, C)

    def forward(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (..., C) entering ``layer`` after a gap -> bridged hidden (..., C)."""
        normed = hidden * torch.rsqrt(hidden.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(hidden.dtype)
        return hidden + (normed @ self.down[layer].to(hidden.dtype)) @ self.up[layer].to(hidden.dtype)

    def save(self, folder: str | Path) -> None:
        from safetensors.torch import save_file  # noqa: PLC0415

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"down": self.down.detach().float().cpu().contiguous(),
                   "up": self.up.detach().float().cpu().contiguous()}, str(folder / BRIDGE_WEIGHTS))
        (folder / BRIDGE_CONFIG).write_text(json.dumps(
            {"num_layers": self.num_layers, "hidden_size": self.hidden_size, "rank": self.rank}, indent=2))

    @classmethod
    def load(cls, folder: str | Path, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> "EntryBridge | None":
        """The bridge saved in ``folder``, or None when the folder has none."""
        from safetensors.torch import load_file  # noqa: PLC0415

        folder = Path(folder)
        if not (folder / BRIDGE_WEIGHTS).is_file():
            return None
        config = json.loads((folder / BRIDGE_CONFIG).read_text())
        bridge = cls(config["num_layers"], config["hidden_size"], config["rank"])
        weights = load_file(str(folder / BRIDGE_WEIGHTS))
        bridge.load_state_dict(weights)
        return bridge.to(device=device, dtype=dtype).eval().requires_grad_(False)


def entry_layers(layers: Sequence[int]) -> frozenset[int]:
    """Layers of one position's (sorted) layer set that are entered after a gap: run j, bypass j - 1."""
    executed = set(layers)
    return frozenset(j for j in executed if j >= 1 and j - 1 not in executed)


def bypasses(executes: torch.Tensor) -> torch.Tensor:
    """(..., T, L) execution mask -> (..., T) float gate: 1 where a position bypasses any layer."""
    return (~executes.all(dim=-1)).float()


# --- gated LoRA (peft) -------------------------------------------------------------------------


class _Gate:
    """The per-position gate the LoRA hooks read: (B, T) or (T,) float, or None for 'always on'."""

    def __init__(self) -> None:
        self.value: torch.Tensor | None = None


def _lora_b_modules(model: nn.Module) -> list[nn.Module]:
    found: list[nn.Module] = []
    for module in model.modules():
        lora_b = getattr(module, "lora_B", None)
        if isinstance(lora_b, nn.ModuleDict):
            found.extend(lora_b.values())
    return found


def install_lora_gate(model: nn.Module) -> _Gate:
    """Hook every peft lora_B so its output (the LoRA delta before scaling) is multiplied by the
    gate of its position. Idempotent; returns the model's gate holder."""
    gate = getattr(model, "_skipdecode_gate", None)
    if gate is not None:
        return gate
    gate = _Gate()

    def hook(_module: nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        value = gate.value
        if value is None:
            return output
        # value (B, T). Layers may run on a prefix of the positions (masked_forward's shortcut):
        # slice the gate. Some families (OPT's feed-forward) flatten (B, T, C) to (B * T, C).
        if output.dim() == 2:
            length = output.shape[0] // value.shape[0]
            return output * value[:, :length].reshape(-1, 1).to(output.dtype)
        return output * value[:, : output.shape[-2], None].to(output.dtype)

    modules = _lora_b_modules(model)
    if not modules:
        raise ValueError("install_lora_gate: the model has no peft LoRA layers")
    for module in modules:
        module.register_forward_hook(hook)
    object.__setattr__(model, "_skipdecode_gate", gate)
    return gate


@contextlib.contextmanager
def gated(model: nn.Module, executes: torch.Tensor | None, batch_size: int = 1) -> Iterator[None]:
    """Within the block, LoRA acts only at positions of ``executes`` (T, L) shared by a batch of
    ``batch_size``, or (B, T, L), that bypass layers. A model without LoRA is left as it is."""
    gate = getattr(model, "_skipdecode_gate", None)
    if gate is None or executes is None:
        yield
        return
    previous = gate.value
    # The schedule is built on the CPU; the hooks multiply on the model's device (once here, not
    # once per LoRA module).
    value = bypasses(executes).to(next(model.parameters()).device)  # (T,) or (B, T)
    gate.value = value.expand(batch_size, -1) if value.dim() == 1 else value
    try:
        yield
    finally:
        gate.value = previous


# --- shipping -------------------------------------------------------------------------------------

ADAPTER_FILES = ("adapter_config.json", "training_info.json", BRIDGE_CONFIG)
WEIGHT_FILES = ("adapter_model.safetensors", BRIDGE_WEIGHTS)


@dataclass(frozen=True)
class ScheduleFloor:
    """The skip policy's measured default shape: at linear decay and target speedups up to
    ``up_to_speedup``, no step runs fewer than ``layers`` layers (the solver's own shape decays to
    one layer). Stored in training_info.json's "skip_policy" as "schedule_floor"; decided by a
    paired comparison (``eval --candidate-floor``), never by training."""

    layers: int
    up_to_speedup: float

    def __post_init__(self) -> None:
        check_int("schedule floor layers", self.layers, low=1)
        check_number("schedule floor up_to_speedup", self.up_to_speedup, above=1)


def export_adapter(source: str | Path, destination: str | Path, dtype: torch.dtype = torch.bfloat16,
                   schedule_floor: ScheduleFloor | None = None) -> list[Path]:
    """Copy a trained adapter folder for shipping: its configs as they are (with ``schedule_floor``
    recorded in its skip policy when given), its weights cast to ``dtype`` (bfloat16 halves the
    file; loading casts back to the model's dtype), and not peft's auto-generated model card (the
    shipped folder carries its own README). Returns the files written."""
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    source, destination = Path(source), Path(destination)
    if not (source / "adapter_config.json").is_file():
        raise ValueError(f"{source} is not an adapter folder (no adapter_config.json)")
    if schedule_floor is not None and not (source / "training_info.json").is_file():
        raise ValueError(f"{source} has no training_info.json to record the schedule floor in")
    destination.mkdir(parents=True, exist_ok=True)
    written = []
    for name in ADAPTER_FILES:
        if (source / name).is_file():
            content = (source / name).read_bytes()
            if name == "training_info.json" and schedule_floor is not None:
                info = json.loads(content)
                info.setdefault("skip_policy", {})["schedule_floor"] = asdict(schedule_floor)
                content = (json.dumps(info, indent=2) + "\n").encode()
            (destination / name).write_bytes(content)
            written.append(destination / name)
    for name in WEIGHT_FILES:
        if (source / name).is_file():
            tensors = {key: value.to(dtype).contiguous() for key, value in load_file(str(source / name)).items()}
            save_file(tensors, str(destination / name))
            written.append(destination / name)
    return written


# --- mixing two adapters ------------------------------------------------------------------------


@dataclass
class MixResult:
    """What ``mix_adapters`` wrote: the folder, the rank, and how much of the mixed delta's energy
    (squared Frobenius norm) the rank kept, over the adapted weights (1.0 where nothing was cut)."""

    destination: Path
    rank: int
    kept_energy_min: float
    kept_energy_mean: float


def mix_adapters(first: str | Path, second: str | Path, destination: str | Path, weight: float,
                 rank: int | None = None, dtype: torch.dtype = torch.bfloat16) -> MixResult:
    """A LoRA adapter whose delta is ``weight`` x the first's + (1 - weight) x the second's, per
    adapted weight (a "soup" of two fine-tunes of the same base: the two deltas interpolate).

    Both must be gated skip-policy LoRAs of the same base, the same target modules and the same
    alpha / r scale, without entry bridges. The mixed delta has rank <= r1 + r2; it is stored at
    ``rank`` (default: the larger of the two ranks, so the file stays the size of the larger
    adapter) by truncated SVD of each delta (exact when r1 + r2 <= rank). The first adapter's
    training_info.json (its placement and schedule) is kept, with the mix recorded in it.
    """
    from safetensors.torch import load_file, save_file  # noqa: PLC0415

    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"mix weight must be within [0, 1], got {weight}")
    first, second, destination = Path(first), Path(second), Path(destination)
    configs = [_lora_config(folder) for folder in (first, second)]
    scales = [config["lora_alpha"] / config["r"] for config in configs]
    if abs(scales[0] - scales[1]) > 1e-9:
        raise ValueError(f"adapters scale their deltas differently (alpha / r: {scales[0]} vs {scales[1]})")
    if sorted(configs[0]["target_modules"]) != sorted(configs[1]["target_modules"]):
        raise ValueError("adapters adapt different modules")
    tensors = [load_file(str(folder / "adapter_model.safetensors")) for folder in (first, second)]
    if set(tensors[0]) != set(tensors[1]):
        raise ValueError("adapters hold different LoRA weights (not the same base or target modules)")
    rank = rank or max(config["r"] for config in configs)
    mixed: dict[str, torch.Tensor] = {}
    kept: list[float] = []
    for key_a in sorted(key for key in tensors[0] if key.endswith("lora_A.weight")):
        key_b = key_a.replace("lora_A", "lora_B")
        # delta = B @ A (out, in); both scaled by the same alpha / r, which the result keeps.
        u, s, vh = _factored_svd(
            torch.cat([weight * tensors[0][key_b].double(), (1.0 - weight) * tensors[1][key_b].double()], dim=1),
            torch.cat([tensors[0][key_a].double(), tensors[1][key_a].double()], dim=0), rank)
        total = float((s ** 2).sum())
        kept.append(float((s[:rank] ** 2).sum()) / total if total > 0 else 1.0)
        root = s[:rank].sqrt()
        mixed[key_b] = (u[:, :rank] * root).to(dtype).contiguous()  # (out, rank)
        mixed[key_a] = (root[:, None] * vh[:rank]).to(dtype).contiguous()  # (rank, in)
    destination.mkdir(parents=True, exist_ok=True)
    save_file(mixed, str(destination / "adapter_model.safetensors"))
    alpha = scales[0] * rank
    config = dict(configs[0], r=rank, lora_alpha=int(alpha) if float(alpha).is_integer() else alpha)
    (destination / "adapter_config.json").write_text(json.dumps(config, indent=2))
    result = MixResult(destination, rank, min(kept), sum(kept) / len(kept))
    info_path = first / "training_info.json"
    info = json.loads(info_path.read_text()) if info_path.is_file() else {}
    info["mixed"] = {"first": str(first), "second": str(second), "weight": weight, "rank": rank,
                     "kept_energy_min": result.kept_energy_min, "kept_energy_mean": result.kept_energy_mean}
    (destination / "training_info.json").write_text(json.dumps(info, indent=2))
    return result


def _factored_svd(b: torch.Tensor, a: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The SVD of ``b @ a`` ((out, k) @ (k, in), k = r1 + r2) through its factors: a QR of each and
    the SVD of the small core, the full product's singular values and vectors at a fraction of its
    cost (minutes of CPU for a rank-64 adapter of the default model become seconds). Padded with
    zeros to at least ``rank`` values, so a rank above k stores exact zero directions."""
    qb, rb = torch.linalg.qr(b)  # (out, m), (m, k)
    qa, ra = torch.linalg.qr(a.T)  # (in, n), (n, k)
    u, s, vh = torch.linalg.svd(rb @ ra.T, full_matrices=False)  # (m, p), (p,), (p, n)
    u, vh = qb @ u, vh @ qa.T  # (out, p), (p, in)
    missing = rank - s.shape[0]
    if missing > 0:
        u = torch.cat([u, u.new_zeros(u.shape[0], missing)], dim=1)
        s = torch.cat([s, s.new_zeros(missing)])
        vh = torch.cat([vh, vh.new_zeros(missing, vh.shape[1])], dim=0)
    return u, s, vh


def _lora_config(folder: Path) -> dict:
    """The adapter's config when it is plain LoRA (one delta B @ A x alpha / r per Linear: the
    same test as running it beside low-bit weights, side_lora_config)."""
    if not (folder / "adapter_config.json").is_file():
        raise ValueError(f"{folder} is not an adapter folder (no adapter_config.json)")
    if (folder / BRIDGE_WEIGHTS).is_file():
        raise ValueError(f"{folder} has an entry bridge: mixing covers LoRA weights only")
    config = side_lora_config(folder)
    if config is None:
        raise ValueError(f"{folder}: only plain LoRA (one rank and alpha, no rsLoRA, DoRA or per-module "
                         "patterns) can be mixed")
    return config


def side_lora_config(adapter_path: Path | None) -> dict | None:
    """The adapter's LoRA settings when it can run BESIDE low-bit weights (plain LoRA on Linear
    layers: no DoRA, rsLoRA, bias or modules_to_save), else None (it is merged instead)."""
    if adapter_path is None:
        return None
    config_file, weights = Path(adapter_path) / "adapter_config.json", Path(adapter_path) / "adapter_model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        return None
    config = json.loads(config_file.read_text())
    plain = (config.get("peft_type") == "LORA" and config.get("bias", "none") == "none"
             and not any(config.get(name) for name in NOT_PLAIN_LORA))
    return config if plain else None


# peft LoRA options that change what the adapter computes beyond W x + s B A x on Linear layers.
NOT_PLAIN_LORA = ("use_dora", "use_rslora", "lora_bias", "modules_to_save", "fan_in_fan_out", "rank_pattern",
                  "alpha_pattern", "target_parameters", "trainable_token_indices", "layer_replication",
                  "use_qalora", "use_bdlora", "alora_invocation_tokens", "layers_pattern")
