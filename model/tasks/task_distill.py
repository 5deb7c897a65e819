"""Sequence-level distillation targets for a task's skip policy: the task model's own greedy
descriptions, in place of the human references, as the text the policy learns to write.

Why: a policy is judged by how much of the task model's quality it keeps, and greedy decoding
keeps the task model's single most likely wording, while the references spread over several
wordings per MR (8.6 on average in E2E's devset). Learning that one wording is an easier job for
a few layers than learning the references' spread, and it can cover MRs that have no references
(model/tasks/e2e.py: synthetic_mrs). One greedy pass of the task model per MR, written once and
reused by ``--resume``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Sequence

from model.generation.generator import TextGenerator
from model.loading import load_model
from model.lowbit.weight_cache import file_key
from model.tasks.e2e import (
    INSTRUCTION,
    INVENTED_PLACES_TRAINING,
    SYNTHETIC_ATTRIBUTE_SHARE,
    E2ERecord,
    assert_no_test_mr,
    dev_split,
    place_records,
    real_places,
    synthetic_mrs,
    task_prompt,
    varied_places,
)
from model.tasks.task_eval import batch_for, describe
from model.tasks.task_models import check_task, task_schedule

DISTILL_BATCH = 32


@dataclass(frozen=True)
class DistillSource:
    """What a distillation file was made from: a file made from anything else is made again."""

    task_adapter: str
    training_mrs: int
    synthetic_mrs: int
    seed: int
    device: str
    task_weights: str = ""  # adapter_fingerprint(task_adapter): a task model retrained at the same path is another source
    invented_places: float = 0.0  # the share of the synthetic MRs about invented places (INVENTED_PLACES_TRAINING)
    invented_style: str = "fixed"  # "varied": a fresh name of any shape for nearly every MR (varied_places)
    attribute_share: float = SYNTHETIC_ATTRIBUTE_SHARE  # each optional attribute's chance in a synthetic MR


def adapter_fingerprint(folder: str | Path) -> str:
    """A short hash of an adapter folder's weight files (their content keys, model/lowbit/weight_cache.py
    file_key): two folders with the same weights match, whatever their json files say."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.safetensors")):
        digest.update(path.name.encode())
        digest.update(file_key(path).encode())
    return digest.hexdigest()[:16]


def distillation_mrs(train: Sequence[E2ERecord], synthetic: int, seed: int, invented_share: float = 0.0,
                     invented_style: str = "fixed", attribute_share: float = SYNTHETIC_ATTRIBUTE_SHARE) -> list[str]:
    """The MRs whose task-model descriptions become targets: the training MRs, then ``synthetic`` new
    ones, ``invented_share`` of them about invented places (a policy that only ever sees the devset's
    30 places learns them instead of copying a new one from the prompt, which the test set asks for):
    the 256 fixed names, or ("varied") names drawn from twice as many fresh ones of varied shapes as
    there are such MRs, so that a name comes up about once and none can be learned by heart. Each
    optional attribute is in a synthetic MR with probability ``attribute_share``."""
    invented = round(synthetic * invented_share)
    mrs = [r.mr for r in train] + (synthetic_mrs(train, synthetic - invented, seed, attribute_share)
                                   if synthetic > invented else [])
    if invented:
        places = (INVENTED_PLACES_TRAINING if invented_style == "fixed"
                  else varied_places(2 * invented, seed, avoid=real_places()))
        mrs += synthetic_mrs(place_records(places), invented, seed, attribute_share)
    assert_no_test_mr(mrs)
    return mrs


def task_model_rows(task: str, task_adapter: str, mrs: Sequence[str], device: str = "cpu",
                    model: str | None = None, batch_size: int | None = None) -> list[dict]:
    """prompt/completion records: the task model's greedy description of each MR (float32, full
    depth, the task's output budget). Empty descriptions are left out: they teach nothing."""
    settings = check_task(task)
    loaded = load_model(model, device=device, dtype="float32", quantize="none", adapter=None, task_adapter=task_adapter)
    generator = TextGenerator(loaded)
    full = task_schedule(task, 1.0, generator.num_layers, full=True)
    batch = batch_size or batch_for(loaded.device, DISTILL_BATCH)
    outputs = describe(generator, mrs, full, settings.max_new_tokens, batch).outputs
    return [{"prompt": task_prompt(mr), "completion": text} for mr, text in zip(mrs, outputs) if text]


def _recorded_source(record: Path) -> dict:
    """A distillation file's recorded source; a field added since it was written reads as its default."""
    defaults = {spec.name: spec.default for spec in fields(DistillSource) if spec.default is not MISSING}
    return {**defaults, **json.loads(record.read_text())}


PORTABLE_FIELDS = ("task_adapter", "device")  # where a pass ran: the same weights give the same targets anywhere


def adopt_distillation_file(made: Path, path: Path, source: DistillSource) -> Path:
    """A distillation file made elsewhere (a GPU's pass, another run's folder), copied to ``path``
    with its record when it was made from ``source``: the same task weights, MRs and seed; only
    where it ran (device, the adapter's path on that machine) may differ. Anything else is refused,
    since the policy would learn another task model's text."""
    made = Path(made)
    record = made.with_suffix(".source.json")
    if not made.is_file() or not record.is_file():
        raise ValueError(f"--targets-file {made}: needs the file and its {record.name} beside it")
    recorded, wanted = _recorded_source(record), asdict(source)
    differ = sorted(k for k in wanted if k not in PORTABLE_FIELDS and recorded.get(k) != wanted[k])
    if differ:
        raise ValueError(f"--targets-file {made} was made from another source ({', '.join(differ)} differ): "
                         "leave it out to make the targets for this run")
    text = made.read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert_no_test_mr([row["prompt"].removeprefix(INSTRUCTION) for row in rows])
    path = Path(path)
    if path.resolve() != made.resolve():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        path.with_suffix(".source.json").write_text(record.read_text())
    return path


def write_distillation_file(path: Path, source: DistillSource, task: str = "e2e", model: str | None = None) -> Path:
    """The task model's descriptions as a JSONL training file at ``path``, with ``path``.source.json
    beside it; a file already made from the same source is reused (a resumed run, a second policy)."""
    path = Path(path)
    record = path.with_suffix(".source.json")
    if path.is_file() and record.is_file() and _recorded_source(record) == asdict(source):
        return path
    train, _ = dev_split()
    mrs = distillation_mrs(train[: source.training_mrs], source.synthetic_mrs, source.seed, source.invented_places,
                           source.invented_style, source.attribute_share)
    rows = task_model_rows(task, source.task_adapter, mrs, device=source.device, model=model)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    record.write_text(json.dumps(asdict(source), indent=2))
    return path
