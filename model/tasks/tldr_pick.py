"""``python -m model pick-policy tldr --speedup S --run DIR``: the TL;DR policy a speedup ships, chosen on the
held-out slice by a rule fixed before any reported post was read.

The rule: the adapters the run kept at every CANDIDATE_EVERY steps (adapter-step-N; the saves between them
are not scored: a candidate costs a pass over the held-out posts) and the general skip policy (what the
speedup runs without a TL;DR policy) summarise the 100 held-out posts (tldr.split_posts) greedily, on the
CPU default weights, under the task's schedule; each is scored by its ROUGE-L share of the 1x arm's.
The checkpoint with the highest share is chosen (the earlier step on a tie) and ships only where it beats
the general policy's share by more than MIN_GAIN; otherwise the general policy stays. The reported posts
are never read here, and the 1x arm is the same for every candidate, so shares are compared as they are.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from model.generation.generator import TextGenerator
from model.loading import load_model
from model.skipdecode.skip_policy import export_adapter
from model.tasks.tldr import mean, read_posts, split_posts
from model.tasks.tldr_eval import TldrEvalConfig, run_arm
from model.tasks.tldr_training import policy_folder
from model.training.checkpoints import portable_path

CANDIDATE_EVERY = 100
MIN_GAIN = 0.005  # a share point in 200: below it the trained policy is not worth shipping over the general one
GENERAL = "general"
PICKS_FILE = Path("assets/eval/tldr-picks.json")


@dataclass(frozen=True)
class Candidate:
    name: str  # "general" or "adapter-step-000050"
    step: int | None
    rouge_l: float  # mean ROUGE-L F1 x 100 on the held-out posts
    share: float  # of the 1x arm's


def kept_adapters(run: Path, every: int = CANDIDATE_EVERY) -> list[Path]:
    """The run's kept checkpoints (adapter-step-N) at multiples of ``every`` steps, in step order."""
    kept = [path for path in Path(run).glob("adapter-step-*") if (path / "adapter_config.json").is_file()]
    return sorted(path for path in kept if step_of(path) % every == 0)


def step_of(folder: Path) -> int:
    found = re.search(r"step-(\d+)$", folder.name)
    if not found:
        raise ValueError(f"{folder} is not a kept checkpoint (adapter-step-N)")
    return int(found.group(1))


def choose(candidates: list[Candidate], min_gain: float = MIN_GAIN) -> Candidate:
    """The rule (the module's docstring): the best checkpoint where it beats the general policy by more
    than ``min_gain``, else the general policy."""
    general = next(c for c in candidates if c.name == GENERAL)
    trained = sorted((c for c in candidates if c.name != GENERAL), key=lambda c: (-c.share, c.step))
    return trained[0] if trained and trained[0].share > general.share + min_gain else general


def load(adapter: str | None, model: str | None, device: str) -> TextGenerator:
    quantize = "auto" if model is None else "none"  # the CPU default weights; a test's tiny model as it is
    return TextGenerator(load_model(model, adapter=adapter, device=device, dtype="auto", quantize=quantize))


def pick_policy(run: Path, speedup: float, posts: int | None = None, model: str | None = None,
                device: str = "auto", export_root: Path | None = None, picks_file: Path = PICKS_FILE,
                config: TldrEvalConfig | None = None, every: int = CANDIDATE_EVERY) -> dict:
    """Score the candidates, apply the rule, export the chosen checkpoint to the shipped policy's folder
    (under ``export_root``, default the task adapters; nothing where the general policy stays) and record
    the pick in ``picks_file`` (one entry per speedup)."""
    config = config or TldrEvalConfig(speedups=(speedup,), prompt_depth_speedups=())
    heldout = split_posts(read_posts())[0]
    heldout = heldout[:posts] if posts else heldout
    full_mean = mean(run_arm(load(None, model, device), heldout, config, 1.0).rouge["rougeL"])

    def candidate(name: str, step: int | None, adapter: str | None) -> Candidate:
        rouge_l = mean(run_arm(load(adapter, model, device), heldout, config, speedup).rouge["rougeL"])
        return Candidate(name, step, round(100 * rouge_l, 2), round(rouge_l / full_mean, 4) if full_mean else 0.0)

    general_adapter = "auto" if model is None else None  # a test's tiny model has no general policy: none
    candidates = [candidate(GENERAL, None, general_adapter)]
    candidates += [candidate(kept.name, step_of(kept), str(kept)) for kept in kept_adapters(run, every)]
    chosen = choose(candidates)
    exported = None
    if chosen.name != GENERAL:
        destination = policy_folder(speedup, export_root)
        export_adapter(Path(run) / chosen.name, destination)
        exported = portable_path(str(destination))
    entry = {"speedup": speedup, "run": str(run), "candidate_every": every, "heldout_posts": len(heldout), "full_rouge_l": round(100 * full_mean, 2),
             "candidates": [asdict(c) for c in candidates], "chosen": chosen.name, "exported": exported,
             "rule": f"the checkpoints every {every} steps and the general policy on the held-out posts: the highest "
                     f"ROUGE-L share of the 1x arm; a checkpoint ships only above the general policy's share + {MIN_GAIN}"}
    record = json.loads(picks_file.read_text()) if picks_file.is_file() else {}
    record[f"{speedup:g}x"] = entry
    picks_file.parent.mkdir(parents=True, exist_ok=True)
    picks_file.write_text(json.dumps(record, indent=2) + "\n")
    return entry
