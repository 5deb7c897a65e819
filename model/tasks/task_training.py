"""``python -m model train-task e2e``: the task model and its skip policies, the paper's way.

* the task model (``--policy task``, the default): LoRA on every linear, every layer at every
  position, cross-entropy on the references (the paper's 1x: the model fine-tuned without skipping);
* a skip policy (``--policy 2`` ... ``5``): a GATED LoRA on top of the task model, trained under
  ONE schedule, the task's (linear decay over its decay length, floored; model/tasks/task_models.py),
  cross-entropy on the references (``--kl W`` adds W x KL to the task model), as the paper trains
  one model per target speedup;
* ``--policy all``: one gated LoRA for every speedup, a random target in [1.5, 5] per batch on the
  same schedule shape (the project's random-schedule recipe).

A policy learns the references (``--targets references``, the paper's way) or the task model's
own greedy descriptions (``--targets task-model``: sequence-level distillation,
model/tasks/task_distill.py), which can add ``--synthetic-mrs`` new MRs that have no references.

Both train on devset.csv less its held-out MRs (model/tasks/e2e.py); checkpoints every
``--save-every`` steps, ``--resume`` continues the last one. At the end the run scores itself on
the held-out MRs (BLEU), the number used to choose between runs; the test set is never read.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from model.common.checks import check_int, check_number
from model.generation.generator import TextGenerator
from model.loading import load_model, resolve_device
from model.skipdecode.skip_policy import export_adapter
from model.tasks.e2e import (
    INVENTED_PLACES_HELDOUT,
    INVENTED_STYLES,
    SYNTHETIC_ATTRIBUTE_SHARE,
    E2ERecord,
    dev_split,
    heldout_new_mrs,
    long_heldout_mrs,
    relexicalised_records,
    training_places,
    write_training_file,
)
from model.tasks.task_distill import (
    DistillSource,
    adapter_fingerprint,
    adopt_distillation_file,
    write_distillation_file,
)
from model.tasks.task_eval import (
    batch_for,
    closeness,
    describe,
    made_up_beyond_share,
    made_up_share,
    near_named_share,
    task_scores,
)
from model.tasks.task_models import check_task, policy_name, task_adapter_dir, task_schedule
from model.training.training import TrainConfig, TrainResult, train

SHARED_SPEEDUP_RANGE = (1.5, 5.0)
HELDOUT_BATCH = 25
TARGET_KINDS = ("references", "task-model")
HELDOUT_RELEX_COPIES = 2  # rewritten copies of each held-out MR scored by a --relexicalised run
HELDOUT_RELEX_SEED = 1
HELDOUT_LONG_SEED = 2  # the long held-out MRs (all eight attributes), never a training MR of a seed-0 run
HELDOUT_SPARSE_SEED = 3  # the held-out MRs with few facts (sparse_mr_made_up), never a training MR of a seed-0 run
SPARSE_ATTRIBUTE_SHARE = 0.5


@dataclass
class TaskRun:
    """One train-task run: which model, how long, where."""

    task: str = "e2e"
    policy: str = "task"  # "task", a target speedup ("2", "3", ...), or "all"
    steps: int = 600
    batch_size: int = 16
    learning_rate: float | None = None  # None: 1e-3 for the task model, 5e-4 for a policy
    lora_rank: int | None = None  # None: the task's (TaskSettings.lora_rank)
    # > 0: a policy also learns an entry bridge of this rank where the hidden state enters a layer
    # after bypassed ones (docs/DESIGN.md); zero-initialised, so a run continuing a bridgeless
    # policy (--init-adapter) starts from exactly its outputs
    bridge_rank: int = 0
    kl_weight: float = 0.0
    # > 0: a target token the policy's greedy choice misses weighs 1 + this in the cross-entropy (a
    # policy only): the stop the task model makes and a policy at its floor runs past
    flip_weight: float = 0.0
    task_adapter: str | None = None  # None: the shipped task model (assets/adapters/<task>/task)
    output_dir: str | None = None  # None: runs/<task>-<policy name>
    export: str | None = None  # a folder to export the final adapter to (bfloat16)
    resume: bool = False
    save_every: int = 100
    device: str = "auto"
    threads: int | None = None
    seed: int = 0
    heldout_mrs: int = 50  # held-out MRs scored at the end (0: none)
    init_adapter: str | None = None  # continue from a trained adapter's weights (e.g. a GPU run's export)
    targets: str = "references"  # or "task-model": the task model's greedy descriptions (a policy only)
    synthetic_mrs: int = 0  # new MRs besides the devset's (task-model targets only: they have no references)
    relexicalised: int = 0  # rewritten copies of each training MR, other eatType/food (references targets only)
    invented_places: float = 0.0  # the share of the synthetic MRs about invented places (task-model targets)
    invented_style: str = "fixed"  # the 256 fixed names, or "varied" (model/tasks/e2e.py: varied_places)
    complete_references: bool = False  # only references that mention every fact of their MR (references targets)
    targets_file: str | None = None  # task-model targets made elsewhere from the same source (a GPU's pass)
    # each optional attribute's chance in a synthetic MR (0.5: every subset of the facts equally likely)
    synthetic_attribute_share: float = SYNTHETIC_ATTRIBUTE_SHARE

    def __post_init__(self) -> None:
        check_task(self.task)
        if self.targets not in TARGET_KINDS:
            raise ValueError(f"--targets must be one of {', '.join(TARGET_KINDS)}; got {self.targets!r}")
        if self.targets == "task-model" and self.policy == "task":
            raise ValueError("--targets task-model distils the task model into a skip policy: it needs --policy 2 ... 5 or all")
        if self.synthetic_mrs and self.targets != "task-model":
            raise ValueError("--synthetic-mrs have no references: they need --targets task-model")
        if self.relexicalised and self.targets != "references":
            raise ValueError("--relexicalised rewrites references: it needs --targets references")
        if not 0 <= self.relexicalised <= 20:
            raise ValueError(f"--relexicalised must be in [0, 20] copies per MR; got {self.relexicalised}")
        if not 0 <= self.invented_places <= 1:
            raise ValueError(f"--invented-places is a share of the synthetic MRs, in [0, 1]; got {self.invented_places}")
        if self.invented_style not in INVENTED_STYLES:
            raise ValueError(f"--invented-style must be one of {', '.join(INVENTED_STYLES)}; got {self.invented_style!r}")
        if self.invented_style != "fixed" and not self.invented_places:
            raise ValueError("--invented-style chooses the names of the --invented-places: give a share")
        if self.complete_references and self.targets != "references":
            raise ValueError("--complete-references filters the references: it needs --targets references")
        if self.targets_file and self.targets != "task-model":
            raise ValueError("--targets-file holds the task model's descriptions: it needs --targets task-model")
        check_number("--synthetic-attribute-share", self.synthetic_attribute_share, above=0, high=1)
        if self.synthetic_attribute_share != SYNTHETIC_ATTRIBUTE_SHARE and not self.synthetic_mrs:
            raise ValueError("--synthetic-attribute-share shapes the --synthetic-mrs: give some")
        if self.invented_places and not self.synthetic_mrs:
            raise ValueError("--invented-places shares out the --synthetic-mrs: give some")
        if not 0 <= self.synthetic_mrs <= 20000:
            raise ValueError(f"--synthetic-mrs must be in [0, 20000]; got {self.synthetic_mrs}")
        if self.policy not in ("task", "all"):
            try:
                speedup = float(self.policy)
            except ValueError:
                raise ValueError(f"--policy must be task, all or a target speedup such as 3; got {self.policy!r}") from None
            if not 1 < speedup <= 6:
                raise ValueError(f"--policy speedup must be in (1, 6]; got {self.policy}")
        if self.flip_weight and self.policy == "task":
            raise ValueError("--flip-weight weighs the tokens a skip policy's greedy choice misses: it needs --policy 2 ... 5 or all")
        check_number("--flip-weight", self.flip_weight, low=0)
        check_int("--bridge-rank", self.bridge_rank, low=0, high=256)
        if self.bridge_rank and self.policy == "task":
            raise ValueError("--bridge-rank adds an entry bridge to a skip policy: the task model bypasses no layer")
        if self.kl_weight and self.policy == "task":
            raise ValueError("--kl adds KL to the task model: it applies to a skip policy, not to the task model itself")

    @property
    def speedup(self) -> float | None:
        return None if self.policy in ("task", "all") else float(self.policy)

    @property
    def name(self) -> str:
        base = "task" if self.policy == "task" else policy_name(self.speedup)
        distilled = f"-distil{self.synthetic_mrs or ''}" if self.targets == "task-model" else ""
        distilled += f"-invented{self.invented_places:g}" if self.invented_places else ""
        distilled += "-varied" if self.invented_places and self.invented_style == "varied" else ""
        if self.synthetic_attribute_share != SYNTHETIC_ATTRIBUTE_SHARE:
            distilled += f"-share{self.synthetic_attribute_share:g}"
        relexicalised = f"-relex{self.relexicalised}" if self.relexicalised else ""
        relexicalised += "-complete" if self.complete_references else ""
        weighted = (f"-kl{self.kl_weight:g}" if self.kl_weight else "") + (f"-flip{self.flip_weight:g}" if self.flip_weight else "")
        weighted += f"-bridge{self.bridge_rank}" if self.bridge_rank else ""
        return base + weighted + distilled + relexicalised

    @property
    def folder(self) -> Path:
        return Path(self.output_dir or f"runs/{self.task}-{self.name}")


def train_config(run: TaskRun, data_file: Path) -> TrainConfig:
    """The TrainConfig of a task run (model/training.py does the training)."""
    settings = check_task(run.task)
    common: dict[str, Any] = dict(
        output_dir=str(run.folder), data=str(data_file), max_steps=run.steps, batch_size=run.batch_size,
        lora_rank=run.lora_rank or settings.lora_rank, lora_alpha=2 * (run.lora_rank or settings.lora_rank),
        save_every=run.save_every, eval_every=0, resume=run.resume, device=run.device,
        threads=run.threads, seed=run.seed, max_length=256, warmup_steps=20, init_adapter=run.init_adapter)
    if run.policy == "task":
        return TrainConfig(**common, learning_rate=run.learning_rate or 1e-3, fixed_speedup=1.0, gate_lora=False)
    task_dir = run.task_adapter or str(task_adapter_dir(run.task))
    schedule: dict[str, Any] = dict(
        fixed_decay="linear", fixed_decay_length=settings.decay_length, floor_share=settings.floor_share,
        decays=("linear",), kl_weight=run.kl_weight, flip_weight=run.flip_weight, task_adapter=task_dir, gate_lora=True,
        bridge_rank=run.bridge_rank)
    if run.policy == "all":
        return TrainConfig(**common, **schedule, learning_rate=run.learning_rate or 5e-4,
                           speedup_range=SHARED_SPEEDUP_RANGE)
    return TrainConfig(**common, **schedule, learning_rate=run.learning_rate or 5e-4, fixed_speedup=run.speedup)


def heldout_records(run: TaskRun, relexicalised: int = 0) -> list[E2ERecord]:
    """The first ``run.heldout_mrs`` held-out devset MRs, or (``relexicalised`` > 0) that many
    rewritten copies of each: pubs, restaurants and the other cuisines, the test set's values that
    the devset lacks, still never a test MR."""
    held = dev_split()[1][: run.heldout_mrs]
    return relexicalised_records(held, relexicalised, seed=HELDOUT_RELEX_SEED) if relexicalised else held


def _descriptions(run: TaskRun, config: TrainConfig, adapter: Path, mrs: list[str],
                  speedups: tuple[float, ...], delexicalised: bool = False) -> dict[float, list[str]]:
    """Greedy descriptions of ``mrs`` at each speedup, float32: the run's adapter as the task model
    itself, or as a policy on the task model it trained on."""
    task_model_run = run.policy == "task"
    loaded = load_model(None, device=run.device, dtype="float32", quantize="none",
                        adapter=None if task_model_run else str(adapter),
                        task_adapter=str(adapter) if task_model_run else config.task_adapter)
    generator = TextGenerator(loaded)
    max_new_tokens, batch = check_task(run.task).max_new_tokens, batch_for(loaded.device, HELDOUT_BATCH)
    known = training_places() if delexicalised else None
    return {speedup: describe(generator, mrs, task_schedule(run.task, speedup, generator.num_layers), max_new_tokens,
                              batch, known).outputs for speedup in speedups}


def heldout_bleu(run: TaskRun, config: TrainConfig, adapter: Path, speedups: tuple[float, ...],
                 held: list[E2ERecord] | None = None) -> dict:
    """BLEU on the held-out devset MRs at each speedup (the task model: at 1x), float32: the run's
    adapter as the task model itself, or as a policy on the task model it trained on. Where 1x is
    among ``speedups``, each other speedup also says how close it stays to the task model's own
    descriptions: BLEU with those as the one reference, and the share of MRs described identically."""
    held = heldout_records(run) if held is None else held
    outputs = _descriptions(run, config, adapter, [r.mr for r in held], speedups)
    scores = {f"{speedup:g}x": task_scores(outputs[speedup], held) for speedup in speedups}
    if 1.0 in outputs:
        for speedup in (s for s in speedups if s != 1.0):
            scores[f"{speedup:g}x"]["vs_task_model"] = closeness(outputs[speedup], outputs[1.0])
    return scores


def long_mr_fidelity(run: TaskRun, config: TrainConfig, adapter: Path, speedup: float, count: int,
                     invented_places: bool = False, delexicalised: bool = False) -> dict:
    """A policy on ``count`` new MRs that name all eight attributes (long_heldout_mrs), with the
    devset's places or places no training data names, judged against the task model's own
    descriptions, since they have no references: the share of descriptions that name the MR's
    near place word for word (a place new to the policy must be copied from the prompt), and
    BLEU / identical share against the task model's text."""
    places = INVENTED_PLACES_HELDOUT if invented_places else ()
    mrs = long_heldout_mrs(dev_split()[0], count, seed=HELDOUT_LONG_SEED, trained_seed=run.seed, places=places)
    outputs = _descriptions(run, config, adapter, mrs, (1.0, speedup), delexicalised)
    return {"1x": {"near_named": near_named_share(mrs, outputs[1.0])},
            f"{speedup:g}x": {"near_named": near_named_share(mrs, outputs[speedup]),
                              "vs_task_model": closeness(outputs[speedup], outputs[1.0])}}


def sparse_mr_made_up(run: TaskRun, config: TrainConfig, adapter: Path, speedup: float, count: int) -> dict:
    """A policy on ``count`` new MRs with few facts (each optional attribute present with
    probability 0.5; heldout_new_mrs), where a description must stop early: the share of
    descriptions that mention a kind of fact the MR does not give (added_attributes), at 1x and at
    ``speedup``; ``beyond_task_model``, the share where the policy makes up a kind of fact that the
    task model's own description of the MR does not (a policy at its floor that runs past the task
    model's stop appends one; the task model itself calls a place with no eatType "a restaurant");
    and how close the policy stays to the task model's own text."""
    mrs = heldout_new_mrs(dev_split()[0], count, seed=HELDOUT_SPARSE_SEED, attribute_share=SPARSE_ATTRIBUTE_SHARE,
                          trained_seed=run.seed, trained_shares=(SYNTHETIC_ATTRIBUTE_SHARE, SPARSE_ATTRIBUTE_SHARE))
    outputs = _descriptions(run, config, adapter, mrs, (1.0, speedup))
    return {"1x": {"made_up": made_up_share(mrs, outputs[1.0])},
            f"{speedup:g}x": {"made_up": made_up_share(mrs, outputs[speedup]),
                              "beyond_task_model": made_up_beyond_share(mrs, outputs[speedup], outputs[1.0]),
                              "vs_task_model": closeness(outputs[speedup], outputs[1.0])}}


def training_file(run: TaskRun) -> Path:
    """The run's training JSONL (per run: parallel runs never share one): the references, or the
    task model's descriptions of the training MRs and the run's synthetic ones."""
    if run.targets == "references":
        return write_training_file(run.folder / "train.jsonl", relexicalised=run.relexicalised, seed=run.seed,
                                   complete_only=run.complete_references)
    task_dir = Path(run.task_adapter or task_adapter_dir(run.task)).resolve()
    source = DistillSource(task_adapter=str(task_dir), training_mrs=len(dev_split()[0]), synthetic_mrs=run.synthetic_mrs,
                           seed=run.seed, device=resolve_device(run.device).type, task_weights=adapter_fingerprint(task_dir),
                           invented_places=run.invented_places, invented_style=run.invented_style,
                           attribute_share=run.synthetic_attribute_share)
    if run.targets_file:
        return adopt_distillation_file(Path(run.targets_file), run.folder / "distilled.jsonl", source)
    return write_distillation_file(run.folder / "distilled.jsonl", source, run.task)


def train_task(run: TaskRun) -> dict:
    """Train, score on the held-out MRs, export if asked; returns (and writes) the run's summary."""
    run.folder.mkdir(parents=True, exist_ok=True)
    if run.threads:  # before the data: a distillation pass runs the task model ahead of train()
        torch.set_num_threads(run.threads)
    data_file = training_file(run)
    config = train_config(run, data_file)
    result: TrainResult = train(config)
    adapter = run.folder / "adapter"
    speedups = (1.0,) if run.policy == "task" else ((run.speedup,) if run.speedup else (2.0, 3.0, 5.0))
    summary = {"run": asdict(run), "steps": result.steps, "seconds": round(result.seconds, 1),
               "final_loss": round(sum(result.losses[-20:]) / max(1, len(result.losses[-20:])), 4) if result.losses else None,
               "heldout": heldout_bleu(run, config, adapter, speedups) if run.heldout_mrs else {}}
    if run.heldout_mrs and run.relexicalised:  # what the copies are for: the values the devset lacks
        summary["heldout_relexicalised"] = heldout_bleu(run, config, adapter, speedups, heldout_records(run, HELDOUT_RELEX_COPIES))
    (run.folder / "summary.json").write_text(json.dumps(summary, indent=2))
    if run.export:
        export_adapter(adapter, run.export)
        summary["exported"] = run.export
    return summary
