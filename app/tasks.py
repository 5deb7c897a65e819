"""The paper's tasks in the playground (E2E restaurant descriptions, Reddit TL;DR summaries): what the
page says about a task, and the task's models, loaded when first asked for and kept in a small cache.

The library owns everything a task is (model/tasks: the MR format, a post's parts, the task model, its
skip policies and the schedule they were trained on); this module only picks and caches them. E2E's task
model is a fine-tune; TL;DR's is the default model itself, prompted (model/tasks/tldr.py), so at a speedup
without a shipped TL;DR policy both panes run the general model already loaded, with its skip policy.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Callable

from app.serving.loaded_generators import LoadedGenerators
from model.generation.generator import TextGenerator
from model.loading import DEFAULT_MODEL, LoadedModel, load_model, with_cuda_graphs
from model.tasks import task_models, tldr
from model.tasks.e2e import ATTRIBUTES, compose_mr, example_mrs, parse_mr
from model.tasks.tldr_training import shipped_policy

CHAT = "chat"  # the general chat model and its skip policy: no task
TLDR = tldr.TASK
TASK_LABELS = {CHAT: "General chat", "e2e": "E2E restaurant descriptions (the paper's task)",
               TLDR: "Reddit TL;DR summaries (the paper's second task)"}
TASK_NAMES = {"e2e": "E2E", TLDR: "TL;DR"}  # how the page's lines name a task
# The controls a task fixes (the schedule and sampling its skip policies were trained on, as
# `generate --task` does): hidden while a task is chosen, so no control shows a value that is not used.
TASK_FIXED = ("decay", "warmup", "decay_length", "min_layers", "max_layers", "order", "prompt_at_full_depth",
              "temperature", "top_p")
# ... except the prompt's depth for TL;DR: its prompt is most of the request, and its evaluation runs
# both depths (model/tasks/tldr_eval.py), so the visitor keeps that control (and a lesson uses it).
KEPT_BY_TASK = {TLDR: ("prompt_at_full_depth",)}
CHAT_MAX_NEW_TOKENS = 48  # the schema's default: what switching back to chat restores
# A valid input of each task, for the checks that do not read the visitor's (choosing a task loads its model).
STAND_IN_INPUT = {CHAT: "x", "e2e": "name[x]", TLDR: "x\n\nx"}

log = logging.getLogger(__name__)
# (task, policy folder or None) -> a generator; a loader gets the task and the policy folder
Loader = Callable[[str, Path | None], LoadedModel]


def task_choices() -> list[tuple[str, str]]:
    """(label, value) pairs for the task radio."""
    return [(label, value) for value, label in TASK_LABELS.items()]


def is_task(task: str) -> bool:
    return task != CHAT


def task_name(task: str) -> str:
    """'E2E', 'TL;DR': a task as the page's lines name it."""
    return TASK_NAMES.get(task, task.upper())


def fixed_controls(task: str) -> tuple[str, ...]:
    """The controls ``task`` fixes (hidden while it is chosen); none in chat."""
    kept = KEPT_BY_TASK.get(task, ())
    return tuple(name for name in TASK_FIXED if name not in kept) if is_task(task) else ()


def task_budget(task: str) -> int:
    """The task's output budget (max new tokens), chat's default in chat."""
    if task == TLDR:
        return tldr.MAX_NEW_TOKENS
    return task_models.check_task(task).max_new_tokens if is_task(task) else CHAT_MAX_NEW_TOKENS


def fixed_note(task: str) -> str:
    """One line on why the schedule controls are gone while a task is chosen."""
    if not is_task(task):
        return ""
    if task == TLDR:
        others = "".join(f"; {speedup:g}x: {shape_words(shape)}, as its policy was trained"
                         for speedup, shape in tldr_shapes().items() if shape != tldr.LINEAR)
        return (f"The TL;DR task fixes the schedule its skip policies train on ({shape_words(tldr.LINEAR)}{others}"
                f"{';' if others else ','} greedy decoding), so decay, warmup, decay length, min/max layers, layer order and sampling are hidden. "
                "The prompt's depth stays yours (Advanced: Prompt at full depth): a post is most of a TL;DR request.")
    settings = task_models.check_task(task)
    return (f"The {task_name(task)} task fixes the schedule its skip policies were trained on (linear decay over "
            f"{settings.decay_length} tokens, a floor at {settings.floor_share:.0%} of the average depth, greedy "
            "decoding), so decay, warmup, decay length, min/max layers, layer order and sampling are hidden.")


def tldr_shape(speedup: float) -> tldr.TaskShape:
    """The schedule's shape at ``speedup``: the one its shipped TL;DR policy was trained in (linear without one)."""
    return tldr.shape_of(shipped_policy(speedup))


def tldr_shapes() -> dict[float, tldr.TaskShape]:
    """The shape of each speedup a TL;DR policy is shipped for."""
    return {speedup: tldr_shape(speedup) for speedup in tldr.SPEEDUPS if shipped_policy(speedup) is not None}


def shape_words(shape: tldr.TaskShape) -> str:
    if shape.decay == "step":
        return (f"its first {shape.decay_length // 2} tokens deep, then a step down, a floor at {shape.floor_share:.0%} "
                "of the average depth")
    return (f"{shape.decay} decay over {shape.decay_length} tokens, a floor at {shape.floor_share:.0%} of the average "
            "depth")


def mr_problem(error: ValueError) -> str:
    """parse_mr's message named as the MR's problem, as plain text: each place that shows it
    escapes it for its own context (the toast's HTML: handlers.page_error; a Markdown line:
    shown_text.as_markdown; an API client reads it as it is)."""
    return "The MR has a problem: " + str(error)


def post_problem(error: ValueError) -> str:
    """parse_post's message named as the post's problem, as plain text (escaped where it is shown)."""
    return "The post has a problem: " + str(error)


def input_problem(task: str, prompt: str) -> str | None:
    """What is wrong with ``prompt`` as the task's input (E2E: an MR; TL;DR: a post with its title), as
    plain text; None when it is one (chat takes any prompt)."""
    try:
        if task == TLDR:
            tldr.parse_post(prompt)
        elif is_task(task):
            parse_mr(prompt)
    except ValueError as error:
        return post_problem(error) if task == TLDR else mr_problem(error)
    return None


def check_input(task: str, prompt: str) -> None:
    """A ValueError naming what is wrong with ``prompt`` as the task's input (``input_problem``)."""
    problem = input_problem(task, prompt)
    if problem is not None:
        raise ValueError(problem)


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


@lru_cache(maxsize=1)
def post_examples() -> tuple[tldr.TldrPost, ...]:
    """Test-set posts for TL;DR's examples (and the extra rows of a batch); none without the data."""
    try:
        return tuple(tldr.example_posts())
    except (OSError, ValueError):
        return ()


def example_inputs(task: str) -> tuple[str, ...]:
    """What a task's example fills the prompt box with: E2E's MRs, TL;DR's posts (title, then the post)."""
    if task == TLDR:
        return tuple(tldr.post_text(post) for post in post_examples())
    return examples() if is_task(task) else ()


def is_valid_post(text: str) -> bool:
    return input_problem(TLDR, text) is None


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
    if task == TLDR:
        return tldr_policy_line(speedup, folder)
    if speedup <= 1:
        return f"{task.upper()} task at 1x: both panes are the task model at full depth."
    policy = f"its skip policy {folder.name}" if folder is not None else "no skip policy (none is trained for it)"
    line = f"{task.upper()} task: the full pane is the task model; SkipDecode runs it at {speedup:g}x with {policy}."
    caution = wrong_fact_dip(task, speedup, folder, facts_file)
    return f"{line} {caution}" if caution else line


def tldr_policy_line(speedup: float, folder: Path | None) -> str:
    """TL;DR's status line: the default model prompted in both panes, and the skip policy SkipDecode runs."""
    model = "the default model prompted for a TL;DR (the paper fine-tuned one)"
    if speedup <= 1:
        return f"TL;DR task at 1x: both panes are {model}, at full depth."
    policy = (f"its TL;DR skip policy {folder.name}" if folder is not None
              else f"the general skip policy (no TL;DR policy is shipped for {speedup:g}x yet)")
    return f"TL;DR task: both panes run {model}; SkipDecode runs it at {speedup:g}x with {policy}."


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

    def policy(self, task: str, speedup: float, general: TextGenerator | None = None) -> Path | None:
        """The policy SkipDecode runs at ``speedup`` (none at 1x: both panes are the task model). TL;DR:
        its shipped policy for ``speedup`` (tldr_training.shipped_policy) where there is one and the
        ``general`` model is the default one it was trained on; None: the general model's own policy."""
        if speedup <= 1:
            return None
        if task == TLDR:
            own = shipped_policy(speedup, self.assets())
            default = general is None or self.loader is not None or general.loaded.name == DEFAULT_MODEL
            return own if default else None
        return task_models.policy_for(task, speedup, self.assets())

    def get(self, task: str, speedup: float, load: bool = True,
            general: TextGenerator | None = None) -> TextGenerator | None:
        """The generator for ``task`` at ``speedup``; None if it is not loaded and ``load`` is False.
        A missing task model is a ValueError that says so (the page shows it, the server stays up).
        TL;DR without a policy of its own is the ``general`` generator itself: no second copy of the model."""
        if task == TLDR:
            return self._tldr(speedup, load, general)
        task_models.check_task(task)
        policy = self.policy(task, speedup)
        key: tuple[str, str] = (task, str(policy))
        if speedup <= 1:  # any policy of the task is the task model at full depth (gated LoRA)
            newest = self.loaded.newest(lambda k: k[0] == task)
            key = newest[0] if newest is not None else key
        if not load:
            return self.loaded.get(key)
        return self.loaded.get_or_load(key, lambda: TextGenerator(self._load(task, policy)))

    def _tldr(self, speedup: float, load: bool, general: TextGenerator | None) -> TextGenerator | None:
        """TL;DR's generator: the default model with its TL;DR policy for ``speedup`` (loaded once, kept
        like a task's), or, where none is shipped, ``general`` as it is (its skip policy, the general one)."""
        if general is None:
            raise ValueError("the TL;DR task runs the general model: it must be given")
        policy = self.policy(TLDR, speedup, general)
        if policy is None:
            return general
        key = (TLDR, str(policy))
        if not load:
            return self.loaded.get(key)
        return self.loaded.get_or_load(key, lambda: TextGenerator(self._load(TLDR, policy)))

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
        if task not in task_models.TASKS or general.loaded.name != DEFAULT_MODEL:  # a fine-tuned task's models
            return False
        return self.loader is not None or (task_models.task_adapter_dir(task, self.assets()) / "adapter_config.json").is_file()

    def trained_for(self, task: str, speedup: float) -> bool:
        """Whether ``task`` has a skip policy trained for ``speedup`` (the page shows its presets):
        E2E's are shipped for each of POLICY_SPEEDUPS; TL;DR's where tldr_training.shipped_policy finds one."""
        if task == TLDR:
            return shipped_policy(speedup, self.assets()) is not None
        return is_task(task)

    def any(self, task: str) -> TextGenerator | None:
        """Some loaded generator of ``task`` (the schedule preview needs its layers, not its policy)."""
        newest = self.loaded.newest(lambda key: key[0] == task)
        return newest[1] if newest is not None else None

    def _load(self, task: str, policy: Path | None) -> LoadedModel:
        try:
            if self.loader is not None:
                return self.loader(task, policy)
            if task == TLDR:  # the default model itself, with the TL;DR policy (no task adapter)
                return with_cuda_graphs(load_model(None, adapter=str(policy), device=self.device, quantize=self.quantize))
            return with_cuda_graphs(task_models.load_task_model(task, policy=policy, device=self.device,
                                                                quantize=self.quantize, root=self.assets()))
        except (OSError, ValueError) as error:
            log.warning("task %s: cannot load its models: %s", task, error)
            if task == TLDR:
                raise ValueError(f"the TL;DR skip policy in {policy} could not be loaded on this server") from None
            raise ValueError(f"the {task.upper()} task is not available on this server yet: its trained models "
                             "are not installed") from None
