"""Distillation data at scale (model/training/make_data.py) and the quality measures a user cares about
(judged fluency, repetition, fact retention in model/evaluation/evaluation.py)."""

import json
import math
import random

import pytest
import torch

from model.evaluation.evaluation import (
    EvalConfig,
    answer_token_span,
    answers_right,
    evaluate,
    facts_by_position,
    facts_recalled,
    read_facts,
    repetition_rate,
)
from model.training.data import DEFAULT_EVAL_PROMPTS, DEFAULT_FACTS, DEFAULT_TRAIN_PROMPTS, load_sequences, read_jsonl
from model.training.make_data import (
    TEMPLATES_FILE,
    TOPICS_FILE,
    MakeDataConfig,
    PromptRecord,
    build_prompt_list,
    good_user_turn,
    held_out_keys,
    make_data,
    normalized,
    read_lines,
)

# --- the committed lists and the held-out rule ------------------------------------------------


def test_fact_set_is_large_well_formed_and_unique():
    facts = read_facts(DEFAULT_FACTS)
    assert len(facts) >= 150
    assert len({normalized(f.question) for f in facts}) == len(facts)
    for fact in facts:  # an answer inside its own question would be "retained" by an echo
        assert not answers_right(fact.question, fact.answers), fact.question


def test_no_training_prompt_is_a_held_out_prompt():
    """Eval prompts and fact questions are never trained on: not in train.jsonl, not a template x topic."""
    held_out = held_out_keys()
    assert len(held_out) >= 64 + 150
    assert not held_out & {normalized(r["prompt"]) for r in read_jsonl(DEFAULT_TRAIN_PROMPTS)}
    templates, topics = read_lines(TEMPLATES_FILE), read_lines(TOPICS_FILE)
    assert len(templates) >= 60 and len(topics) >= 300
    assert all(t.count("{topic}") == 1 for t in templates)
    combos = {normalized(t.replace("{topic}", p)) for t in templates for p in topics}
    assert not held_out & combos


def test_prompt_list_drops_duplicates_and_held_out_prompts_and_mixes_sources(monkeypatch):
    eval_prompt = read_jsonl(DEFAULT_EVAL_PROMPTS)[0]["prompt"]
    fact = read_facts(DEFAULT_FACTS)[0].question
    monkeypatch.setattr("model.training.make_data.template_prompts", lambda n, rng: [f"Explain topic {i}." for i in range(n)])
    monkeypatch.setattr("model.training.make_data.wordnet_prompts", lambda n, rng: [])
    monkeypatch.setattr("model.training.make_data.pydoc_prompts", lambda n, rng: [f"Raw passage number {i}" for i in range(n)])
    magpie = ["How do I bake bread?", "how do I bake BREAD", eval_prompt.upper(), fact, "Tell me a joke."]
    records = build_prompt_list(MakeDataConfig(template_prompts=40, pydoc_prompts=20), magpie)
    keys = [normalized(r.prompt) for r in records]
    assert len(keys) == len(set(keys)) == 2 + 40 + 20
    assert normalized(eval_prompt) not in keys and normalized(fact) not in keys
    assert [r.id for r in records] == list(range(len(records)))
    first_half = {r.source for r in records[: len(records) // 2]}
    assert first_half == {"magpie", "templates", "pydoc"}  # a prefix is a mixed subset
    assert all(r.raw == (r.source == "pydoc") for r in records)


def test_entity_questions_come_from_wordnet_instances_and_never_touch_a_held_out_fact(tmp_path, monkeypatch):
    from model.training import make_data as md

    # data.noun lines: offset, lexicographer file, n, word count (hex), words with lex ids, pointers, gloss
    lines = ["  1 This software and database is being provided (licence header)",
             "09145655 15 n 01 Odessa 1 002 @i 08524735 n 0000 | a city in western Texas",
             "10854397 18 n 02 Boehme 0 Jakob_Boehme 0 001 @i 10343554 n 0000 | German mystic",
             "11111111 15 n 01 Paris 0 001 @i 08524735 n 0000 | the capital of France",  # a held-out answer
             "22222222 17 n 01 Danube 0 001 @i 09411430 n 0000 | a river",  # named in a held-out question?
             "33333333 15 n 01 sierra 0 001 @i 09411430 n 0000 | lower case: not a name",
             "44444444 06 n 01 Big_Ben 0 001 @i 03014705 n 0000 | a bell",
             "55555555 18 n 01 Nobody 0 002 @ 10343554 n 0000 | no instance pointer"]
    (tmp_path / "data.noun").write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(md, "WORDNET_DIR", tmp_path)
    assert md.wordnet_instances() == sorted([("15", "Odessa"), ("18", "Jakob Boehme"), ("15", "Paris"),
                                             ("17", "Danube"), ("06", "Big Ben")])
    terms = md.held_out_fact_terms()
    questions = md.entity_prompts(100, random.Random(0))
    assert not any("Paris" in q for q in questions)  # an accepted answer of a held-out fact
    held_out_named = [name for _, name in md.wordnet_instances() if md.names_held_out_fact(f"Where is {name}?", name, terms)]
    assert "Paris" in held_out_named and "Odessa" not in held_out_named
    assert all(not any(name in q for name in held_out_named) for q in questions)
    by_name = {name: [q for q in questions if name in q] for name in ("Odessa", "Jakob Boehme", "Big Ben")}
    assert set(by_name["Odessa"]) == {t.format(x="Odessa") for t in md.ENTITY_QUESTIONS["15"]}  # every template, once
    assert set(by_name["Jakob Boehme"]) == {t.format(x="Jakob Boehme") for t in md.ENTITY_QUESTIONS["18"]}
    assert set(by_name["Big Ben"]) == {t.format(x="Big Ben") for t in md.ENTITY_QUESTIONS["other"]}
    assert len(questions) == len(set(questions)) and all(q.endswith("?") for q in questions)
    assert len(md.entity_prompts(3, random.Random(0))) == 3 and md.entity_prompts(0, random.Random(0)) == []
    assert not held_out_keys() & {normalized(q) for q in questions}


@pytest.mark.parametrize("text, good", [
    ("How do I keep basil alive on a windowsill?", True),
    ("Hi", False),
    ("<|im_start|>assistant hello there friend", False),
    ("12345 67890 !!!! ???? ....", False),
    (" ".join(["word"] * 80), False),
])
def test_user_turn_filter(text, good):
    assert good_user_turn(text) is good


# --- the command on a tiny model --------------------------------------------------------------


@pytest.mark.slow
def test_make_data_writes_unique_sequences_and_resumes(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setattr("model.training.make_data.pydoc_prompts",
                        lambda n, rng: [f"The module number {i} reads files and" for i in range(n)])
    common = dict(output_dir=str(tmp_path / "data"), model=str(tiny_folder), sources=("magpie", "templates", "pydoc"),
                  magpie_turns=6, template_prompts=10, pydoc_prompts=4, samples=1, max_new_tokens=6,
                  batch_size=4, weights="float")
    first = make_data(MakeDataConfig(**common, limit_prompts=8))
    assert first.prompts_done == 8 and 8 <= first.sequences <= 16
    lines = (tmp_path / "data" / "sequences.jsonl").read_text().splitlines()
    again = make_data(MakeDataConfig(**common))  # resumes: the first 8 prompts are not redone
    assert (tmp_path / "data" / "sequences.jsonl").read_text().splitlines()[: len(lines)] == lines
    assert again.prompts_done == again.prompts and again.sequences > first.sequences
    records = [json.loads(line) for line in (tmp_path / "data" / "sequences.jsonl").read_text().splitlines()]
    assert len(records) == again.sequences
    assert len({(tuple(r["prompt"]), tuple(r["target"])) for r in records}) == len(records)
    assert {r["kind"] for r in records} == {"greedy", "sampled0"}
    prompts = [PromptRecord(**json.loads(line)) for line in (tmp_path / "data" / "prompts.jsonl").read_text().splitlines()]
    # a random tiny model rarely ends a sampled user turn with EOS: Magpie may keep none (and stops trying)
    assert {"templates", "pydoc"} <= {p.source for p in prompts} <= {"magpie", "templates", "pydoc"}
    assert len(load_sequences(tmp_path / "data", limit=5)) == 5


def test_on_policy_data_is_written_by_skipdecode_on_the_same_prompts_and_mixes_in(tiny_folder, tmp_path, monkeypatch):
    monkeypatch.setattr("model.training.make_data.pydoc_prompts",
                        lambda n, rng: [f"The module number {i} reads files and" for i in range(n)])
    common = dict(model=str(tiny_folder), sources=("templates", "pydoc"), template_prompts=8, pydoc_prompts=4,
                  samples=0, max_new_tokens=8, batch_size=4, weights="float")
    make_data(MakeDataConfig(output_dir=str(tmp_path / "full"), **common))
    with pytest.raises(ValueError, match="needs the skip policy"):  # the tiny model has no adapter of its own
        make_data(MakeDataConfig(output_dir=str(tmp_path / "none"), writer="skipdecode", **common))
    adapter = _tiny_lora_adapter(tiny_folder, tmp_path / "adapter")
    make_data(MakeDataConfig(output_dir=str(tmp_path / "onpolicy"), writer="skipdecode", writer_speedups=(2.0,),
                             prompts_from=str(tmp_path / "full"), adapter=str(adapter), **common))
    assert (tmp_path / "onpolicy" / "prompts.jsonl").read_text() == (tmp_path / "full" / "prompts.jsonl").read_text()

    def by_prompt(folder):
        lines = (tmp_path / folder / "sequences.jsonl").read_text().splitlines()
        return {r["prompt_id"]: r for r in map(json.loads, lines)}

    full, onpolicy = by_prompt("full"), by_prompt("onpolicy")
    assert {r["kind"] for r in onpolicy.values()} == {"skip2x-greedy"}
    shared = full.keys() & onpolicy.keys()
    assert all(full[i]["prompt"] == onpolicy[i]["prompt"] for i in shared)
    assert any(full[i]["target"] != onpolicy[i]["target"] for i in shared)  # 2 of 4 layers: its own text
    mixed = load_sequences(f"{tmp_path / 'full'},{tmp_path / 'onpolicy'}", limit=4)
    first_full, first_onpolicy = [json.loads((tmp_path / f / "sequences.jsonl").read_text().splitlines()[0])
                                  for f in ("full", "onpolicy")]
    assert [mixed[0].target, mixed[1].target] == [first_full["target"], first_onpolicy["target"]]


def _tiny_lora_adapter(model_folder, folder):
    import transformers as tf
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)
    wrapped = get_peft_model(tf.AutoModelForCausalLM.from_pretrained(model_folder),
                             LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    with torch.no_grad():
        for name, parameter in wrapped.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.05)
    wrapped.save_pretrained(folder)
    return folder


def test_bad_writer_settings_are_rejected():
    with pytest.raises(ValueError, match="writer"):
        MakeDataConfig(writer="student")
    with pytest.raises(ValueError, match="writer_speedups"):
        MakeDataConfig(writer="skipdecode", writer_speedups=(0.5,))


# --- the quality measures ---------------------------------------------------------------------


def test_repetition_rate_counts_repeated_word_4grams():
    assert repetition_rate(["the cat sat on the mat today"]) == 0.0
    looping = "energy and energy to produce energy and energy to produce energy and energy"
    assert repetition_rate([looping]) >= 0.5
    assert repetition_rate(["a b c d a b c d"]) == pytest.approx(1 / 5)
    assert repetition_rate(["too short"]) == 0.0


@pytest.mark.parametrize("reply, answers, right", [
    ("The capital of France is Paris.", ("Paris",), True),
    ("It is twelve.", ("12", "twelve"), True),
    ("Parisian food is great", ("Paris",), False),  # a whole word, not a prefix
    ("Water is H2O!", ("h2o",), True),
    ("I do not know.", ("Vienna",), False),
])
def test_answers_are_matched_as_whole_words(reply, answers, right):
    assert answers_right(reply, answers) is right


@pytest.mark.slow
def test_eval_reports_judged_fluency_repetition_and_fact_retention(tiny_folder, tmp_path):
    """At 1x SkipDecode IS the full model: judged ratio 1, same repetition, every right answer kept."""
    from model.generation.generator import TextGenerator
    from model.generation.runs import GenerationRequest
    from model.generation.schedules import ScheduleRequest
    from model.loading import load_model

    questions = ["Name a colour.", "Which animal barks?", "Say a number."]
    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    replies = generator.generate(GenerationRequest(prompts=tuple(questions), schedule=ScheduleRequest(full=True),
                                                   max_new_tokens=8)).outputs
    facts = tmp_path / "facts.jsonl"  # accepted answer = a word the full model says: it is "right" on all
    facts.write_text("".join(json.dumps({"question": q, "answers": [r.split()[0]]}) + "\n"
                             for q, r in zip(questions, replies) if r.split()))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(4)))
    report = evaluate(EvalConfig(model=str(tiny_folder), adapter=None, prompts=str(prompts), continuation_tokens=8,
                                 speedups=(1.0, 2.0), batch_size=4, device="cpu", facts=str(facts), fact_tokens=8),
                      progress=lambda line: None)
    full, skipping = report.rows
    assert report.facts == len(facts.read_text().splitlines()) and report.full_fact_accuracy == 1.0
    assert full.judged_ppl_ratio == pytest.approx(1.0, abs=1e-3)
    assert full.repetition == report.full_repetition and full.fact_retention == 1.0
    assert skipping.judged_ppl_ratio > 0 and 0.0 <= skipping.fact_retention <= 1.0
    assert "judged ppl ratio" in report.to_markdown()
    # Every answer is the reply's first word: it starts at token 1, predicted by the prompt's full-depth pass.
    layers = generator.num_layers
    assert [(f.tokens, f.answered, f.kept, f.layers) for f in full.facts_by_position] == [
        ("1-4", report.facts, report.facts, float(layers))]
    (first,) = skipping.facts_by_position
    assert first.answered == report.facts and first.kept == round(skipping.fact_retention * report.facts)
    assert first.layers < layers  # tokens 2-4 come from skipping steps
    assert "Fact answers kept by the reply token" in report.to_markdown()
    # Teacher-forced on its own greedy replies the full model predicts every answer; each answer
    # the skipping row loses is counted once, as drift or at the answer.
    assert full.fact_recall == 1.0 and full.facts_lost_to_drift == full.facts_lost_at_answer == 0
    assert 0.0 <= skipping.fact_recall <= 1.0
    lost = report.facts - round(skipping.fact_retention * report.facts)
    assert skipping.facts_lost_to_drift + skipping.facts_lost_at_answer == lost
    assert "fact recall" in report.to_markdown() and "lost to drift" in report.to_markdown()


def test_answer_token_span_starts_at_the_token_where_the_answer_starts():
    def decode(tokens):  # one token = one word and its leading space
        return "".join(f" {t}" for t in tokens).strip()

    reply = ["The", "capital", "of", "Egypt", "is", "Cairo."]
    assert answer_token_span(decode, reply, ["Cairo"]) == (6, 6)
    assert answer_token_span(decode, reply, ["egypt", "Cairo"]) == (4, 4)  # the first accepted answer to appear
    assert answer_token_span(decode, reply, ["The"]) == (1, 1)
    assert answer_token_span(decode, reply, ["Alexandria"]) is None


def test_answer_token_span_reaches_the_answer_s_last_token():
    def decode(tokens):
        return "".join(f" {t}" for t in tokens).strip()

    reply = ["The", "largest", "is", "the", "blue", "whale", "."]
    assert answer_token_span(decode, reply, ["whale", "blue whale"]) == (5, 6)  # the longest match at the first start
    assert answer_token_span(decode, reply, ["whale"]) == (6, 6)
    assert answer_token_span(decode, reply, ["shark"]) is None
    pieces = ["It", " is", " Wash", "ing", "ton", "."]  # an answer split over three tokens
    assert answer_token_span(lambda t: "".join(t), pieces, ["Washington"]) == (3, 5)


@pytest.mark.slow
def test_fact_recall_is_the_answer_predicted_teacher_forced_on_the_full_reply(tiny_folder):
    """The full model recalls the answers of its own greedy replies; an answer token it would not
    predict there is not recalled; and a reply is judged on its answer span alone."""
    from model.generation.generator import TextGenerator
    from model.loading import load_model
    from model.skipdecode.schedule import full_schedule
    from model.training.data import Example

    generator = TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None))
    ids, mask = generator.text.encode(["Name a colour.", "Which animal barks?"])
    result = generator.full_decoder.generate(ids, mask, full_schedule(generator.num_layers, 6), max_new_tokens=6)
    replies = [Example(prompt=ids[row][mask[row].bool()].tolist(), target=list(tokens[:6]))
               for row, tokens in enumerate(result.tokens)]
    assert all(len(r.target) == 6 for r in replies)
    loaded, schedule = generator.loaded, full_schedule(generator.num_layers, 6)

    def recall(examples, spans):
        return facts_recalled(loaded.model, None, examples, spans, schedule, 2, loaded.pad_token_id, "cpu")

    assert recall(replies, [(3, 4), (1, 6)]) == (True, True)
    wrong = (replies[0].target[3] + 1) % len(loaded.tokenizer)  # not the greedy token at reply token 4
    swapped = [Example(prompt=replies[0].prompt, target=replies[0].target[:3] + [wrong] + replies[0].target[4:]),
               replies[1]]
    assert recall(swapped, [(3, 4), (1, 6)]) == (False, True)
    assert recall(swapped, [(1, 3), None]) == (True, False)  # before the swap: still recalled; no span: False


def test_facts_by_position_splits_kept_answers_and_reads_the_layers_there():
    kept = [True, False, True, True, False]
    starts = [1, 3, 6, 12, 20]
    budgets = [30, 25, 23, 21, 19, 17, 15, 13, 11, 9, 8, 7, 6, 5, 4, 4, 4, 4, 4, 4]  # 20 reply tokens
    split = facts_by_position(kept, starts, budgets)
    assert [(f.tokens, f.answered, f.kept) for f in split] == [
        ("1-4", 2, 1), ("5-8", 1, 1), ("9-16", 1, 1), ("17-20", 1, 0)]
    assert split[0].layers == pytest.approx(24.8)  # (30 + 25 + 23 + 21) / 4, to one decimal
    assert split[3].layers == 4.0
    assert [f.tokens for f in facts_by_position([True], [2], budgets[:3])] == ["1-3"]  # short replies: spans cut


@pytest.mark.slow
def test_shape_study_spends_one_budget_on_each_shape_and_writes_its_table(tiny_folder, tmp_path):
    from model.studies.shape_study import ShapeConfig, run_shape_study

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(3)))
    config = ShapeConfig(speedups=(2.0,), floors=(1, 2, 3), decays=("linear", "constant"), tokens=6,
                         model=str(tiny_folder), prompts=str(prompts), facts="none", device="cpu",
                         output=str(tmp_path / "study"))
    study = run_shape_study(config, progress=lambda line: None)
    shapes = [(r["decay"], r["floor"]) for r in study["rows"]]
    assert shapes == [("linear", 1), ("linear", 2), ("constant", 1)]  # 3 layers per step cannot average 2 of 4
    for row in study["rows"]:  # tiny model: 4 layers, so 2x is 2 layers on average
        assert row["min_layers"] >= row["floor"] and 1.6 <= row["layer_speedup"] <= 2.5
        assert row["judged_ppl_ratio"] > 0 and row["repetition"] is not None
    assert study["rows"][-1]["max_layers"] == study["rows"][-1]["min_layers"]  # constant: flat
    table = (tmp_path / "study" / "shape.md").read_text()
    assert table.count("| 2x |") == 3 and json.loads((tmp_path / "study" / "shape.json").read_text())["rows"]


def test_shape_study_rejects_nonsense():
    from model.studies.shape_study import ShapeConfig

    for bad in (dict(speedups=(1.0,)), dict(floors=(0,)), dict(decays=())):
        with pytest.raises(ValueError):
            ShapeConfig(**bad)


# --- the data-scaling curve -------------------------------------------------------------------


def test_scaling_arms_train_the_shipped_recipe_and_report_from_their_logs(tmp_path):
    from model.studies.scaling_study import ScalingConfig, arm_config, run_scaling, scaling_markdown, write_scaling

    data = tmp_path / "data"
    data.mkdir()
    (data / "sequences.jsonl").write_text('{"prompt": [1], "target": [2, 3]}\n' * 50)
    config = ScalingConfig(sequences=str(data), sizes=(40, 400), steps=20, batch_size=4,
                           runs_dir=str(tmp_path / "runs"), output=str(tmp_path / "out"))
    arm = arm_config(config, 40)
    assert arm.max_sequences == 40 and arm.max_steps == 20 and not arm.resume
    assert arm.order == "ranked" and len(arm.ranking) == 30  # the shipped placement
    assert (arm.lora_rank, arm.lora_alpha) == (16, 32)  # the LoRA the committed curve was measured with
    on_gpu = arm_config(ScalingConfig(**{**config.__dict__, "device": "cuda"}), 40)
    # float32 on every device (no bf16 autocast on a GPU): arms trained anywhere share one curve
    assert (arm.device, arm.mixed_precision, on_gpu.device, on_gpu.mixed_precision) == ("cpu", "no", "cuda", "no")
    log = tmp_path / "runs" / "data40" / "train_log.jsonl"
    log.parent.mkdir(parents=True)
    scores = {k: {"agreement": a, "kl": 1 - a, "perplexity_ratio": 2.0} for k, a in (("1.5x", .6), ("2x", .5), ("3x", .4))}
    log.write_text(json.dumps({"step": 10, "loss": 1.0}) + "\n" + json.dumps({"step": 20, "heldout": scores}) + "\n")
    messages = []
    assert run_scaling(ScalingConfig(**{**config.__dict__, "sizes": (400,)}), messages.append) == []
    assert "has 50 sequences" in messages[0]  # an arm larger than the data is not run
    json_path, md_path = write_scaling(config, messages.append)
    (row,) = json.loads(json_path.read_text())["arms"]
    assert row["sequences"] == 40 and row["epochs"] == 2 and row["complete"]
    assert "| 40 | 20 | 2 | 20 | 0.600 | 0.500 | 0.400 |" in md_path.read_text()
    assert "| 20 | 0.500 (0.50) |" in md_path.read_text()  # the equal-steps curve
    assert scaling_markdown(json.loads(json_path.read_text())).startswith("Data-scaling curve")
    bigger = arm_config(ScalingConfig(**{**config.__dict__, "lora_rank": 64, "bridge_rank": 32}), 40)
    assert (bigger.lora_rank, bigger.lora_alpha, bigger.bridge_rank) == (64, 4 * arm.lora_alpha, 32)
    assert bigger.order == arm.order and bigger.ranking == arm.ranking  # one change at a time


def test_results_figure_shows_the_new_measures_only_when_measured():
    from model.evaluation.reporting import quality_figure

    row = dict(variant="adapter", layer_speedup=2.0, agreement=0.5, perplexity_ratio=6.0)
    old = quality_figure({"rows": [row]})
    assert [a.text for a in old.layout.annotations][:2] == ["next-token agreement with the full model",
                                                           "perplexity ratio, full model's text (lower is better)"]
    assert len(old.data) == 2
    new = quality_figure({"rows": [{**row, "judged_ppl_ratio": 3.7, "fact_retention": 0.77},
                                   {**row, "variant": "no adapter", "judged_ppl_ratio": 200.0, "fact_retention": 0.02}]})
    titles = [a.text for a in new.layout.annotations]
    assert "judged perplexity ratio, its own text (lower is better)" in titles and "fact answers kept" in titles
    assert len(new.data) == 8 and {t.name for t in new.data} == {"adapter", "no adapter"}
    assert sorted(t.y[0] for t in new.data if t.name == "no adapter")[-1] == 200.0


def test_trim_loop_cuts_a_target_where_it_starts_copying_itself():
    from model.training.data import trim_loop

    loop = [5, 6, 7, 8, 9] + [1, 2, 3] * 10
    # From the second cycle on every 4-gram was seen before; after 8 such tokens in a row the
    # target is cut before that stretch: the text and the loop's first two cycles stay.
    assert trim_loop(loop) == [5, 6, 7, 8, 9, 1, 2, 3, 1, 2, 3]
    assert trim_loop(list(range(40))) == list(range(40))
    once = [1, 2, 3, 4, 9, 1, 2, 3, 4, 10, 11, 12, 13]  # one repeated phrase is not a loop
    assert trim_loop(once) == once
    assert trim_loop([7] * 30) == [7] * 4  # looping from its first 4-gram: only that one stays


def test_training_can_trim_looping_targets_and_drops_what_is_left_empty(tmp_path):
    from model.training.training import TrainConfig, training_examples

    data = tmp_path / "data"
    data.mkdir()
    records = [{"prompt": [1, 2], "target": [5, 6, 7, 8, 9] + [1, 2, 3] * 10},
               {"prompt": [3], "target": list(range(20, 40))}]
    (data / "sequences.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plain, _ = training_examples(TrainConfig(sequences=str(data)), None, tmp_path, None)
    trimmed, _ = training_examples(TrainConfig(sequences=str(data), trim_loops=True), None, tmp_path, None)
    assert [len(e.target) for e in plain] == [35, 20]
    assert [e.target for e in trimmed] == [[5, 6, 7, 8, 9, 1, 2, 3, 1, 2, 3], list(range(20, 40))]


def _sequence_folder(path, count, first_token):
    path.mkdir()
    path.joinpath("sequences.jsonl").write_text("".join(
        json.dumps({"prompt": [first_token + i], "target": [first_token + i, 1, 2]}) + "\n" for i in range(count)))
    return path


def test_sequence_shares_set_each_folders_dose_whatever_its_size(tmp_path):
    """--sequence-shares: a small fact folder keeps its share of the batches beside a large
    general one (uniform sampling would give it 2%); the draw is deterministic per step."""
    import random

    from model.training.training import TrainConfig, draw_batch, examples_by_source, training_examples

    general = _sequence_folder(tmp_path / "general", 980, 1000)
    facts = _sequence_folder(tmp_path / "facts", 20, 5000)
    config = TrainConfig(sequences=f"{general},{facts}", sequence_shares=(0.7, 0.3))
    examples, _ = training_examples(config, None, tmp_path, None)
    assert [len(group) for group in examples_by_source(examples, 2)] == [980, 20]
    assert all((e.source == 1) == (e.prompt[0] >= 5000) for e in examples)
    by_source = examples_by_source(examples, 2)
    rows = [e for step in range(250) for e in draw_batch(examples, None, 8, random.Random(step), by_source, (0.7, 0.3))]
    fact_share = sum(e.source == 1 for e in rows) / len(rows)
    assert 0.25 < fact_share < 0.35, fact_share
    assert len({e.prompt[0] for e in rows if e.source == 1}) == 20  # every fact sequence is drawn
    uniform = [e for step in range(250) for e in draw_batch(examples, None, 8, random.Random(step))]
    assert sum(e.source == 1 for e in uniform) / len(uniform) < 0.06
    again = draw_batch(examples, None, 8, random.Random(3), by_source, (0.7, 0.3))
    assert again == draw_batch(examples, None, 8, random.Random(3), by_source, (0.7, 0.3))


@pytest.mark.parametrize("shares, extra, needle", [
    ((1.0,), {}, "one share per --sequences folder"),
    ((1.0, -0.5), {}, ">= 0 with a positive sum"),
    ((0.0, 0.0), {}, ">= 0 with a positive sum"),
    ((1.0, float("nan")), {}, ">= 0 with a positive sum"),
    ((0.5, 0.5), {"length_grouped": True}, "pick one"),
])
def test_bad_sequence_shares_are_rejected(shares, extra, needle):
    from model.training.training import TrainConfig

    with pytest.raises(ValueError, match=needle):
        TrainConfig(sequences="a,b", sequence_shares=shares, **extra)


def test_a_share_for_a_folder_with_nothing_left_is_an_error(tmp_path):
    from model.training.training import TrainConfig, shared_sources, training_examples

    general = _sequence_folder(tmp_path / "general", 10, 1000)
    facts = _sequence_folder(tmp_path / "facts", 10, 5000)
    config = TrainConfig(sequences=f"{general},{facts}", sequence_shares=(0.5, 0.5), max_sequences=1)
    with pytest.raises(ValueError, match="none of its sequences"):
        shared_sources(training_examples(config, None, tmp_path, None)[0], config)
    unshared = TrainConfig(sequences=f"{general},{facts}", sequence_shares=(1.0, 0.0), max_sequences=1)
    examples = training_examples(unshared, None, tmp_path, None)[0]
    assert len(examples) == 1
    assert [len(group) for group in shared_sources(examples, unshared)] == [1, 0]


def test_a_line_cut_by_a_kill_is_dropped_and_appends_start_clean(tmp_path):
    from model.training.make_data import _append_jsonl, _read_if_exists

    path = tmp_path / "sequences.jsonl"
    path.write_text('{"id": 1}\n{"id": 2}\n{"id": 3, "tar')
    assert [r["id"] for r in _read_if_exists(path)] == [1, 2]
    _append_jsonl(path, [{"id": 3}])
    assert path.read_text().splitlines() == ['{"id": 1}', '{"id": 2}', '{"id": 3}']


def _row_items(agree: list[tuple[int, int]], repeated: list[tuple[int, int]], kept: list[bool]):
    from model.evaluation.paired import RowItems

    return RowItems(teacher_forced=tuple((a, 0.5 * n, n) for a, n in agree),
                    judged=tuple((0.0, 1.0 * n, n) for _, n in agree),
                    repetition=tuple(repeated), facts_kept=tuple(kept))


def test_paired_comparison_separates_a_real_difference_from_noise():
    from model.evaluation.paired import compare_variants

    full = [(0.0, 0.5 * 40, 40)] * 30
    base = _row_items([(20, 40)] * 30, [(1, 40)] * 30, [True, False] * 20)
    same = compare_variants(full, base, base, 2.0, resamples=200)
    assert {c.measure for c in same} == {"agreement", "ppl_ratio", "judged_ppl_ratio", "repetition", "fact_retention"}
    assert all(c.difference == 0 and c.low == 0 and c.high == 0 and c.verdict == "no clear difference" for c in same)

    # better agreement on every prompt; more repetition on every prompt; facts: one more of 40
    other = _row_items([(30, 40)] * 30, [(6, 40)] * 30, [True, False] * 19 + [True, True])
    verdicts = {c.measure: c for c in compare_variants(full, base, other, 2.0, resamples=500)}
    assert verdicts["agreement"].verdict == "candidate better" and verdicts["agreement"].difference == 0.25
    assert verdicts["repetition"].verdict == "candidate worse" and verdicts["repetition"].low > 0.1
    assert verdicts["fact_retention"].verdict == "no clear difference"
    assert verdicts["fact_retention"].low == 0 < verdicts["fact_retention"].high  # drawn without that question: 0
    # fact recall is paired over the same questions as retention, when both variants measured it
    base.facts_recalled, other.facts_recalled = (True,) * 40, (False,) * 10 + (True,) * 30
    recall = {c.measure: c for c in compare_variants(full, base, other, 2.0, resamples=500)}["fact_recall"]
    assert recall.difference == -0.25 and recall.verdict == "candidate worse"
    # ratios against the full model's own NLL (0.5 a token): judged exp(1.0 - 0.5) for both
    assert verdicts["judged_ppl_ratio"].adapter == pytest.approx(math.exp(0.5), abs=1e-4)

    # a lower judged perplexity is the better one
    fluent = _row_items([(20, 40)] * 30, [(1, 40)] * 30, [True, False] * 20)
    fluent.judged = tuple((0.0, 0.6 * 40, 40) for _ in range(30))
    judged = {c.measure: c for c in compare_variants(full, base, fluent, 2.0, resamples=200)}["judged_ppl_ratio"]
    assert judged.verdict == "candidate better" and judged.difference < 0

    from model.evaluation.paired import ship_verdict
    assert ship_verdict(list(verdicts.values())) == "does not ship (clearly worse on repetition at 2x; " \
        "not clearly better on judged_ppl_ratio at 2x)"
    fine = [c for c in verdicts.values() if c.measure != "repetition"] + [judged]
    fine = [c for c in fine if not (c.measure == "judged_ppl_ratio" and c.verdict != "candidate better")]
    assert ship_verdict(fine).startswith("ships")
    assert ship_verdict([]) == "nothing compared"
    teacher_forced_only = [c for c in fine if c.measure != "judged_ppl_ratio"]  # eval --no-free-running
    assert ship_verdict(teacher_forced_only) == \
        "does not ship (not clearly better on judged_ppl_ratio at 2x (not measured))"

    with pytest.raises(ValueError, match="different item counts"):
        compare_variants(full, base, _row_items([(1, 4)] * 29, [(0, 4)] * 29, [True] * 40), 2.0, resamples=100)


@pytest.mark.slow
def test_eval_compares_a_candidate_adapter_in_pairs(tiny_folder, tmp_path):
    """The same adapter as its own candidate: every difference is exactly zero, and the pooled
    per-prompt counts give back the rows' own figures."""
    from model.training.training import TrainConfig, train

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(6)))
    train(TrainConfig(model=str(tiny_folder), output_dir=str(tmp_path / "run"), prompts=str(prompts), max_steps=2,
                      batch_size=2, continuation_tokens=6, fixed_speedup=2.0, warmup_layers=1, lora_rank=4,
                      lora_alpha=8, save_every=2, eval_every=0, device="cpu"))
    adapter = str(tmp_path / "run" / "adapter")
    report = evaluate(EvalConfig(model=str(tiny_folder), adapter=adapter, candidate=adapter, prompts=str(prompts),
                                 continuation_tokens=8, speedups=(1.0, 2.0), batch_size=4, device="cpu", facts=None,
                                 include_no_adapter=False, resamples=200), progress=lambda line: None)
    assert [r.variant for r in report.rows] == ["adapter", "adapter", "candidate", "candidate"]
    assert {c.measure for c in report.comparisons} == {"agreement", "ppl_ratio", "judged_ppl_ratio", "repetition"}
    assert all(c.target_speedup == 2.0 and c.difference == 0 and c.low == c.high == 0 for c in report.comparisons)
    row = report.rows[1]
    pooled = {c.measure: c.adapter for c in report.comparisons}
    assert pooled["agreement"] == pytest.approx(row.agreement, abs=1e-4)
    assert pooled["ppl_ratio"] == pytest.approx(row.perplexity_ratio, rel=1e-3)
    assert pooled["judged_ppl_ratio"] == pytest.approx(row.judged_ppl_ratio, rel=1e-3)
    assert pooled["repetition"] == pytest.approx(row.repetition, abs=1e-4)
    assert "paired over the same prompts" in report.to_markdown()
    with pytest.raises(ValueError, match="is not a folder with adapter_config.json"):
        evaluate(EvalConfig(model=str(tiny_folder), adapter=adapter, candidate=str(tmp_path), prompts=str(prompts),
                            speedups=(2.0,), device="cpu", facts=None), progress=lambda line: None)
    with pytest.raises(ValueError, match="give a trained adapter folder"):
        evaluate(EvalConfig(model=str(tiny_folder), adapter=adapter, candidate="none", prompts=str(prompts),
                            speedups=(2.0,), device="cpu", facts=None), progress=lambda line: None)
    with pytest.raises(ValueError, match="has none"):
        evaluate(EvalConfig(model=str(tiny_folder), adapter=None, candidate=adapter, prompts=str(prompts),
                            continuation_tokens=8, speedups=(2.0,), device="cpu", facts=None), progress=lambda line: None)

    # The same adapter under another schedule SHAPE: a floor of 3 of the 4 layers at the same budget.
    floor = evaluate(EvalConfig(model=str(tiny_folder), adapter=adapter, candidate_floor=3, prompts=str(prompts), warmup=0,
                                continuation_tokens=8, speedups=(1.3,), batch_size=4, device="cpu", facts=None,
                                include_no_adapter=False, resamples=200), progress=lambda line: None)
    base, shaped = floor.rows
    assert (base.variant, shaped.variant) == ("adapter", "candidate")
    assert base.min_layers < 3 == shaped.min_layers
    assert {c.measure for c in floor.comparisons} == {"agreement", "ppl_ratio", "judged_ppl_ratio", "repetition"}
    assert any(c.difference != 0 for c in floor.comparisons)  # another shape: other text
    assert "schedule floor 3 layers" in floor.to_markdown()
    common = dict(model=str(tiny_folder), adapter=adapter, prompts=str(prompts), device="cpu", facts=None)
    same = evaluate(EvalConfig(candidate_floor=1, warmup=0, speedups=(1.3,), continuation_tokens=8, batch_size=4,
                               include_no_adapter=False, resamples=200, **common), progress=lambda line: None)
    assert [r.variant for r in same.rows] == ["adapter"] and same.comparisons == []  # floor 1: the default shape
    assert same.floor_inactive == [1.3] and "Not measured at 1.3x" in same.to_markdown()
    with pytest.raises(ValueError, match="cannot reach 2x"):
        evaluate(EvalConfig(candidate_floor=3, speedups=(1.3, 2.0), **common), progress=lambda line: None)
    with pytest.raises(ValueError, match="ONE candidate"):
        evaluate(EvalConfig(candidate=adapter, candidate_floor=3, speedups=(1.3,), **common), progress=lambda line: None)
    with pytest.raises(ValueError, match="candidate_floor must be >= 1"):
        evaluate(EvalConfig(candidate_floor=0, speedups=(1.3,), **common), progress=lambda line: None)


def test_loop_masks_stop_the_kl_where_a_loop_starts_and_flag_its_repeats():
    from model.training.losses import loop_masks

    loop = [5, 6, 7, 8, 9] + [1, 2, 3] * 10  # loop_start 11 (trim_loop keeps 11 tokens)
    plain = list(range(20, 40))
    targets = torch.zeros(2, 35, dtype=torch.long)
    targets[0], targets[1, :20] = torch.tensor(loop), torch.tensor(plain)
    target_mask = torch.zeros(2, 35, dtype=torch.bool)
    target_mask[0], target_mask[1, :20] = True, True
    kl_mask, negatives = loop_masks(targets, target_mask)
    assert kl_mask[0].tolist() == [True] * 11 + [False] * 24
    assert negatives[0].tolist() == [False] * 11 + [True] * 24  # every token of the loop repeats a 4-gram
    assert kl_mask[1].tolist() == target_mask[1].tolist() and not negatives[1].any()


def test_unlikelihood_loss_is_minus_log_one_minus_p_and_pushes_p_down():
    from model.training.losses import unlikelihood_loss

    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]], requires_grad=True)  # (1, 2, 3)
    ids = torch.tensor([[9, 0, 1]])  # prompt of 1, targets 0 and 1
    negatives = torch.tensor([[False, True]])
    loss = unlikelihood_loss(logits, ids, negatives, prompt_len=1)
    p = torch.softmax(logits[0, 1].detach(), -1)[1]
    assert float(loss.detach()) == pytest.approx(-math.log(1 - float(p)), rel=1e-5)
    loss.backward()
    assert logits.grad[0, 1, 1] > 0 and float(logits.grad[0, 0].abs().sum()) == 0  # only the flagged position


def test_unlikelihood_needs_distillation_targets():
    from model.training.training import TrainConfig

    with pytest.raises(ValueError, match="unlikelihood must be >= 0"):
        TrainConfig(unlikelihood=-1.0)
    with pytest.raises(ValueError, match="leave out --data"):
        TrainConfig(unlikelihood=1.0, data="user.jsonl")
    with pytest.raises(ValueError, match="leave out --max-target-tokens"):
        TrainConfig(unlikelihood=1.0, max_target_tokens=32)


def _looping_model(tiny_folder, folder, cycle: list[int]):
    """The tiny model rewired so that its greedy text IS a loop: its layers add nothing (o_proj and
    down_proj zero) and token cycle[i] predicts cycle[i + 1] with a peaked head."""
    import shutil

    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(str(tiny_folder))
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.mul_(0.01)
        for i, token in enumerate(cycle):
            model.model.embed_tokens.weight[token] = torch.nn.functional.one_hot(torch.tensor(i), 32).float()
            model.lm_head.weight[cycle[(i + 1) % len(cycle)]] = 8.0 * torch.nn.functional.one_hot(torch.tensor(i), 32).float()
    model.save_pretrained(folder)
    for name in tiny_folder.iterdir():
        if "token" in name.name or name.name.endswith(".jinja"):
            shutil.copy(name, folder / name.name)
    return folder


@pytest.mark.slow
def test_unlikelihood_training_lowers_the_skipping_students_loop_tokens(tiny_folder, tmp_path):
    """A teacher whose greedy text loops: distilled by KL alone the skipping student keeps the loop
    tokens likely; with unlikelihood their probability falls by more than half."""
    from model.loading import gated_peft_copy, load_model
    from model.training.data import Example, collate, loop_start
    from model.training.losses import loop_masks
    from model.training.scoring import skip_policy_logits
    from model.training.training import TrainConfig, draw_schedule, train

    cycle = [1000, 2000, 3000, 4000, 5000]
    teacher = _looping_model(tiny_folder, tmp_path / "looping", cycle)
    examples = [Example(prompt=[cycle[i % 5], cycle[(i + 1) % 5]], target=[cycle[(i + k) % 5] for k in range(2, 32)])
                for i in range(5)]
    assert all(loop_start(e.target) == 8 for e in examples)  # two cycles of text, then the loop
    data = tmp_path / "data"
    data.mkdir()
    (data / "sequences.jsonl").write_text("".join(json.dumps({"prompt": e.prompt, "target": e.target}) + "\n"
                                                 for e in examples))
    ids, mask, target_mask, prompt_len = collate(examples, 0)
    _, negatives = loop_masks(ids[:, prompt_len:], target_mask)

    def loop_token_probability(weight: float) -> float:
        out = tmp_path / f"ul-{weight}"
        config = TrainConfig(model=str(teacher), output_dir=str(out), sequences=str(data), max_steps=30,
                             batch_size=4, learning_rate=3e-2, warmup_steps=2, fixed_speedup=2.0, warmup_layers=1,
                             lora_rank=8, lora_alpha=16, save_every=30, eval_every=0, device="cpu",
                             trim_loops=True, unlikelihood=weight)
        train(config)
        loaded = load_model(str(teacher), device="cpu", adapter=str(out / "adapter"))
        schedule = draw_schedule(4, target_mask.shape[1], config, random.Random(0))
        with torch.no_grad():
            logits = skip_policy_logits(gated_peft_copy(loaded), ids, mask, schedule, prompt_len)
        p = torch.softmax(logits.float(), -1).gather(-1, ids[:, prompt_len:].unsqueeze(-1)).squeeze(-1)
        return float(p[negatives].mean())

    kl_only, with_unlikelihood = loop_token_probability(0.0), loop_token_probability(1.0)
    assert kl_only > 0.5, kl_only  # distilled from a looping teacher, the student loops too
    assert with_unlikelihood < 0.5 * kl_only, (kl_only, with_unlikelihood)


def test_a_policys_measured_floor_is_the_default_shape_up_to_its_speedup(tiny_folder, tmp_path):
    """export-adapter --schedule-floor records the shape a paired comparison chose; generation and
    eval then run it (linear decay, up to its speedup), and nothing else changes."""
    from model.generation.generator import TextGenerator
    from model.generation.schedules import ScheduleRequest
    from model.loading import load_model
    from model.skipdecode.skip_policy import ScheduleFloor, export_adapter

    trained = _tiny_lora_adapter(tiny_folder, tmp_path / "trained")
    (trained / "training_info.json").write_text(json.dumps({"skip_policy": {"gated": True, "warmup": 0}}))
    export_adapter(trained, tmp_path / "shipped", schedule_floor=ScheduleFloor(3, 1.2))
    info = json.loads((tmp_path / "shipped" / "training_info.json").read_text())
    assert info["skip_policy"] == {"gated": True, "warmup": 0, "schedule_floor": {"layers": 3, "up_to_speedup": 1.2}}
    plain, floored = (TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=str(folder)))
                      for folder in (trained, tmp_path / "shipped"))

    def shape(generator, **request):
        solved = generator.schedules.schedule_for(ScheduleRequest(**request), 16)
        return solved.config.max_layers, solved.config.min_layers

    assert shape(plain, target_speedup=1.2)[1] < 3 <= shape(floored, target_speedup=1.2)[1]
    for request in (dict(target_speedup=2.0), dict(target_speedup=1.2, decay="step"),
                    dict(target_speedup=1.2, skip_policy=False)):
        assert shape(plain, **request) == shape(floored, **request), request  # above its speedup, other decays, no policy
    report = evaluate(EvalConfig(model=str(tiny_folder), adapter=str(tmp_path / "shipped"), prompts=str(_prompts(tmp_path)),
                                 continuation_tokens=8, speedups=(1.2,), batch_size=4, device="cpu", facts=None,
                                 include_no_adapter=False), progress=lambda line: None)
    assert report.schedule_floor == {"layers": 3, "up_to_speedup": 1.2} and report.rows[0].min_layers == 3
    assert "no step below 3 layers up to 1.2x" in report.to_markdown()
    for bad in (dict(layers=0, up_to_speedup=2.0), dict(layers=4, up_to_speedup=1.0)):
        with pytest.raises(ValueError):
            ScheduleFloor(**bad)


def _prompts(folder):
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"Tell me about thing {i}."}) + "\n" for i in range(4)))
    return path
