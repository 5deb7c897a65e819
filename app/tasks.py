"""The paper's tasks in the playground (E2E restaurant descriptions): what the page says about a
task, and the task's models, loaded when first asked for and kept in a small cache.

The library owns everything a task is (model/tasks: the MR format, the task model, its skip
policies and the schedule they were trained on); this module only picks and caches them.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Callable

from app.serving.loaded_generators import LoadedGenerators
from model.generation.generator import TextGenerator
from model.loading import DEFAULT_MODEL, LoadedModel, with_cuda_graphs
from model.tasks import task_models
from model.tasks.e2e import ATTRIBUTES, compose_mr, example_mrs, parse_mr

CHAT = "chat"  # the general chat model and its skip policy: no task
TASK_LABELS = {CHAT: "General chat", "e2e": "E2E restaurant descriptions (the paper's task)"}
# The controls a task fixes (the schedule and sampling its skip policies were trained on, as
# `generate --task` does): hidden while a task is chosen, so no control shows a value that is not used.
TASK_FIXED = ("decay", "warmup", "decay_length", "min_layers", "max_layers", "order", "prompt_at_full_depth",
              "temperature", "top_p")
CHAT_MAX_NEW_TOKENS = 48  # the schema's default: what switching back to chat restores

log = logging.getLogger(__name__)
# (task, policy folder or None) -> a generator; a loader gets the task and the policy folder
Loader = Callable[[str, Path | None], LoadedModel]


def task_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for the task radio."""
    return [(label, value) for value, label in TASK_LABELS.items()]


def is_task(task: str) -> bool:
    return task != CHAT


def fixed_note(task: str) -> str:
    """One line on why the schedule controls are gone while a task is chosen."""
    if not is_task(task):
        return ""
    settings = task_models.check_task(task)
    return (f"The {task.upper()} task fixes the schedule its skip policies were trained on (linear decay over "
            f"{settings.decay_length} tokens, a floor at {settings.floor_share:.0%} of the average depth, greedy "
            "decoding), so decay, warmup, decay length, min/max layers, layer order and sampling are hidden.")


def mr_problem(error: ValueError) -> str:
    """parse_mr's message named as the MR's problem, as plain text: each place that shows it
    escapes it for its own context (the toast's HTML: handlers.page_error; a Markdown line:
    shown_text.as_markdown; an API client reads it as it is)."""
    return "The MR has a problem: " + str(error)


def check_mr(task: str, prompt: str) -> None:
    """A ValueError naming what is wrong with ``prompt`` as the task's input (E2E: an MR)."""
    if is_task(task):
        try:
            parse_mr(prompt)
        except ValueError as error:
            raise ValueError(mr_problem(error)) from None


def is_valid_mr(text: str) -> bool:
    try:
        parse_mr(text)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=1)
def examples() -> tuple[str, ...]:
    """Test-set MRs for the examples (and the extra rows of a batch); none without the data."""
    try:
        return tuple(example_mrs())
    except (OSError, ValueError):
        return ()


def compose(values: dict[str, str | None]) -> tuple[str | None, str]:
    """(MR, "") from the form's fields in ATTRIBUTES order, or (None, the problem as text)."""
    try:
        return compose_mr({key: values.get(key) for key in ATTRIBUTES}), ""
    except ValueError as error:
        return None, mr_problem(error)


# The test set's facts per arm (scripts/e2e_facts_table.py --write), from the report whose runs swap new
# places as the playground does ("e2e-delexicalised"): {report: {arm label: {"wrong": share, ...}}}.
FACTS_FILE = Path(__file__).resolve().parents[1] / "assets" / "eval" / "e2e-facts.json"
PLAYGROUND_REPORT = "e2e-delexicalised"
# A policy whose wrong-fact share is over this many times both its neighbours' (the speedups evaluated
# just below and just above it) is worse for its own training: skipping more did better.
DIP = 2.0


def policy_line(task: str, speedup: float, folder: Path | None, facts_file: Path = FACTS_FILE) -> str:
    """Which model each pane runs, for the status line; and, where this speedup's policy states wrong
    facts far more often than its neighbours', one sentence saying so and why."""
    if speedup <= 1:
        return f"{task.upper()} task at 1x: both panes are the task model at full depth."
    policy = f"its skip policy {folder.name}" if folder is not None else "no skip policy (none is trained for it)"
    line = f"{task.upper()} task: the full pane is the task model; SkipDecode runs it at {speedup:g}x with {policy}."
    caution = wrong_fact_dip(task, speedup, folder, facts_file)
    return f"{line} {caution}" if caution else line


def wrong_fact_dip(task: str, speedup: float, folder: Path | None, facts_file: Path = FACTS_FILE) -> str:
    """'At 4x this policy states a wrong fact in 27.8% of the E2E test set's descriptions, against 3.2%
    at 3x and 6.8% at 5x: ...' where the policy at ``speedup`` states wrong facts over DIP times as
    often as at both neighbouring speedups; "" otherwise, or without the figures. docs/RESULTS.md names
    no cause beyond the training run, and the same method skipping more layers did better, so the
    sentence puts it on the training. Only the policy SkipDecode runs here is named (``folder``)."""
    if folder is None or task != "e2e":
        return ""
    kind = "shared policy" if folder.name == task_models.SHARED_POLICY else "per-speedup policy"
    shares = wrong_fact_shares(str(facts_file), kind)
    if speedup not in shares:
        return ""
    lower = max((s for s in shares if 1 < s < speedup), default=None)
    higher = min((s for s in shares if s > speedup), default=None)
    if lower is None or higher is None or shares[speedup] <= DIP * max(shares[lower], shares[higher]):
        return ""
    return (f"At {speedup:g}x this policy states a wrong fact in {shares[speedup]:.1%} of the E2E test set's "
            f"descriptions, against {shares[lower]:.1%} at {lower:g}x and {shares[higher]:.1%} at {higher:g}x: that "
            f"is this policy's training, not the method; this policy's training landed worse, {higher:g}x's "
            f"(skipping more layers) did not.")


@lru_cache(maxsize=4)
def wrong_fact_shares(facts_file: str, kind: str) -> dict[float, float]:
    """{speedup: share of the test set's descriptions with a wrong fact} for the ``kind`` of policy
    ("per-speedup policy 4x" -> 4.0), from the playground's report in ``facts_file``; {} without it."""
    try:
        arms = json.loads(Path(facts_file).read_text()).get(PLAYGROUND_REPORT)
    except (OSError, ValueError, AttributeError):
        return {}
    prefix, shares = kind + " ", {}
    for label, facts in (arms.items() if isinstance(arms, dict) else ()):
        if not label.startswith(prefix):
            continue
        try:
            shares[float(label.removeprefix(prefix).removesuffix("x"))] = float(facts["wrong"])
        except (KeyError, TypeError, ValueError):  # another arm's label, or a row without the share
            continue
    return shares


class TaskGenerators:
    """A task's generators, one per skip policy, loaded on first use and kept (``size`` at most,
    least recently used dropped): switching between two speedups does not reload each time.

    ``root`` None reads model.tasks.task_models.task_assets() when a model loads
    ($SKIPDECODE_TASK_ADAPTERS, else the shipped ones). ``loader`` replaces load_task_model (tests load tiny models)."""

    def __init__(self, root: Path | None = None, loader: Loader | None = None, size: int = 2,
                 device: str = "auto", quantize: str = "auto", tokenizer: Callable[[], object] | None = None) -> None:
        self.root, self.loader = root, loader
        self.device, self.quantize = device, quantize
        # The task models' tokenizer, without a model (the default model's: every task model is
        # fine-tuned from it, the tests' tiny ones included): admission sizes a job with it.
        self.tokenizer = tokenizer or task_models.task_tokenizer
        self.shared: dict[int, bool] = {}  # id(a general generator) -> it tokenizes as the task models do
        self.loaded = LoadedGenerators(size)  # by (task, policy folder)

    def assets(self) -> Path:
        return Path(self.root) if self.root is not None else task_models.task_assets()

    def policy(self, task: str, speedup: float) -> Path | None:
        """The policy SkipDecode runs at ``speedup`` (none at 1x: both panes are the task model)."""
        return task_models.policy_for(task, speedup, self.assets()) if speedup > 1 else None

    def get(self, task: str, speedup: float, load: bool = True) -> TextGenerator | None:
        """The generator for ``task`` at ``speedup``; None if it is not loaded and ``load`` is False.
        A missing task model is a ValueError that says so (the page shows it, the server stays up)."""
        task_models.check_task(task)
        policy = self.policy(task, speedup)
        key: tuple[str, str] = (task, str(policy))
        if speedup <= 1:  # any policy of the task is the task model at full depth (gated LoRA)
            newest = self.loaded.newest(lambda k: k[0] == task)
            key = newest[0] if newest is not None else key
        if not load:
            return self.loaded.get(key)
        return self.loaded.get_or_load(key, lambda: TextGenerator(self._load(task, policy)))

    def sizer(self, task: str, general: TextGenerator) -> TextGenerator | None:
        """A loaded model that tokenizes ``task``'s prompts as its model does, so a job's size and
        cost are known before its own policy loads: a loaded generator of the task (any speedup), else
        ``general`` when it shares the task models' tokenizer; None when neither can say."""
        loaded = self.any(task)
        if loaded is not None:
            return loaded
        key = id(general)
        if key not in self.shared and self.loader is None and general.loaded.name == DEFAULT_MODEL:
            self.shared[key] = True  # the task models' own base (load_task_model): nothing to compare
        if key not in self.shared:
            try:
                self.shared[key] = general.text.shares_tokenizer(self.tokenizer())
            except (OSError, ValueError) as error:  # no default model folder: the job is sized when it loads
                log.warning("task %s: cannot read its tokenizer: %s", task, error)
                self.shared[key] = False
        return general if self.shared[key] else None

    def can_land(self, task: str, general: TextGenerator) -> bool:
        """Whether a bare visit may land on ``task``: its models are there (or a loader stands in for
        them) and the general model is their base, so a deployer's own model is what its page shows."""
        if not is_task(task) or general.loaded.name != DEFAULT_MODEL:
            return False
        return self.loader is not None or (task_models.task_adapter_dir(task, self.assets()) / "adapter_config.json").is_file()

    def any(self, task: str) -> TextGenerator | None:
        """Some loaded generator of ``task`` (the schedule preview needs its layers, not its policy)."""
        newest = self.loaded.newest(lambda key: key[0] == task)
        return newest[1] if newest is not None else None

    def _load(self, task: str, policy: Path | None) -> LoadedModel:
        try:
            if self.loader is not None:
                return self.loader(task, policy)
            return with_cuda_graphs(task_models.load_task_model(task, policy=policy, device=self.device,
                                                                quantize=self.quantize, root=self.assets()))
        except (OSError, ValueError) as error:
            log.warning("task %s: cannot load its models: %s", task, error)
            raise ValueError(f"the {task.upper()} task is not available on this server yet: its trained models "
                             "are not installed") from None
