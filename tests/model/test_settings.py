"""The environment settings (model/common/settings.py): every variable read and checked, read once per
process, replaced only on purpose, with today's defaults, and documented everywhere they are listed."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

import model.common.settings as settings_module
from model.common.settings import (
    LANDINGS,
    QUANTIZE_CHOICES,
    Settings,
    changed_settings,
    settings,
    settings_table,
    use_settings,
)
from tests.support import ROOT

# Every variable with a value other than its default, and what it reads as.
EVERY_VARIABLE = {
    "SKIPDECODE_MODEL": ("facebook/opt-125m", "facebook/opt-125m"),
    "SKIPDECODE_ADAPTER": ("none", "none"),
    "SKIPDECODE_QUANTIZE": ("INT8", "int8"),
    "SKIPDECODE_TASK_ADAPTERS": ("/srv/adapters", Path("/srv/adapters")),
    "SKIPDECODE_LANDING": (" Chat ", "chat"),
    "SKIPDECODE_MAX_NEW_TOKENS": ("64", 64),
    "SKIPDECODE_MAX_BATCH": ("2", 2),
    "SKIPDECODE_MAX_PROMPT_CHARS": ("1000", 1000),
    "SKIPDECODE_MAX_PROMPT_TOKENS": ("512", 512),
    "SKIPDECODE_MAX_REQUEST_TOKENS": ("4096", 4096),
    "SKIPDECODE_MAX_JOB_COST": ("4000", 4000),
    "SKIPDECODE_STEP_POSITIONS": ("1024", 1024),
    "SKIPDECODE_STEP_MB": ("64", 64),
    "SKIPDECODE_STEP_PER_ADDRESS": ("1", 1),
    "SKIPDECODE_CONCURRENCY": ("2", 2),
    "SKIPDECODE_QUEUE_SIZE": ("64", 64),
    "SKIPDECODE_MAX_QUEUED_PER_SESSION": ("3", 3),
    "SKIPDECODE_MAX_QUEUED_API_PER_ADDRESS": ("5", 5),
    "SKIPDECODE_MAX_QUEUED_PER_ADDRESS": ("16", 16),
    "SKIPDECODE_PLACES_PER_ADDRESS": ("4", 4),
    "SKIPDECODE_STREAM_GRACE_S": ("2.5", 2.5),
    "SKIPDECODE_TRUST_FORWARDED_FOR": ("yes", True),
    "SKIPDECODE_BATCH_ROWS": ("1", 1),
    "SKIPDECODE_BATCH_COST": ("600", 600),
    "SKIPDECODE_PROMPT_PARTS": ("1", 1),
    "SKIPDECODE_REQUEST_READ_S": ("0.5", 0.5),
    "MALLOC_ARENA_MAX": ("4", 4),
    "GRADIO_SERVER_NAME": ("0.0.0.0", "0.0.0.0"),
    "GRADIO_SERVER_PORT": ("8080", 8080),
    "GRADIO_ANALYTICS_ENABLED": ("True", True),
    "SKIPDECODE_CACHE_DIR": ("/scratch/cache", Path("/scratch/cache")),
    "SKIPDECODE_CUDA_GRAPHS": ("0", False),
    "SKIPDECODE_COMPILE_LAYERS": ("no", False),
    "SKIPDECODE_INT8_BF16_ROWS": ("16", 16),
    "SKIPDECODE_NATIVE": ("off", False),
    "SKIPDECODE_INT4_KERNEL": ("Torch", "torch"),
    "SKIPDECODE_Q4_ISA": ("avx2", "avx2"),
    "SKIPDECODE_Q4_AMX_ROWS": ("0", 0),
    "SKIPDECODE_HUGE_PAGES": ("false", False),
    "SPACE_ID": ("someone/skipdecode", "someone/skipdecode"),
    "SPACES_ZERO_GPU": ("true", "true"),
}


def _variables() -> dict[str, str]:
    return {spec.metadata["variable"]: spec.name for spec in dataclasses.fields(Settings)}


def _app_entry():
    spec = importlib.util.spec_from_file_location("app_entry", ROOT / "app.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    return entry


def test_every_variable_is_read_from_the_environment():
    assert set(EVERY_VARIABLE) == set(_variables())  # a new setting gets a line here
    read = Settings.from_environment({variable: text for variable, (text, _) in EVERY_VARIABLE.items()})
    for variable, name in _variables().items():
        expected = EVERY_VARIABLE[variable][1]
        assert getattr(read, name) == expected, variable
        assert getattr(read, name) != getattr(Settings(), name), f"{variable}: the test's value is the default"


def test_a_missing_or_blank_variable_keeps_its_default():
    assert Settings.from_environment({}) == Settings()
    assert Settings.from_environment({variable: "  " for variable in _variables()}) == Settings()


@pytest.mark.parametrize(("variable", "text", "reason"), [
    ("SKIPDECODE_MAX_NEW_TOKENS", "lots", "must be a number"),
    ("SKIPDECODE_MAX_BATCH", "2.5", "must be a whole number"),
    ("SKIPDECODE_STREAM_GRACE_S", "soon", "must be a number"),
    ("SKIPDECODE_REQUEST_READ_S", "0", "must be >= 0.1"),
    ("SKIPDECODE_Q4_AMX_ROWS", "-1", "must be >= 0"),
    ("MALLOC_ARENA_MAX", "0", "must be >= 1"),
    ("SKIPDECODE_NATIVE", "maybe", "must be 1 or 0"),
    ("SKIPDECODE_TRUST_FORWARDED_FOR", "2", "must be 1 or 0"),
    ("SKIPDECODE_QUANTIZE", "int3", "must be one of auto, int4, int8, none"),
    ("SKIPDECODE_LANDING", "e2e", "must be one of auto, chat"),
    ("SKIPDECODE_Q4_ISA", "sse2", "must be one of auto, avx2, avx512-vnni"),
])
def test_a_bad_value_is_refused_naming_the_variable_and_the_value(variable, text, reason):
    with pytest.raises(ValueError) as refused:
        Settings.from_environment({variable: text})
    assert str(refused.value).startswith(f"{variable} {reason}") and repr(text.lower()) in str(refused.value).lower()


def test_the_environment_is_read_once_and_replaced_only_on_purpose(monkeypatch):
    monkeypatch.setattr(settings_module, "_installed", [])  # as in a new process: nothing read yet
    monkeypatch.setenv("SKIPDECODE_MAX_BATCH", "3")
    first = settings()
    assert first.max_batch == 3 and settings() is first
    monkeypatch.setenv("SKIPDECODE_MAX_BATCH", "5")  # too late: read at the first call
    assert settings() is first and settings().max_batch == 3
    with changed_settings(max_batch=6) as changed:
        assert settings() is changed and changed.max_batch == 6 and changed.max_new_tokens == first.max_new_tokens
        with use_settings(Settings()):
            assert settings().max_batch == 8
        assert settings() is changed
    assert settings() is first


def test_the_fixture_reads_the_variables_for_one_test(environment_settings):
    before = settings()
    assert environment_settings(SKIPDECODE_MAX_BATCH="4").max_batch == 4 and settings().max_batch == 4
    assert environment_settings(SKIPDECODE_MAX_BATCH="").max_batch == 8  # blank: unset
    assert settings() is not before  # the test's own until its end (the fixture puts `before` back)


def test_the_defaults_are_the_ones_the_serving_code_had():
    from app.serving.batcher import BatchLimits
    from app.serving.fair_queue import ServingLimits
    from app.serving.job_cost import DEFAULT_MAX_JOB_COST
    from app.serving.slow_clients import DEFAULT_REQUEST_READ_S
    from app.settings import Limits
    from app.ui import LANDINGS as PAGE_LANDINGS
    from model.lowbit.native_kernels import DEFAULT_AMX_ROWS
    from model.lowbit.quantization import QUANTIZE_MODES

    entry, defaults = _app_entry(), Settings()
    assert entry.limits_from(defaults) == Limits() and defaults.max_job_cost == DEFAULT_MAX_JOB_COST
    assert entry.serving_from(defaults) == ServingLimits(trust_forwarded_for=False)
    assert entry.batching_from(defaults, on_gpu=False) == BatchLimits(rows=32)
    assert entry.batching_from(defaults, on_gpu=True) == BatchLimits(rows=64)
    assert defaults.request_read_s == DEFAULT_REQUEST_READ_S and defaults.q4_amx_rows == DEFAULT_AMX_ROWS
    assert PAGE_LANDINGS is LANDINGS and set(QUANTIZE_CHOICES) == {"auto", *QUANTIZE_MODES}
    assert (defaults.concurrency, defaults.queue_size, defaults.max_queued_per_session) == (1, 32, 2)  # app.py's
    assert (defaults.server_name, defaults.server_port, defaults.malloc_arena_max) == ("127.0.0.1", 7860, 2)
    assert (defaults.adapter, defaults.quantize, defaults.landing, defaults.model) == ("auto", "auto", "auto", None)
    assert defaults.native and defaults.huge_pages and defaults.cuda_graphs and not defaults.analytics_enabled
    assert (defaults.int4_kernel, defaults.q4_isa, defaults.int8_bf16_rows) == ("auto", "auto", None)


def test_on_a_space_the_forwarded_address_is_trusted_unless_the_deployer_says_no():
    entry = _app_entry()
    space = Settings.from_environment({"SPACE_ID": "someone/skipdecode"})
    assert entry.serving_from(space).trust_forwarded_for
    assert not entry.serving_from(dataclasses.replace(space, trust_forwarded_for=False)).trust_forwarded_for
    assert entry.serving_from(Settings(trust_forwarded_for=True)).trust_forwarded_for


def test_app_py_lists_every_variable():
    listed = (ROOT / "app.py").read_text().split('"""')[1]
    missing = [variable for variable in _variables() if variable not in listed]
    assert not missing, f"app.py's docstring does not name {missing}"


def test_the_table_has_a_row_per_setting_with_its_help_and_a_default():
    rows = settings_table().splitlines()[2:]
    assert len(rows) == len(dataclasses.fields(Settings))
    for row, spec in zip(rows, dataclasses.fields(Settings)):
        variable, default, help_text = (cell.strip() for cell in row.strip("|").split(" | "))
        assert variable == f"`{spec.metadata['variable']}`" and default and len(help_text) > 10
        assert spec.default is not None or spec.metadata["shown_default"], f"{variable}: None needs a shown default"
    assert "| `SKIPDECODE_MAX_NEW_TOKENS` | 256 | longest generation one request may ask for |" in rows
    assert "| `SKIPDECODE_NATIVE` | `1` |" in settings_table() and "| `SKIPDECODE_STREAM_GRACE_S` | 5 |" in settings_table()


def test_the_command_prints_the_table(capsys):
    from model.cli import main

    assert main(["settings-table"]) == 0
    assert capsys.readouterr().out == settings_table()
