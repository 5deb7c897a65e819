"""The names a user of the library imports, from where they live (docs/DESIGN.md, "Layers").

A move or rename of one of these is a change to the library's face: this test names it."""

import importlib
import subprocess
import sys

import pytest

PUBLIC = {
    "model.loading": ["DEFAULT_MODEL", "DEFAULT_ADAPTER", "LoadedModel", "load_model", "resolve_device",
                      "resolve_adapter", "locate_default_gguf", "default_model_folder", "with_cuda_graphs"],
    "model.generation.generator": ["TextGenerator"],
    "model.generation.runs": ["GenerationRequest", "GenerationResult", "PreparedRun", "validate_request"],
    "model.generation.schedules": ["ScheduleRequest", "SchedulePlanner"],
    "model.generation.text": ["TextCodec", "truncate_at_stop"],
    "model.generation.lens": ["LogitLens", "LensReading"],
    "model.generation.judge": ["FullModelJudge"],
    "model.race": ["race", "RaceUpdate", "StreamProgress", "TokenTexts", "Judged", "PromptTokens"],
    "model.cli": ["main", "build_parser"],
    "model.common.checks": ["check_int", "check_number", "check_choice", "check_bool"],
    "model.common.paths": ["cache_root"],
    "model.common.progress": ["say"],
    "model.common.hardware": ["hardware_info", "cpu_summary"],
    "model.skipdecode.schedule": ["ScheduleConfig", "SolvedSchedule", "CostModel", "DECAY_FUNCTIONS", "LAYER_ORDERS",
                                  "DEFAULT_WARMUP", "full_schedule", "solve_schedule", "speedup_summary",
                                  "max_layer_speedup", "schedule_json"],
    "model.skipdecode.decoder": ["SkipDecoder", "SamplingConfig", "StepEvent", "DecodeResult", "masked_forward"],
    "model.skipdecode.skip_policy": ["EntryBridge", "export_adapter", "mix_adapters", "install_lora_gate", "side_lora_config"],
    "model.skipdecode.architectures": ["ArchitectureAdapter", "adapter_for"],
    "model.skipdecode.kv_cache": ["PrefixKVCache", "StaticKVCache"],
    "model.skipdecode.lean_layer": ["LeanLlamaLayer"],
    "model.skipdecode.static_decoder": ["StaticSkipDecoder", "static_decoder", "layer_sets_needed"],
    "model.skipdecode.cuda_graphs": ["CudaGraphStep", "GraphLRU"],
    "model.lowbit.quantization": ["quantize_weights", "QUANTIZE_MODES"],
    "model.lowbit.native_step": ["NativeDecode", "projection_spec"],
    "model.lowbit.native_kernels": ["native_module", "q4_kernel_selected", "Q4Blocks", "q4_scan"],
    "model.training.training": ["TrainConfig", "train"],
    "model.training.data": ["DEFAULT_EVAL_PROMPTS", "DEFAULT_FACTS", "read_prompts"],
    "model.training.make_data": ["MakeDataConfig", "make_data"],
    "model.training.scoring": ["teacher_forced_scores", "skip_policy_logits"],
    "model.evaluation.evaluation": ["EvalConfig", "evaluate", "write_report"],
    "model.evaluation.bench": ["BenchConfig", "run_bench", "write_bench"],
    "model.evaluation.lowbit_check": ["LowBitCheckConfig", "run_lowbit_check"],
    "model.studies.study": ["StudyConfig", "run_study"],
    "model.studies.scaling_study": ["ScalingConfig", "run_scaling"],
    "model.studies.shape_study": ["ShapeConfig", "run_shape_study"],
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_the_public_names_import_from_where_they_live(module):
    imported = importlib.import_module(module)
    missing = [name for name in PUBLIC[module] if not hasattr(imported, name)]
    assert not missing, f"{module} lost {missing}"


def test_python_dash_m_model_still_runs():
    done = subprocess.run([sys.executable, "-m", "model", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "generate" in done.stdout and "train" in done.stdout


# TextGenerator orchestrates a run; what is not a run a caller asks of its parts, each by name
# (generator.text: TextCodec; generator.schedules: SchedulePlanner), never through a forwarding copy.
GENERATOR_RUN = ["prepare", "sized", "with_schedule", "stream", "generate", "shared_prefill", "decoder_for"]
GENERATOR_PARTS = {
    ("model.generation.text", "TextCodec"): ["encode", "decode_text", "token_text", "prompt_tokens"],
    ("model.generation.schedules", "SchedulePlanner"): ["schedule_for", "check", "default_warmup", "default_order",
                                                        "default_floor", "ranking_for"],
}


def test_the_generator_runs_and_its_parts_answer_the_rest():
    from model.generation.generator import TextGenerator

    assert [name for name in GENERATOR_RUN if not hasattr(TextGenerator, name)] == []
    for (module, part), names in GENERATOR_PARTS.items():
        cls = getattr(importlib.import_module(module), part)
        assert [name for name in names if not hasattr(cls, name)] == [], f"{part} lost a name"
        forwarded = [name for name in names if hasattr(TextGenerator, name)]
        assert not forwarded, f"TextGenerator forwards {forwarded} to {part}: call generator's part instead"
