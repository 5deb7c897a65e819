"""The E2E task: its data split (no test MR is ever trained on), MR parsing, its schedule, its
scores, and the task model + gated policy path (1x with the policy IS the task model, bit for bit)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model.skipdecode.schedule import depth_share_floor
from model.tasks.e2e import (
    ATTRIBUTES,
    HELDOUT_MRS,
    E2ERecord,
    assert_no_test_mr,
    compose_mr,
    dev_split,
    example_mrs,
    normalise_mr,
    parse_mr,
    reported_records,
    task_prompt,
    training_rows,
    write_training_file,
)
from model.tasks.task_eval import bleu, nist, rouge_l
from model.tasks.task_models import policy_for, policy_name, task_schedule
from model.tasks.task_training import TaskRun, train_config
from tests.support import ROOT


def test_the_split_holds_out_fifty_dev_mrs_and_never_a_test_mr(tmp_path):
    train, held = dev_split()
    assert len(held) == HELDOUT_MRS and len(train) + len(held) == 547
    assert not {r.mr for r in train} & {r.mr for r in held}
    path = write_training_file(tmp_path / "train.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == sum(len(r.references) for r in train)
    trained = {row["prompt"] for row in rows}
    assert not trained & {task_prompt(r.mr) for r in reported_records()}
    assert not trained & {task_prompt(r.mr) for r in held}
    assert len(reported_records()) == 630


def test_a_test_mr_in_training_data_is_refused_in_any_attribute_order():
    mr = reported_records()[5].mr
    pairs = parse_mr(mr)
    shuffled = ", ".join(f"{k}[{v}]" for k, v in reversed(list(pairs.items())))
    with pytest.raises(ValueError, match="test-set MRs"):
        assert_no_test_mr([dev_split()[0][0].mr, shuffled])
    assert_no_test_mr([r.mr for r in dev_split()[0][:20]])  # dev MRs pass


def test_mrs_parse_compose_and_refuse_nonsense():
    assert parse_mr("name[The Eagle], food[French]") == {"name": "The Eagle", "food": "French"}
    assert parse_mr("name[Aromi], customer rating[5 out of 5]")["customer rating"] == "5 out of 5"
    assert compose_mr({"food": "Indian", "name": "Zizzi", "area": ""}) == "name[Zizzi], food[Indian]"
    assert normalise_mr("food[French], name[X]") == normalise_mr("name[X], food[French]")
    for bad, needle in (("", "empty"), ("food[French]", "needs a name"), ("name[A], colour[red]", "unknown"),
                        ("name[A], name[B]", "twice"), ("name[A] <b>hi</b>", "attribute\\[value\\]"),
                        ("name[" + "x" * 200 + "]", "characters"), ("name[]", "characters")):
        with pytest.raises(ValueError, match=needle):
            parse_mr(bad)
    with pytest.raises(ValueError, match="unknown"):
        compose_mr({"name": "A", "evil": "x"})
    assert len(ATTRIBUTES) == 8
    examples = example_mrs(6)
    assert len(examples) == 6 and all(parse_mr(mr) for mr in examples)


def test_every_csv_mr_parses():
    for record in reported_records() + dev_split()[0]:
        assert parse_mr(record.mr)["name"]


def test_the_task_schedule_is_floored_and_holds_its_speedup_over_the_decay_length():
    from model.skipdecode.schedule import solve_schedule

    assert [depth_share_floor(30, s, 2 / 3) for s in (2, 3, 4, 5)] == [10, 7, 5, 4]
    request = task_schedule("e2e", 3.0, 30)
    assert request.min_layers_floor == 7 and request.decay_length == request.speedup_steps == 32
    solved = solve_schedule(30, 3.0, decay="linear", warmup=4, decay_length=32, num_steps=32, min_layers_floor=7)
    assert solved.config.min_layers >= 7 and abs(solved.layer_speedup - 3.0) < 0.15
    assert task_schedule("e2e", 1.0, 30).full
    with pytest.raises(ValueError, match="unknown task"):
        task_schedule("cnn", 2.0, 30)


def test_scores_reward_the_references_and_handle_a_varying_number_of_them():
    references = [("The Eagle is a French coffee shop.", "The Eagle serves French food."),
                  ("Zizzi is a cheap pub in the city centre.",)]
    perfect = [references[0][0], references[1][0]]
    wrong = ["A dog sat on a mat.", "Nothing here at all."]
    assert bleu(perfect, references) == pytest.approx(100.0)
    assert bleu(wrong, references) < 10
    assert rouge_l(perfect, references) == pytest.approx(100.0)
    assert rouge_l(wrong, references) < 40
    assert nist(perfect, references) > 2 * nist(wrong, references)
    assert nist(["", ""], references) == 0.0


def test_task_runs_are_checked_and_configured_the_papers_way(tmp_path):
    with pytest.raises(ValueError, match="--policy"):
        TaskRun(policy="fast")
    with pytest.raises(ValueError, match="in \\(1, 6\\]"):
        TaskRun(policy="9")
    with pytest.raises(ValueError, match="not to the task model"):
        TaskRun(policy="task", kl_weight=1.0)
    with pytest.raises(ValueError, match="--flip-weight"):
        TaskRun(policy="task", flip_weight=2.0)
    with pytest.raises(ValueError, match="--flip-weight"):
        TaskRun(policy="3", flip_weight=float("nan"))
    flipped = TaskRun(policy="3", flip_weight=2.0)
    assert train_config(flipped, tmp_path / "d.jsonl").flip_weight == 2.0 and flipped.name == "skip-3x-flip2"
    task = train_config(TaskRun(policy="task"), tmp_path / "d.jsonl")
    assert task.fixed_speedup == 1.0 and not task.gate_lora and task.task_adapter is None
    three = train_config(TaskRun(policy="3", kl_weight=0.5), tmp_path / "d.jsonl")
    assert three.gate_lora and three.fixed_speedup == 3.0 and three.fixed_decay_length == 32
    assert three.kl_weight == 0.5 and three.task_adapter.endswith("e2e/task") and three.floor_share == pytest.approx(2 / 3)
    shared = train_config(TaskRun(policy="all"), tmp_path / "d.jsonl")
    assert shared.fixed_speedup is None and shared.speedup_range == (1.5, 5.0) and shared.decays == ("linear",)
    assert policy_name(3.0) == "skip-3x" and policy_name(None) == "skip-all"
    assert three.bridge_rank == 0 and task.bridge_rank == 0
    bridged = TaskRun(policy="3", bridge_rank=16)
    assert train_config(bridged, tmp_path / "d.jsonl").bridge_rank == 16 and bridged.name == "skip-3x-bridge16"
    with pytest.raises(ValueError, match="the task model bypasses no layer"):
        TaskRun(policy="task", bridge_rank=8)
    for rank in (-1, 2.5, 1000):
        with pytest.raises(ValueError, match="--bridge-rank"):
            TaskRun(policy="3", bridge_rank=rank)


def test_policy_for_prefers_its_own_speedup_then_the_shared_policy(tmp_path):
    for name in ("skip-3x", "skip-all"):
        (tmp_path / "e2e" / name).mkdir(parents=True)
        (tmp_path / "e2e" / name / "adapter_config.json").write_text("{}")
    assert policy_for("e2e", 3.0, tmp_path).name == "skip-3x"
    assert policy_for("e2e", 2.5, tmp_path).name == "skip-all"
    assert policy_for("e2e", 2.0, tmp_path).name == "skip-all"
    assert policy_for("e2e", 2.0, tmp_path / "none") is None


@pytest.mark.slow
def test_task_model_and_gated_policy_train_and_1x_is_the_task_model_bit_for_bit(tiny_folder, tmp_path):
    """Train a task LoRA (full depth, ungated) and a gated policy on top of it on a tiny model; the
    task model differs from the base, the policy's skipping weights differ from the task model's,
    and at full depth the policy's decoder gives the task model's logits exactly."""
    from model.loading import load_model
    from model.skipdecode.schedule import full_schedule
    from model.training.training import TrainConfig, train

    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in training_rows(dev_split()[0][:4])))
    common = dict(model=str(tiny_folder), data=str(data), max_steps=2, batch_size=2, lora_rank=2, lora_alpha=4,
                  eval_every=0, save_every=2, device="cpu", learning_rate=5e-2, warmup_steps=1, warmup_layers=1)
    train(TrainConfig(**common, output_dir=str(tmp_path / "task"), fixed_speedup=1.0, gate_lora=False))
    task_adapter = str(tmp_path / "task" / "adapter")
    train(TrainConfig(**common, output_dir=str(tmp_path / "policy"), task_adapter=task_adapter, fixed_speedup=2.0,
                      fixed_decay_length=8, floor_share=2 / 3, gate_lora=True))
    base = load_model(str(tiny_folder), device="cpu", adapter=None)
    loaded = load_model(str(tiny_folder), device="cpu", adapter=str(tmp_path / "policy" / "adapter"),
                        task_adapter=task_adapter)
    assert loaded.gated and loaded.name.endswith("+task")
    weight = "model.layers.0.self_attn.q_proj.weight"
    task_weights, base_weights = loaded.model.state_dict()[weight], base.model.state_dict()[weight]
    assert not torch.equal(task_weights, base_weights)
    assert not torch.equal(loaded.skip_model.state_dict()[weight], task_weights)
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    mask = torch.ones_like(ids)
    schedule = full_schedule(loaded.num_layers, 4)
    results = []
    for decoder in (loaded.full_decoder(), loaded.skip_decoder()):
        state, logits = decoder.prefill(ids, mask, schedule.prefill_layers(), 12)
        steps = [logits]
        for step in range(3):
            steps.append(decoder.decode_step(state, torch.tensor([11 + step]), schedule.step_layers(step)))
        results.append(torch.stack(steps))
    assert torch.equal(results[0], results[1])


@pytest.mark.slow
def test_speed_rows_time_the_same_steps_for_both_arms(tiny_folder):
    from model.generation.generator import TextGenerator
    from model.generation.schedules import ScheduleRequest
    from model.loading import load_model
    from model.tasks.task_eval import measure_speed

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    full = task_schedule("e2e", 1.0, generator.num_layers, full=True)
    skip = ScheduleRequest(target_speedup=2.0, warmup=1, decay_length=8, speedup_steps=8, skip_policy=False)
    row = measure_speed(generator, ["name[A]", "name[B], food[French]", "name[C]"], full, skip, 2.0, 2, 8, 1)
    assert row.steps == 8 and row.mrs == 3 and row.batch_size == 2
    assert 1.5 < row.layer_speedup < 2.5 and 1.0 < row.cost_model_bound <= row.layer_speedup
    assert row.full_decode_tps > 0 and row.skip_decode_tps > 0
    assert row.decode_speedup == pytest.approx(row.skip_decode_tps / row.full_decode_tps, rel=1e-2)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "model", *args], cwd=ROOT,
                          env=dict(os.environ, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=600)


def test_generate_task_refuses_what_the_task_fixes_and_bad_mrs_before_loading():
    fixed = _cli("generate", "--task", "e2e", "--prompt", "name[The Eagle]", "--decay", "cosine")
    assert fixed.returncode == 2 and "--decay" in fixed.stderr and "Traceback" not in fixed.stderr
    bad = _cli("generate", "--task", "e2e", "--prompt", "The Eagle, French")
    assert bad.returncode == 2 and "attribute[value]" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_generate_task_runs_the_shipped_policy_for_the_speedup_and_the_task_model_at_full():
    from model.tasks.task_models import task_adapter_dir

    if not (task_adapter_dir("e2e") / "adapter_config.json").is_file():
        pytest.skip("the E2E adapters are not in assets/adapters/e2e")
    mr = "name[The Eagle], eatType[coffee shop], food[French], area[riverside]"
    skip = _cli("generate", "--task", "e2e", "--prompt", mr, "--speedup", "3", "--json")
    assert skip.returncode == 0, skip.stderr
    out = json.loads(skip.stdout)
    assert out["model"].endswith("+e2e") and out["adapter"].endswith("skip-3x")
    assert "Eagle" in out["outputs"][0] and out["schedule"]["min_layers"] >= 7
    full = _cli("generate", "--task", "e2e", "--prompt", mr, "--full", "--json")
    assert full.returncode == 0, full.stderr
    assert set(json.loads(full.stdout)["layers_per_step"]) == {30} and "Eagle" in json.loads(full.stdout)["outputs"][0]
    new = "name[Loch Fyne], food[French], near[The Painted Lighthouse]"  # places the devset never names
    swapped = _cli("generate", "--task", "e2e", "--prompt", new, "--speedup", "3", "--delexicalised-places", "--json")
    assert swapped.returncode == 0, swapped.stderr
    out = json.loads(swapped.stdout)
    assert out["prompts"][0].endswith(new) and "Loch Fyne" in out["outputs"][0]  # written back
    assert "Aromi" not in out["outputs"][0] and "The Eagle" not in out["outputs"][0]
    chat = _cli("generate", "--prompt", "Hi", "--delexicalised-places")
    assert chat.returncode == 2 and "needs --task" in chat.stderr


def _report(arms: list[tuple[str, str, float, float]], minutes: float = 1.0, device: str = "cuda") -> dict:
    """A small eval-task report: arms as (label, policy, speedup, BLEU)."""
    return {"task": "e2e", "test_mrs": 630, "minutes": minutes, "config": {"device": device, "weights": "float32"},
            "hardware": {"summary": device}, "policies": {"skip-3x": {"step": 200 if device == "cuda" else 260}},
            "speed": [], "arms": [{"label": label, "policy": policy, "speedup": speedup, "scores": {"bleu": bleu, "rouge_l": bleu, "nist": 5.0},
                                   "shares": dict.fromkeys(("bleu", "rouge_l", "nist"), round(bleu / 56.3, 3)), "achieved_layer_speedup": speedup,
                                   "cost_model_speedup": speedup} for label, policy, speedup, bleu in arms]}


def test_an_update_replaces_only_the_re_measured_arms_and_says_so():
    from model.tasks.task_report import add_closeness, merged_report, report_markdown

    existing = _report([("task model (1x)", "task model", 1.0, 56.3), ("no policy 3x", "none", 3.0, 0.94),
                        ("per-speedup policy 2x", "per-speedup", 2.0, 55.55),
                        ("per-speedup policy 3x", "per-speedup", 3.0, 45.57)])
    fresh = _report([("task model (1x)", "task model", 1.0, 56.3), ("no policy 3x", "none", 3.0, 0.94),
                     ("per-speedup policy 3x", "per-speedup", 3.0, 50.0)], minutes=30.0, device="cpu")
    merged = merged_report(existing, fresh)
    assert [(a["label"], a["scores"]["bleu"]) for a in merged["arms"]] == [  # in the report's order
        ("task model (1x)", 56.3), ("no policy 3x", 0.94), ("per-speedup policy 2x", 55.55),
        ("per-speedup policy 3x", 50.0)]
    assert merged["policies"]["skip-3x"] == {"step": 260} and merged["config"]["device"] == "cuda"
    assert merged["updates"][0]["arms"] == ["no policy 3x", "per-speedup policy 3x"]
    assert "Re-measured later (cpu, cpu; 30.0 min): no policy 3x, per-speedup policy 3x." in report_markdown(merged)
    outputs = {"task model (1x)": ["A is a pub.", "B is a cafe."], "per-speedup policy 3x": ["A is a pub.", "B."]}
    closer = add_closeness(merged, outputs)
    assert [a["vs_task_model"] and a["vs_task_model"]["same_share"] for a in closer["arms"]] == [1.0, None, None, 0.5]
    assert "| 100.00 | 100.0% |" in report_markdown(closer) and "| - | - |" in report_markdown(closer)


def test_an_update_scored_more_ways_folds_into_a_report_scored_fewer():
    """A report made before "facts" was scored takes an update whose task model has the same
    BLEU / ROUGE-L / NIST: its 1x row gains the new score; a task model that writes otherwise is refused."""
    from model.tasks.task_report import merged_report

    existing = _report([("task model (1x)", "task model", 1.0, 56.3), ("per-speedup policy 5x", "per-speedup", 5.0, 50.0)])
    fresh = _report([("task model (1x)", "task model", 1.0, 56.3), ("per-speedup policy 5x", "per-speedup", 5.0, 53.0)])
    for arm in fresh["arms"]:
        arm["scores"]["facts"], arm["shares"]["facts"] = 0.2, 1.0
    merged = merged_report(existing, fresh)
    assert merged["arms"][0]["scores"] == {"bleu": 56.3, "rouge_l": 56.3, "nist": 5.0, "facts": 0.2}
    assert merged["arms"][1]["scores"]["bleu"] == 53.0 and merged["updates"][0]["arms"] == ["per-speedup policy 5x"]
    fresh["arms"][0]["scores"]["nist"] = 5.5
    with pytest.raises(ValueError, match="scores differently"):
        merged_report(existing, fresh)


def test_a_speed_only_update_replaces_the_rows_it_timed_and_keeps_the_scores():
    from model.tasks.task_report import merged_report, report_markdown

    def row(speedup, batch, decode):
        return {"speedup": speedup, "batch_size": batch, "steps": 32, "mrs": 16, "repeats": 2, "policy": f"skip-{speedup:g}x", "weights": "int8",
                "full_decode_tps": 60.0, "skip_decode_tps": 60.0 * decode, "decode_speedup": decode,
                "cost_model_bound": 1.6, "share_of_bound": decode / 1.6, "end_to_end_speedup": 1.4}

    existing = _report([("task model (1x)", "task model", 1.0, 56.3), ("per-speedup policy 2x", "per-speedup", 2.0, 55.0)])
    existing |= {"speed": [row(2.0, 1, 1.85), row(2.0, 8, 1.91)], "policies": {"task": {"step": 120}, "skip-2x": {"step": 80}}}
    fresh = {**existing, "arms": [], "test_mrs": 16, "minutes": 3.5, "config": {"device": "cpu", "weights": "default"},
             "speed": [row(2.0, 8, 1.82)], "policies": {"task": {"step": 120}, "skip-2x": {"step": 80}}}
    merged = merged_report(existing, fresh)
    assert [r["decode_speedup"] for r in merged["speed"]] == [1.85, 1.82] and merged["arms"] == existing["arms"]
    assert merged["test_mrs"] == 630
    assert "Re-measured later (cpu, cuda; 3.5 min): speed 2x batch 8." in report_markdown(merged)
    with pytest.raises(ValueError, match="another task or task model"):
        merged_report(existing, fresh | {"policies": {"task": {"step": 400}, "skip-2x": {"step": 80}}})
    with pytest.raises(ValueError, match="other skip-2x weights"):
        merged_report(existing, fresh | {"policies": {"task": {"step": 120}, "skip-2x": {"step": 400}}})
    with pytest.raises(ValueError, match="timed differently"):
        merged_report(existing, fresh | {"speed": [row(2.0, 8, 1.82) | {"mrs": 8}]})
    with pytest.raises(ValueError, match="neither quality nor speed"):
        merged_report(existing, fresh | {"speed": []})


def test_an_update_with_another_task_model_or_other_mrs_is_refused():
    from model.tasks.task_report import merged_report

    existing = _report([("task model (1x)", "task model", 1.0, 56.3), ("per-speedup policy 3x", "per-speedup", 3.0, 45.6)])
    other_1x = _report([("task model (1x)", "task model", 1.0, 57.0), ("per-speedup policy 3x", "per-speedup", 3.0, 50.0)])
    with pytest.raises(ValueError, match="task model scores differently"):
        merged_report(existing, other_1x)
    with pytest.raises(ValueError, match="630 e2e MRs, this run 160"):
        merged_report(existing, existing | {"test_mrs": 160})


def test_synthetic_mrs_are_new_parse_and_reach_values_the_devset_never_shows():
    from model.tasks.e2e import ATTRIBUTE_VALUES, synthetic_mrs

    train, held = dev_split()
    made = synthetic_mrs(train, 300, seed=3)
    assert len(made) == len(set(made)) == 300 and made == synthetic_mrs(train, 300, seed=3)
    assert made != synthetic_mrs(train, 300, seed=4)
    known = {normalise_mr(r.mr) for r in (*train, *held, *reported_records())}
    assert not {normalise_mr(mr) for mr in made} & known
    assert_no_test_mr(made)
    names = {v for r in train for k, v in parse_mr(r.mr).items() if k in ("name", "near")}
    parsed = [parse_mr(mr) for mr in made]
    assert all(p["name"] in names and p.get("near", p["name"]) in names and p.get("near") != p["name"] for p in parsed)
    seen_in_dev = {(k, v) for r in train for k, v in parse_mr(r.mr).items()}
    new_values = {(k, v) for p in parsed for k, v in p.items() if k in ATTRIBUTE_VALUES} - seen_in_dev
    assert ("eatType", "pub") in new_values and ("food", "Italian") in new_values
    with pytest.raises(ValueError, match="two place names"):
        synthetic_mrs([E2ERecord("name[Solo]", ("Solo is a place.",))], 5)


def test_distillation_targets_are_the_task_models_own_greedy_descriptions(tiny_task_adapters, tmp_path):
    """Each row is one MR's prompt and the task model's greedy description of it (the same text a
    full-depth generation gives); a file made from the same source is reused, another is remade."""
    from model.generation.generator import TextGenerator
    from model.tasks.task_distill import DistillSource, write_distillation_file
    from model.tasks.task_eval import describe

    root, loader = tiny_task_adapters
    model = str(root.parent / "model")
    source = DistillSource(task_adapter=str(root / "e2e" / "task"), training_mrs=3, synthetic_mrs=2, seed=0, device="cpu")
    path = write_distillation_file(tmp_path / "distilled.jsonl", source, model=model)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    mrs = [r.mr for r in dev_split()[0][:3]]
    assert 1 <= len(rows) <= 5 and all(row["completion"] for row in rows)
    generator = TextGenerator(loader("e2e", None))
    expected = describe(generator, mrs, task_schedule("e2e", 1.0, generator.num_layers, full=True), 96).outputs
    by_prompt = {row["prompt"]: row["completion"] for row in rows}
    assert [by_prompt.get(task_prompt(mr)) for mr in mrs] == [text or None for text in expected]
    assert not {row["prompt"] for row in rows} & {task_prompt(r.mr) for r in reported_records()}
    stamp = path.stat().st_mtime_ns
    assert write_distillation_file(path, source, model=model).stat().st_mtime_ns == stamp
    other = DistillSource(**{**source.__dict__, "synthetic_mrs": 1})
    write_distillation_file(path, other, model=model)
    assert len(path.read_text().splitlines()) <= 4 and json.loads(path.with_suffix(".source.json").read_text())["synthetic_mrs"] == 1
    retrained = DistillSource(**{**other.__dict__, "task_weights": "another-task-model"})
    write_distillation_file(path, retrained, model=model)
    assert json.loads(path.with_suffix(".source.json").read_text())["task_weights"] == "another-task-model"


def test_a_gpu_decodes_the_distillation_pass_and_the_held_out_sets_in_large_batches():
    """The CPU keeps the caller's small batch (its figures were measured so); a CUDA device takes
    GPU_BATCH MRs at once, or more where the caller asks for more."""
    from model.tasks.task_eval import GPU_BATCH, batch_for

    assert batch_for("cpu", 25) == 25 and batch_for(torch.device("cpu"), 32) == 32
    assert batch_for("cuda", 25) == GPU_BATCH == 512
    assert batch_for(torch.device("cuda:0"), 1024) == 1024


def test_long_held_out_mrs_name_all_eight_attributes_and_are_never_trained_on():
    from model.tasks.e2e import long_heldout_mrs, synthetic_mrs

    train = dev_split()[0]
    mrs = long_heldout_mrs(train, 40, seed=2, trained_cap=300)
    assert len(mrs) == 40 and all(len(parse_mr(mr)) == 8 for mr in mrs)
    assert mrs == long_heldout_mrs(train, 40, seed=2, trained_cap=300)  # seeded
    known = {normalise_mr(r.mr) for r in [*train, *dev_split()[1], *reported_records()]}
    assert not {normalise_mr(mr) for mr in mrs} & known
    # two places only: a small space, where the training draws would overlap without the exclusion
    two = [E2ERecord("name[Aromi], near[Zizzi]", ("Aromi is near Zizzi.",))]
    trained = {normalise_mr(mr) for mr in synthetic_mrs(two, 5000, 0)}
    overlap = {normalise_mr(mr) for mr in synthetic_mrs(two, 200, 2, attribute_share=1.0)} & trained
    assert overlap  # what the exclusion is for
    assert not {normalise_mr(mr) for mr in long_heldout_mrs(two, 200, seed=2, trained_cap=5000)} & trained


def test_invented_places_are_no_devset_or_test_place_and_make_long_held_out_mrs():
    from model.tasks.e2e import INVENTED_PLACES_HELDOUT, INVENTED_PLACES_TRAINING, long_heldout_mrs

    records = [*dev_split()[0], *dev_split()[1], *reported_records()]
    real = {value.lower() for r in records for key, value in parse_mr(r.mr).items() if key in ("name", "near")}
    assert len(set(INVENTED_PLACES_HELDOUT)) == len(INVENTED_PLACES_HELDOUT) >= 8
    assert not any(real_place in place.lower() or place.lower() in real_place
                   for place in INVENTED_PLACES_HELDOUT for real_place in real)
    training_words = {word for place in INVENTED_PLACES_TRAINING for word in place.split()[1:]}
    assert not training_words & {word for place in INVENTED_PLACES_HELDOUT for word in place.split()[1:]}
    assert not any(real_place in place.lower() or place.lower() in real_place
                   for place in INVENTED_PLACES_TRAINING for real_place in real)
    mrs = long_heldout_mrs(dev_split()[0], 30, seed=2, trained_cap=300, places=INVENTED_PLACES_HELDOUT)
    assert len(mrs) == 30 and all(len(parse_mr(mr)) == 8 for mr in mrs)
    assert {parse_mr(mr)[key] for mr in mrs for key in ("name", "near")} <= set(INVENTED_PLACES_HELDOUT)


def test_a_share_of_the_synthetic_mrs_is_about_invented_places_and_the_run_says_so():
    from model.tasks.e2e import INVENTED_PLACES_TRAINING
    from model.tasks.task_distill import distillation_mrs

    train = dev_split()[0][:20]
    mrs = distillation_mrs(train, 40, seed=0, invented_share=0.25)
    synthetic = mrs[len(train):]
    invented = [mr for mr in synthetic if parse_mr(mr)["name"] in INVENTED_PLACES_TRAINING]
    assert len(synthetic) == 40 and len(invented) == 10 and synthetic[-10:] == invented
    assert distillation_mrs(train, 40, seed=0)[len(train):] != synthetic  # the share changes the file's source
    run = TaskRun(policy="2", targets="task-model", synthetic_mrs=1000, invented_places=0.5)
    assert run.name.endswith("-distil1000-invented0.5")
    with pytest.raises(ValueError, match="give some"):
        TaskRun(policy="2", targets="task-model", invented_places=0.5)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        TaskRun(policy="2", targets="task-model", synthetic_mrs=10, invented_places=1.5)


def test_synthetic_mrs_with_a_lower_attribute_share_give_fewer_facts_and_the_run_says_so(tmp_path):
    """--synthetic-attribute-share 0.5: every subset of the optional facts equally likely, so a policy
    also learns to stop where an MR gives few; the default draws are unchanged (an earlier pass's
    record, written before the field existed, still reads as the same source)."""
    from dataclasses import asdict

    from model.tasks.task_distill import DistillSource, _recorded_source, distillation_mrs

    train = dev_split()[0]
    default = distillation_mrs(train, 600, seed=0)
    assert default == distillation_mrs(train, 600, seed=0, attribute_share=0.75)
    sparse = distillation_mrs(train, 600, seed=0, attribute_share=0.5)
    assert sparse[:len(train)] == default[:len(train)]  # the training MRs themselves are the same
    rated = [sum("customer rating" in parse_mr(mr) for mr in mrs[len(train):]) / 600 for mrs in (default, sparse)]
    assert 0.68 < rated[0] < 0.82 and 0.42 < rated[1] < 0.58
    facts = [sum(len(parse_mr(mr)) for mr in mrs[len(train):]) / 600 for mrs in (default, sparse)]
    assert facts[0] - facts[1] > 1.2  # 1 + 7 x 0.75 against 1 + 7 x 0.5 on average
    assert_no_test_mr(sparse)
    old = DistillSource(task_adapter="t", training_mrs=2, synthetic_mrs=3, seed=0, device="cpu")
    record = {key: value for key, value in asdict(old).items() if key != "attribute_share"}
    (tmp_path / "distilled.source.json").write_text(json.dumps(record))
    assert _recorded_source(tmp_path / "distilled.source.json") == asdict(old)
    run = TaskRun(policy="3", targets="task-model", synthetic_mrs=3000, synthetic_attribute_share=0.5)
    assert run.folder.name == "e2e-skip-3x-distil3000-share0.5"
    with pytest.raises(ValueError, match="give some"):
        TaskRun(policy="3", targets="task-model", synthetic_attribute_share=0.5)
    for share in (0, 1.5, float("nan")):
        with pytest.raises(ValueError, match="synthetic-attribute-share"):
            TaskRun(policy="3", targets="task-model", synthetic_mrs=10, synthetic_attribute_share=share)


def test_sparse_held_out_mrs_give_few_facts_and_are_never_trained_on():
    """The held-out MRs a missed stop is judged on (sparse_mr_made_up): drawn at attribute share 0.5,
    seeded, none a synthetic MR a seed-0 run trains on at either share, nor a devset or test MR."""
    from model.tasks.e2e import heldout_new_mrs, synthetic_mrs

    train = dev_split()[0]
    mrs = heldout_new_mrs(train, 60, seed=3, attribute_share=0.5, trained_cap=400, trained_shares=(0.75, 0.5))
    assert len(mrs) == len(set(mrs)) == 60 and mrs == heldout_new_mrs(train, 60, 3, 0.5, trained_cap=400,
                                                                        trained_shares=(0.75, 0.5))
    assert 3 < sum(len(parse_mr(mr)) for mr in mrs) / 60 < 6
    known = {normalise_mr(r.mr) for r in [*train, *dev_split()[1], *reported_records()]}
    assert not {normalise_mr(mr) for mr in mrs} & known
    two = [E2ERecord("name[Aromi], near[Zizzi]", ("Aromi is near Zizzi.",))]
    trained = {normalise_mr(mr) for share in (0.75, 0.5) for mr in synthetic_mrs(two, 400, 0, share)}
    assert {normalise_mr(mr) for mr in synthetic_mrs(two, 100, 3, 0.5)} & trained  # what the exclusion is for
    held = heldout_new_mrs(two, 100, seed=3, attribute_share=0.5, trained_cap=400, trained_shares=(0.75, 0.5))
    assert len(held) == 100 and not {normalise_mr(mr) for mr in held} & trained


def test_the_sparse_check_counts_the_descriptions_that_make_up_a_fact(monkeypatch):
    """sparse_mr_made_up: at 1x and at the speedup, the share of descriptions naming a kind of fact
    their MR does not give; beyond the task model, the share where the policy makes up one that the
    task model's own description does not; how close the policy's text stays to the task model's."""
    from model.tasks import task_training

    def descriptions(run, config, adapter, mrs, speedups):
        # the task model calls every place a restaurant (made up where the MR gives no eatType); the
        # policy also runs on with a rating for the first 10 MRs where the MR gives none
        plain = [f"{parse_mr(mr)['name']} is a restaurant." for mr in mrs]
        run_on = [text + (" It has a high customer rating." if "customer rating" not in parse_mr(mr) else "")
                  for mr, text in zip(mrs, plain)]
        return {1.0: plain, speedups[1]: run_on[:10] + plain[10:]}

    monkeypatch.setattr(task_training, "_descriptions", descriptions)
    scores = task_training.sparse_mr_made_up(TaskRun(policy="3"), None, Path("unused"), 3.0, 40)
    mrs = task_training.heldout_new_mrs(dev_split()[0], 40, seed=task_training.HELDOUT_SPARSE_SEED,
                                        attribute_share=0.5, trained_shares=(0.75, 0.5))
    no_eat_type = ["eatType" not in parse_mr(mr) for mr in mrs]
    ran_on = [i < 10 and "customer rating" not in parse_mr(mr) for i, mr in enumerate(mrs)]
    assert 0 < sum(no_eat_type) < 40 and sum(ran_on) >= 2
    assert scores["1x"]["made_up"] == round(sum(no_eat_type) / 40, 3)
    assert scores["3x"]["made_up"] == round(sum(a or b for a, b in zip(no_eat_type, ran_on)) / 40, 3)
    assert scores["3x"]["beyond_task_model"] == round(sum(ran_on) / 40, 3)
    assert scores["3x"]["vs_task_model"]["same_share"] == round((40 - sum(ran_on)) / 40, 3)


def test_varied_invented_places_are_fresh_unlearnable_names_no_real_or_held_out_place():
    from model.tasks.e2e import INVENTED_PLACES_HELDOUT, real_places, varied_places
    from model.tasks.task_distill import distillation_mrs

    real = real_places()
    places = varied_places(600, seed=0, avoid=real)
    assert len(places) == len(set(places)) == 600 and places == varied_places(600, seed=0, avoid=real)
    assert places != varied_places(600, seed=1, avoid=real)
    lowered_real = [place.lower() for place in real]
    assert not any(r in p.lower() or p.lower() in r for p in places for r in lowered_real)
    held_words = {w.lower() for place in INVENTED_PLACES_HELDOUT for w in place.split() if w != "The"}
    assert not any(held_words & set(p.lower().split()) for p in places)
    assert len({p.split()[0] for p in places}) > 100  # varied shapes and words, not a short list to learn
    assert not any("blue" in place.lower() for place in varied_places(3000, avoid=["blue"]))
    assert any("blue" in place.lower() for place in varied_places(3000))
    train = dev_split()[0][:20]
    fixed = distillation_mrs(train, 40, seed=0, invented_share=0.5)
    varied = distillation_mrs(train, 40, seed=0, invented_share=0.5, invented_style="varied")
    assert fixed[:40] == varied[:40] and fixed[40:] != varied[40:]
    names = [parse_mr(mr)[key] for mr in varied[40:] for key in ("name", "near") if key in parse_mr(mr)]
    assert len(set(names)) > 0.6 * len(names)  # each name comes up about once or twice
    run = TaskRun(policy="2", targets="task-model", synthetic_mrs=100, invented_places=1, invented_style="varied")
    assert run.name.endswith("-invented1-varied")
    with pytest.raises(ValueError, match="invented-style"):
        TaskRun(policy="2", targets="task-model", synthetic_mrs=100, invented_places=1, invented_style="random")
    with pytest.raises(ValueError, match="give a share"):
        TaskRun(policy="2", targets="task-model", synthetic_mrs=100, invented_style="varied")


def test_adapter_fingerprint_follows_the_weights_not_the_folder(tmp_path):
    from model.tasks.task_distill import adapter_fingerprint

    for name, weights in (("a", b"one"), ("b", b"one"), ("c", b"two")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_model.safetensors").write_bytes(weights)
        (tmp_path / name / "training_info.json").write_text(name)
    assert adapter_fingerprint(tmp_path / "a") == adapter_fingerprint(tmp_path / "b") != adapter_fingerprint(tmp_path / "c")


def test_distilled_task_runs_are_checked_and_named():
    with pytest.raises(ValueError, match="--targets must be"):
        TaskRun(policy="3", targets="teacher")
    with pytest.raises(ValueError, match="needs --policy"):
        TaskRun(policy="task", targets="task-model")
    with pytest.raises(ValueError, match="need --targets task-model"):
        TaskRun(policy="3", synthetic_mrs=10)
    with pytest.raises(ValueError, match="synthetic-mrs must be"):
        TaskRun(policy="3", targets="task-model", synthetic_mrs=-1)
    assert TaskRun(policy="3", targets="task-model", synthetic_mrs=1000).folder.name == "e2e-skip-3x-distil1000"
    assert TaskRun(policy="2", targets="task-model").folder.name == "e2e-skip-2x-distil"
    with pytest.raises(ValueError, match="--complete-references filters the references"):
        TaskRun(policy="3", targets="task-model", complete_references=True)
    assert TaskRun(policy="task", relexicalised=2, complete_references=True).folder.name == "e2e-task-relex2-complete"


def test_a_description_is_checked_for_every_fact_its_mr_names(tmp_path):
    """unmentioned_attributes: names word for word, eatType and food by their words, the others by any
    word of their kind; the facts share counts descriptions that miss none; complete_references keeps
    an MR's complete references, or all of them where none is complete."""
    from model.tasks.e2e import complete_references, unmentioned_attributes
    from model.tasks.task_eval import task_scores

    mr = ("name[Blue Spice], eatType[pub], food[Chinese], priceRange[cheap], customer rating[5 out of 5], "
          "area[riverside], familyFriendly[yes], near[Rainbow Vegetarian Café]")
    full = ("Blue Spice is a cheap, kid friendly Chinese pub by the river near Rainbow Vegetarian Café, "
            "rated 5 out of 5.")
    template = "Blue Spice is a pub providing Chinese food It is located in the riverside. It is near Rainbow Vegetarian Café."
    assert unmentioned_attributes(mr, full) == []
    assert unmentioned_attributes(mr, template) == ["priceRange", "customer rating", "familyFriendly"]
    assert unmentioned_attributes("name[Aromi], eatType[coffee shop], area[city centre]",
                                  "Aromi is a pub in the riverside area.") == ["eatType", "area"]
    record = E2ERecord(mr, (template, full))
    assert task_scores([template], [record])["facts"] == 0.0 and task_scores([full], [record])["facts"] == 1.0
    lone = E2ERecord("name[Aromi], area[riverside]", ("Aromi is a place.",))
    assert complete_references([record, lone]) == [E2ERecord(mr, (full,)), lone]
    every = [json.loads(line) for line in write_training_file(tmp_path / "all.jsonl").read_text().splitlines()]
    kept = [json.loads(line) for line in write_training_file(tmp_path / "complete.jsonl", complete_only=True).read_text().splitlines()]
    assert 0.6 * len(every) < len(kept) < 0.8 * len(every)  # 3,010 of the 4,262 devset references
    assert {row["prompt"] for row in kept} == {row["prompt"] for row in every}  # no MR lost
    prefix = len(task_prompt(""))
    assert sum(not unmentioned_attributes(row["prompt"][prefix:], row["completion"]) for row in kept) > 0.99 * len(kept)


def test_a_description_that_adds_a_fact_its_mr_does_not_give_is_counted():
    """added_attributes: a kind of fact the MR leaves out but the text mentions (the policy's "Its
    customer rating is average." after the task model would have stopped), once the MR's own places
    are taken out ("Café Sicilia" is a near place, not an eatType); made_up is the share of such texts."""
    from model.tasks.e2e import added_attributes
    from model.tasks.task_eval import task_scores

    mr = "name[Cocum], eatType[pub], customer rating[high], near[Café Sicilia]"
    stopped = "Cocum is a pub near Café Sicilia. It has a high customer rating."
    ran_on = stopped[:-1] + " and is located in the city centre. It is family friendly and cheap."
    assert added_attributes(mr, stopped) == []
    assert added_attributes(mr, ran_on) == ["priceRange", "area", "familyFriendly"]
    assert added_attributes("name[Aromi], area[riverside]", "Aromi is near the river. It serves Italian food.") == ["food", "near"]
    record = E2ERecord(mr, (stopped,))
    assert task_scores([stopped], [record])["made_up"] == 0.0 and task_scores([ran_on], [record])["made_up"] == 1.0


def test_closeness_to_the_task_model_counts_identical_descriptions():
    from model.tasks.task_eval import closeness

    full = ["Aromi is a coffee shop near the river.", "Zizzi is a cheap pub in the city centre."]
    assert closeness(full, full) == {"bleu": pytest.approx(100.0), "same_share": 1.0}
    half = closeness([full[0], "Zizzi is a pub."], full)
    assert half["same_share"] == 0.5 and 20 < half["bleu"] < 90


def test_the_near_place_counts_only_word_for_word_and_only_where_the_mr_names_one():
    from model.tasks.task_eval import names_near_place, near_named_share

    mrs = ["name[Aromi], near[All Bar One]", "name[Zizzi], near[Café Rouge]", "name[Cotto], food[French]"]
    texts = ["Aromi is near All Bar One.", "Zizzi is near Café.", "Cotto serves French food near All Bar One."]
    assert [names_near_place(mr, text) for mr, text in zip(mrs, texts)] == [True, False, None]
    assert near_named_share(mrs, texts) == 0.5 and near_named_share(mrs[2:], texts[2:]) == 0.0


def test_eval_task_arms_run_each_policy_and_the_policy_free_arms_only_when_asked(tiny_task_adapters, monkeypatch):
    """quality_arms on a tiny task model: the task model, its 3x policy and (when asked) the task
    model skipping without a policy; the 3x arm's closeness is measured against the 1x outputs."""
    import model.tasks.task_report as task_report

    root, loader = tiny_task_adapters
    monkeypatch.setattr(task_report, "load_task_model",
                        lambda task, speedup=None, *, policy="auto", **_: loader(task, None if policy == "auto" else policy))
    records = reported_records()[:2]
    labels = {}
    for policy_free in (True, False):
        config = task_report.TaskEvalConfig(speedups=(3.0,), baselines=False, policy_free_arms=policy_free,
                                            adapters=str(root), device="cpu", batch_size=2)
        arms = task_report.quality_arms(config, records)
        labels[policy_free] = [arm.label for arm in arms]
    assert labels[True] == ["task model (1x)", "no policy 3x", "per-speedup policy 3x"]
    assert labels[False] == ["task model (1x)", "per-speedup policy 3x"]
    report = task_report.add_closeness({"arms": [{"label": a.label} for a in arms]}, {a.label: a.outputs for a in arms})
    assert report["arms"][0]["vs_task_model"]["same_share"] == 1.0 and arms[0].shares["bleu"] in (1.0, None)


def test_relexicalise_rewrites_eat_type_and_food_with_articles_and_names_kept():
    from model.tasks.e2e import relexicalise

    record = E2ERecord("name[Café Sicilia], eatType[coffee shop], food[English], near[Rainbow Vegetarian Café]", (
        "Café Sicilia is an English coffee shop near Rainbow Vegetarian Café.",
        "English food is served at the coffee shops of Café Sicilia.",
        "Café Sicilia is a café serving English food.",           # a café: the eatType worded otherwise
        "Café Sicilia, a coffee shop, serves British food.",       # the food worded otherwise
    ))
    copy = relexicalise(record, "pub", "Italian")
    assert copy.mr == "name[Café Sicilia], eatType[pub], food[Italian], near[Rainbow Vegetarian Café]"
    assert copy.references == ("Café Sicilia is an Italian pub near Rainbow Vegetarian Café.",
                               "Italian food is served at the pubs of Café Sicilia.")
    fast = relexicalise(record, "restaurant", "Fast food")
    assert fast.references == ("Café Sicilia is a fast food restaurant near Rainbow Vegetarian Café.",
                               "Fast food is served at the restaurants of Café Sicilia.")
    spaced = relexicalise(E2ERecord("name[X],  eatType[ coffee shop ], food[English]", ("X is a coffee shop.",)), "pub", None)
    assert spaced.mr == "name[X], eatType[pub], food[English]" and spaced.references == ("X is a pub.",)
    assert relexicalise(record, None, "French").references[0] == "Café Sicilia is a French coffee shop near Rainbow Vegetarian Café."
    assert relexicalise(E2ERecord(record.mr, record.references[2:3]), "pub", None) is None
    with pytest.raises(ValueError, match="no eatType"):
        relexicalise(E2ERecord("name[X], food[English]", ("X serves English food.",)), "pub", None)


def test_relexicalised_copies_are_new_mrs_with_the_test_sets_values_and_enter_training(tmp_path):
    from model.tasks.e2e import relexicalised_records

    train, held = dev_split()
    copies = relexicalised_records(train, 2, seed=0)
    assert len(copies) > len(train) and copies == relexicalised_records(train, 2, seed=0)
    known = {normalise_mr(r.mr) for r in (*train, *held, *reported_records())}
    assert len({normalise_mr(r.mr) for r in copies}) == len(copies) and not {normalise_mr(r.mr) for r in copies} & known
    values = {(k, v) for r in copies for k, v in parse_mr(r.mr).items()}
    assert {("eatType", "pub"), ("eatType", "restaurant"), ("food", "Japanese"), ("food", "Fast food")} <= values
    for record in copies:
        pairs = parse_mr(record.mr)
        for reference in record.references:
            text = reference.lower()
            if "eatType" in pairs:
                assert pairs["eatType"] in text and "coffee shop" not in text
            if "food" in pairs:
                assert ("fast food" if pairs["food"] == "Fast food" else pairs["food"].lower()) in text
    path = write_training_file(tmp_path / "train.jsonl", relexicalised=2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == len(training_rows(train)) + sum(len(r.references) for r in copies)
    with pytest.raises(ValueError, match="in \\[0, 20\\]"):
        relexicalised_records(train, 21)
    assert TaskRun(policy="task", relexicalised=2).folder.name == "e2e-task-relex2"
    with pytest.raises(ValueError, match="needs --targets references"):
        TaskRun(policy="3", targets="task-model", relexicalised=2)


def test_delexicalised_places_swap_unknown_places_for_known_ones_and_back():
    from model.tasks.e2e import SURROGATE_PLACES, delexicalise_places, place_names, restore_places

    known = place_names(dev_split()[0])
    assert all(place in known for places in SURROGATE_PLACES.values() for place in places)
    swap = delexicalise_places("name[The Vaults], eatType[pub], near[Rainbow Vegetarian Café]", known)
    assert swap.mr == "name[The Eagle], eatType[pub], near[Aromi]"
    assert restore_places("The Eagle is a pub near Aromi. Try the Eagle.", swap.swaps) == \
        "The Vaults is a pub near Rainbow Vegetarian Café. Try the Vaults."
    assert delexicalise_places("name[The Eagle], near[The Sorrento]", known).swaps == ()  # known places stay
    # a surrogate is never a place the MR already names: here The Eagle is the (known) near place
    swap = delexicalise_places("name[The Mill Pond], near[The Eagle]", known)
    assert swap.mr == "name[The Punter], near[The Eagle]" and swap.swaps == (("The Punter", "The Mill Pond"),)
    assert restore_places("The Punter is near The Eagle.", swap.swaps) == "The Mill Pond is near The Eagle."
    assert restore_places("Aromiana is a pub.", (("Aromi", "Zizzi"),)) == "Aromiana is a pub."  # whole words only
    # a surrogate never shares a word with a place the MR names, and writing back is one pass: a place
    # written back is never searched again
    swap = delexicalise_places("name[The Punter's Rest], near[The Vaults]", known)
    assert swap.mr == "name[The Eagle], near[The Phoenix]"
    assert restore_places("The Eagle is near the Phoenix.", swap.swaps) == "The Punter's Rest is near the Vaults."
    swap = delexicalise_places("name[Cotto Lounge], near[Zizzi]", known)
    assert restore_places("Aromi is near Wildwood.", swap.swaps) == "Cotto Lounge is near Zizzi."
    assert restore_places("Aromi is near Wildwood.", (("Aromi", "Wildwood"), ("Wildwood", "Aromi"))) == \
        "Wildwood is near Aromi."
    # no surrogate fits: the place stays as written (no error)
    swap = delexicalise_places("name[The Eagle], near[The Punter]", set())
    assert swap.swaps == (("The Phoenix", "The Eagle"),) and swap.mr == "name[The Phoenix], near[The Punter]"
    # the MR as written is kept, character for character
    swap = delexicalise_places("name[The Vaults],eatType[pub]", known)
    assert swap.mr == "name[The Eagle], eatType[pub]" and swap.as_written == "name[The Vaults],eatType[pub]"


def test_describe_prompts_the_delexicalised_mr_and_writes_the_place_back():
    from types import SimpleNamespace

    from model.generation.schedules import ScheduleRequest
    from model.tasks.e2e import place_names
    from model.tasks.task_eval import describe

    class EchoNames:  # the real model's job is elsewhere: this checks what describe sends and returns
        prompts: list[str] = []

        def generate(self, request):
            self.prompts += list(request.prompts)
            texts = [f" {parse_mr(prompt.rsplit(': ', 1)[1])['name']} is near it." for prompt in request.prompts]
            return SimpleNamespace(outputs=texts, layers_per_step=[30] * len(texts))

    known = place_names(dev_split()[0])
    generator = EchoNames()
    mrs = ["name[Loch Fyne], food[French]", "name[Aromi], food[French]"]
    run = describe(generator, mrs, ScheduleRequest(), 8, known_places=known)
    assert run.outputs == ["Loch Fyne is near it.", "Aromi is near it."]
    assert "name[Loch Fyne]" not in generator.prompts[0] and "name[Aromi]" in generator.prompts[0]
    generator.prompts.clear()
    assert describe(generator, mrs, ScheduleRequest(), 8).outputs == run.outputs
    assert "name[Loch Fyne]" in generator.prompts[0]


def test_a_delexicalised_report_says_so_and_is_its_own_file(tiny_task_adapters, monkeypatch, tmp_path):
    import model.tasks.task_report as task_report

    root, loader = tiny_task_adapters
    monkeypatch.setattr(task_report, "load_task_model",
                        lambda task, speedup=None, *, policy="auto", **_: loader(task, None if policy == "auto" else policy))
    records = [*reported_records()[:1], E2ERecord("name[Loch Fyne], food[French]", ("Loch Fyne serves French food.",))]
    monkeypatch.setattr(task_report, "reported_records", lambda: records)
    given = []
    real_describe = task_report.describe
    monkeypatch.setattr(task_report, "describe", lambda generator, mrs, *args: given.append(args[-1]) or
                        real_describe(generator, mrs, *args))
    config = task_report.TaskEvalConfig(speedups=(3.0,), baselines=False, policy_free_arms=False, speed_mrs=0,
                                        adapters=str(root), device="cpu", batch_size=2, output=str(tmp_path),
                                        delexicalised_places=True)
    report = task_report.run_task_eval(config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e2e-delexicalised-outputs.jsonl", "e2e-delexicalised.json",
                                                          "e2e-delexicalised.md"]
    assert "Places delexicalised" in (tmp_path / "e2e-delexicalised.md").read_text()
    assert given and all(known is not None and "Loch Fyne" not in known and "Aromi" in known for known in given)
    assert "Places delexicalised" not in task_report.report_markdown({**report, "config": {**report["config"],
                                                                                           "delexicalised_places": False}})


def test_a_distillation_file_made_on_another_device_is_adopted_only_from_the_same_source(tmp_path):
    """--targets-file: a GPU's pass over the same task weights, MRs and seed is copied into the run
    (the record kept as written, so the run says where its targets came from); another task model,
    another MR count, a missing record or a test MR in the rows is refused."""
    from dataclasses import asdict

    from model.tasks.task_distill import DistillSource, adopt_distillation_file

    here = DistillSource(task_adapter="/here/task", training_mrs=2, synthetic_mrs=0, seed=0, device="cpu",
                         task_weights="abc")
    made = tmp_path / "gpu" / "distilled.jsonl"
    made.parent.mkdir()
    rows = [{"prompt": task_prompt(r.mr), "completion": r.references[0]} for r in dev_split()[0][:2]]
    made.write_text("".join(json.dumps(row) + "\n" for row in rows))
    record = {**asdict(here), "task_adapter": "/gpu/machine/task", "device": "cuda"}
    made.with_suffix(".source.json").write_text(json.dumps(record))

    run_file = adopt_distillation_file(made, tmp_path / "run" / "distilled.jsonl", here)
    assert run_file.read_text() == made.read_text()
    assert json.loads(run_file.with_suffix(".source.json").read_text())["device"] == "cuda"
    assert adopt_distillation_file(run_file, run_file, here) == run_file  # a resumed run adopts its own copy

    for field, value in (("task_weights", "another"), ("synthetic_mrs", 5), ("seed", 1)):
        with pytest.raises(ValueError, match=f"{field} differ"):
            adopt_distillation_file(made, tmp_path / "other" / "distilled.jsonl", DistillSource(**{**asdict(here), field: value}))
    with pytest.raises(ValueError, match="needs the file"):
        adopt_distillation_file(tmp_path / "nowhere.jsonl", tmp_path / "x.jsonl", here)
    test_mr = reported_records()[0].mr
    made.write_text(made.read_text() + json.dumps({"prompt": task_prompt(test_mr), "completion": "x"}) + "\n")
    with pytest.raises(ValueError, match="test-set MRs"):
        adopt_distillation_file(made, tmp_path / "leak" / "distilled.jsonl", here)
    with pytest.raises(ValueError, match="needs --targets task-model"):
        TaskRun(policy="3", targets_file=str(made))
