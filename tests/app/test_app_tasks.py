"""The paper's E2E task in the playground: settings, validation, links, the MR form, the Results
section (pure logic), and one E2E generation through the Playground handler on tiny task models."""

import dataclasses
import json
from pathlib import Path

import gradio as gr
import pytest

from app.handlers import page_error
from app.page.lessons import LESSONS, lesson_by_title, lesson_values
from app.page.results import (
    BELOW_DELEXICALISED_TITLE,
    EARLIER_FAMILY_TITLE,
    claim_sentence,
    claim_verdicts,
    e2e_markdown,
    e2e_note,
    load_e2e,
    plain_title,
)
from app.page.share import settings_from_query, share_link
from app.page.shown_text import as_markdown
from app.settings import Limits, PlaygroundSettings
from app.task_view import compose_into_prompt, header_markdown, input_feedback, switch_values, task_view
from app.tasks import FACTS_FILE, TASK_FIXED, check_input, examples, fixed_note, policy_line
from model.tasks.e2e import INSTRUCTION, added_attributes, parse_mr, unmentioned_attributes
from model.tasks.e2e_facts import check_facts
from model.tasks.task_models import task_schedule

MR = "name[The Eagle], food[French]"
DEFAULTS = {"prompt": "What is photosynthesis?", "warmup": 0, "order": "ranked"}


def test_a_task_is_a_setting_that_takes_the_schedule_prompt_and_sampling_its_policies_were_trained_on():
    settings = PlaygroundSettings.from_values(Limits(), prompt=MR, task="e2e", target_speedup=3.0, decay="cosine",
                                              warmup=5, temperature=1.0, batch_size=2)
    assert settings.schedule_request(num_layers=30) == task_schedule("e2e", 3.0, 30)  # decay, warmup not read
    assert settings.schedule_request(full=True, num_layers=30) == task_schedule("e2e", 3.0, 30, full=True)
    request = settings.request(full=False, num_layers=30)
    assert request.sampling.temperature == 0  # greedy, as the task is evaluated
    assert request.prompts[0] == INSTRUCTION + MR and request.prompts[1].startswith(INSTRUCTION)
    parse_mr(request.prompts[1][len(INSTRUCTION):])  # the batch's other rows are test-set MRs
    with pytest.raises(ValueError, match="number of layers"):
        settings.schedule_request()
    with pytest.raises(ValueError, match="task must be one of chat, e2e"):
        PlaygroundSettings.from_values(Limits(), prompt=MR, task="translate")
    chat = PlaygroundSettings.from_values(Limits(), prompt="Hi", decay="cosine")
    assert chat.task == "chat" and chat.schedule_request().decay == "cosine"  # chat unchanged
    assert PlaygroundSettings.api_names()[-1] == "task"  # the API's earlier parameters keep their places


def test_a_bad_mr_is_named_as_text_and_a_good_one_passes():
    check_input("e2e", MR)
    check_input("chat", "not an MR at all")  # chat takes any prompt
    with pytest.raises(ValueError) as error:
        check_input("e2e", "name[The Eagle], <b>red</b>")
    message = str(error.value)
    assert message.startswith("The MR has a problem: the MR is not a list")
    assert "<b>" not in page_error(error.value).message  # escaped where it is shown: the toast renders HTML
    with pytest.raises(ValueError, match="unknown MR attribute 'colour'"):
        check_input("e2e", "name[The Eagle], colour[red]")
    with pytest.raises(ValueError, match="needs a name"):
        check_input("e2e", "food[French]")
    shown = input_feedback("e2e", "name[The Eagle], <b>red</b>")  # under the prompt box, as typed
    assert shown["visible"] and "pairs near" in shown["value"] and "<b>" not in shown["value"]
    assert "&#60;b&#62;red&#60;&#47;b&#62;" in shown["value"]  # character references: text, never markup
    assert not input_feedback("e2e", MR)["visible"] and not input_feedback("chat", "anything")["visible"]


def test_a_link_carries_the_task_and_an_unknown_task_is_refused_escaped():
    link = share_link("http://h/", {"task": "e2e", "prompt": MR, "max_new_tokens": 96}, DEFAULTS, Limits())
    assert "task=e2e" in link
    values, problem = settings_from_query({"task": "e2e"}, Limits(), DEFAULTS)
    assert values == {"task": "e2e"} and problem == ""
    values, problem = settings_from_query({"task": "<img src=x onerror=alert(1)>"}, Limits(), DEFAULTS)
    assert values == {} and "task must be one of chat, e2e" in problem
    shown = as_markdown(problem)
    assert "<img" not in shown and "(1)" not in shown and "task must be one of chat" in shown


def test_the_task_switch_fixes_the_controls_and_fills_the_prompt_and_the_form_composes_an_mr():
    shown = task_view("e2e")
    assert all(update["visible"] is False for update in shown[:len(TASK_FIXED)])
    note, box, posts, chat_examples, title, prompt = shown[len(TASK_FIXED):]
    assert note["visible"] and "fixes the schedule" in note["value"] and box["visible"] and not posts["visible"]
    assert not chat_examples["visible"] and fixed_note("chat") == ""
    assert "E2E task model" in title["value"] and "MR" in prompt["label"]
    assert all(update["visible"] for update in task_view("chat")[:len(TASK_FIXED)])
    prompt, budget = switch_values("e2e", "What is photosynthesis?")
    assert prompt == examples()[0] and budget == 96
    prompt, _ = switch_values("e2e", MR)
    assert isinstance(prompt, type(gr.skip()))  # an MR already there stays
    prompt, budget = switch_values("chat", MR)
    assert prompt == "What is photosynthesis?" and budget == 48
    assert switch_values("e2e", MR, max_new_tokens=40)[1] == 40  # a deployer's lower limit holds
    values = ["The Eagle", "coffee shop", "", "cheap", "", "riverside", "yes", " Burger King "]
    assert compose_into_prompt(*values) == ("name[The Eagle], eatType[coffee shop], priceRange[cheap], "
                                            "area[riverside], familyFriendly[yes], near[Burger King]", "")
    kept, problem = compose_into_prompt("", "pub", "", "", "", "", "", "")
    assert isinstance(kept, type(gr.skip())) and "needs a name" in problem
    _, hostile = compose_into_prompt("A](http://evil.example)", "", "", "", "", "", "", "")  # quoted in the message
    assert "](" not in hostile and "http:" not in hostile  # the Markdown note shows it as text
    assert len(examples()) == 8 and all(parse_mr(mr) for mr in examples())


def test_the_header_names_the_model_the_task_runs():
    from types import SimpleNamespace

    def generator(name: str, layers: int, adapter: str | None = "assets/adapters/skip"):
        return SimpleNamespace(num_layers=layers, loaded=SimpleNamespace(name=name, device="cpu", quantize="int4",
                                                                         adapter_path=adapter))

    general = generator("SmolLM2-135M-Instruct", 30)
    chat = header_markdown(general)
    assert "**SmolLM2-135M-Instruct**, 30 layers, cpu, int4 weights" in chat and "the full model original" in chat
    e2e = header_markdown(general, "e2e")  # chosen, its model not loaded yet: the general model + the task's LoRA
    assert "**SmolLM2-135M-Instruct+e2e**, 30 layers, cpu ·" in e2e and "E2E task model" in e2e
    assert "the full model original" not in e2e and "int4" not in e2e  # its weights are chosen as it loads
    loaded = header_markdown(general, "e2e", generator("tiny+e2e", 12))  # once loaded: its own facts
    assert "**tiny+e2e**, 12 layers, cpu, int4 weights" in loaded and "E2E task model" in loaded
    assert header_markdown(general, "<b>x</b>") == chat  # a value the radio does not offer names nothing
    assert "no skip-policy adapter" in header_markdown(generator("m", 30, adapter=None))


def test_the_lesson_switches_to_the_task_at_3x_and_the_others_switch_back():
    lesson = lesson_by_title("The paper's task: 3x, the same description")
    values = lesson_values(lesson, DEFAULTS)
    assert values["task"] == "e2e" and values["target_speedup"] == 3.0 and values["max_new_tokens"] == 96
    check_input("e2e", values["prompt"])
    batch = lesson_by_title("The class as one batch")  # the class's lesson runs the same task, together
    assert lesson_values(batch, DEFAULTS)["task"] == "e2e"
    tldr = lesson_by_title("A long prompt: the TL;DR task at 3x")  # the paper's second task
    assert lesson_values(tldr, DEFAULTS)["task"] == "tldr"
    assert all(lesson_values(other, DEFAULTS)["task"] == "chat" for other in LESSONS
               if other not in (lesson, batch, tldr))
    assert "runs a third of its layers" in lesson.markdown()
    second = lesson_values(lesson, DEFAULTS, then=True)
    assert second["task"] == "e2e" and second["target_speedup"] == 3.0 and second["prompt"] != values["prompt"]
    check_input("e2e", second["prompt"])
    assert "Run an MR where 3x drops a fact" in lesson.markdown()


def _report(tmp_path, arms, speed=()):
    path = tmp_path / "e2e.json"
    path.write_text(json.dumps({"task": "e2e", "test_mrs": 630, "arms": arms, "speed": list(speed)}))
    return path


def _arm(label, policy, speedup, bleu_share, rouge_share):
    return {"label": label, "policy": policy, "speedup": speedup,
            "scores": {"bleu": 60 * bleu_share, "rouge_l": 65 * rouge_share, "nist": 8.0},
            "shares": {"bleu": bleu_share, "rouge_l": rouge_share, "nist": 1.0},
            "achieved_layer_speedup": speedup, "cost_model_speedup": speedup * 0.9}


def test_results_say_where_the_papers_claim_holds_computed_from_the_file(tmp_path):
    path = _report(tmp_path, [
        _arm("task model (1x)", "task model", 1.0, 1.0, 1.0),
        _arm("per-speedup policy 2x", "per-speedup", 2.0, 0.995, 0.998),
        _arm("shared policy 2x", "shared", 2.0, 0.985, 0.999),
        {**_arm("per-speedup policy 3x", "per-speedup", 3.0, 0.97, 0.98),
         "vs_task_model": {"bleu": 80.0, "same_share": 0.412}},
        _arm("per-speedup policy 5x", "per-speedup", 5.0, 0.96, 0.951),
        _arm("no policy 5x", "none", 5.0, 0.2, 0.4),
    ], speed=[{"speedup": 2.0, "batch_size": 8, "policy": "skip-2x", "weights": "float32", "decode_speedup": 1.71,
               "cost_model_bound": 1.9, "end_to_end_speedup": 1.5}])
    report = load_e2e(path)
    verdicts = {(policy, speedup): holds for policy, speedup, holds, _ in claim_verdicts(report)}
    assert verdicts == {("per-speedup", 2.0): True, ("shared", 2.0): False, ("per-speedup", 5.0): True}
    sentence = claim_sentence(report)
    assert "holds for the per-speedup policy at 2x" in sentence and "per-speedup policy at 5x" in sentence
    assert "does not hold for the shared policy at 2x (BLEU 0.985 < 0.99)" in sentence
    text = e2e_markdown(report)
    assert "| per-speedup policy 3x | per-speedup | 3x | 58.20 | 63.70 | 0.970 | 0.980 | 41.2% | 3.00x |" in text
    assert "| per-speedup policy 2x | per-speedup | 2x | 59.70 | 64.87 | 0.995 | 0.998 | n/a | 2.00x |" in text
    assert "| 2x | 8 | skip-2x | float32 | 1.71x | 1.90x | 1.50x |" in text
    assert text.index("paper claims") < text.index("| arm |")
    assert "0.970 of the task model's BLEU" in e2e_note(3.2, True, path)
    assert "no policy 5x" in e2e_note(5.0, False, path)


def test_a_no_swap_report_of_an_earlier_task_model_is_named_so_and_never_quoted_under_the_panes(tmp_path):
    """A new task model ships before every report is re-run: the no-swap report left from the
    earlier one is titled as such in Results, and the note under the panes does not quote it."""
    plain = {"task": "e2e", "test_mrs": 630, "policies": {"task": {"step": 120}}, "speed": [],
             "arms": [_arm("task model (1x)", "task model", 1.0, 1.0, 1.0), _arm("no policy 3x", "none", 3.0, 0.02, 0.3)]}
    delexicalised = {**plain, "policies": {"task": {"step": 240}},
                     "arms": [_arm("task model (1x)", "task model", 1.0, 1.0, 1.0),
                              _arm("per-speedup policy 3x", "per-speedup", 3.0, 0.993, 0.996)]}
    (tmp_path / "e2e.json").write_text(json.dumps(plain))
    (tmp_path / "e2e-delexicalised.json").write_text(json.dumps(delexicalised))
    assert plain_title(load_e2e(tmp_path / "e2e.json"), load_e2e(tmp_path / "e2e-delexicalised.json")) == EARLIER_FAMILY_TITLE
    assert "0.993 of the task model's BLEU" in e2e_note(3.0, True, tmp_path / "e2e.json")
    assert "no policy" not in e2e_note(3.0, False, tmp_path / "e2e.json")  # the earlier model's arm: not quoted
    same = {**plain, "policies": {"task": {"step": 240}}}
    assert plain_title(same, delexicalised) == BELOW_DELEXICALISED_TITLE
    assert plain_title({k: v for k, v in plain.items() if k != "policies"}, delexicalised) == BELOW_DELEXICALISED_TITLE


def test_results_without_a_file_say_not_evaluated_and_file_text_is_never_markup(tmp_path):
    assert load_e2e(tmp_path / "absent.json") is None
    assert "Not evaluated yet" in e2e_markdown(None)
    assert "not evaluated yet" in e2e_note(3.0, True, tmp_path / "absent.json")
    (tmp_path / "bad.json").write_text("{not json")
    assert load_e2e(tmp_path / "bad.json") is None
    path = _report(tmp_path, [_arm("<script>x</script> | *b*", "per-speedup", 2.0, 0.9, 0.9), {"speedup": "2"}])
    report = load_e2e(path)
    assert len(report["arms"]) == 1  # the malformed arm left out
    text = e2e_markdown(report)
    assert "<script>" not in text and "&lt;script&gt;" in text and "\\| \\*b\\*" in text
    assert "It holds for no arm here" in text and "BLEU 0.900, ROUGE-L 0.900 < 0.99" in text
    path = _report(tmp_path, [_arm("task model (1x)", "task model", 1.0, 1.0, 1.0)])
    assert "cannot be checked" in claim_sentence(load_e2e(path))


def test_the_playgrounds_own_delexicalised_figures_lead_and_the_note_quotes_them(tmp_path):
    from app.page.results import _cached_e2e, delexicalised_file, delexicalised_markdown

    plain = _report(tmp_path, [_arm("task model (1x)", "task model", 1.0, 1.0, 1.0),
                               _arm("per-speedup policy 2x", "per-speedup", 2.0, 0.94, 0.97),
                               _arm("no policy 2x", "none", 2.0, 0.05, 0.2)])
    assert delexicalised_file(plain) == tmp_path / "e2e-delexicalised.json" and delexicalised_file(tmp_path / "x.json") is None
    assert "0.940 of the task model's BLEU" in e2e_note(2.0, True, plain)  # no delexicalised run: the plain one
    delexicalised = tmp_path / "e2e-delexicalised.json"
    delexicalised.write_text(json.dumps({"arms": [_arm("task model (1x)", "task model", 1.0, 1.0, 1.0),
                                                  _arm("per-speedup policy 2x", "per-speedup", 2.0, 0.998, 1.001)],
                                         "test_mrs": 630}))
    _cached_e2e.cache_clear()  # the server reads each file once; this test writes one after
    note = e2e_note(2.0, True, plain)
    assert "0.998 of the task model's BLEU" in note and "delexicalised, as here" in note
    assert "no policy 2x" in e2e_note(2.0, False, plain) and "as here" not in e2e_note(2.0, False, plain)
    text = delexicalised_markdown(load_e2e(delexicalised))
    assert "holds for the per-speedup policy at 2x" in text and "On 630 test MRs" in text
    assert "| per-speedup policy 2x | per-speedup | 2x |" in text


@pytest.mark.slow
def test_one_e2e_generation_through_the_playground_handler(default_model, tiny_task_adapters):
    """The task choice switches both panes to the task's models: the full pane is the task model at
    full depth, the SkipDecode pane its 3x policy on the task's schedule; the models are cached."""
    from app.handlers import Playground
    from app.tasks import TaskGenerators
    from model.generation.generator import TextGenerator
    from model.generation.runs import GenerationRequest

    root, loader = tiny_task_adapters
    chat = TextGenerator(default_model)
    tasks = TaskGenerators(root=root, loader=loader)
    playground = Playground(lambda: chat, Limits(), tasks=tasks)
    values = {"task": "e2e", "prompt": MR, "target_speedup": 3.0, "max_new_tokens": 12}
    assert playground.admission_problem("ui_generate", values) is None  # not loaded: admitted, checked at start
    assert "skip policy skip-3x" in playground.load_task(values)
    outputs = list(playground.generate(values))
    assert outputs[0][0] == policy_line("e2e", 3.0, root / "e2e" / "skip-3x")
    assert "Done" in outputs[-1][0]
    final = next(out for out in reversed(outputs) if isinstance(out[1], str) and out[1])
    generator = tasks.get("e2e", 3.0)
    assert generator is not chat and generator.loaded.adapter_path.endswith("skip-3x")
    schedule = task_schedule("e2e", 3.0, generator.num_layers)
    reference = generator.generate(GenerationRequest(prompts=(INSTRUCTION + MR,), schedule=schedule,
                                                     max_new_tokens=12))
    full = generator.generate(GenerationRequest(prompts=(INSTRUCTION + MR,), max_new_tokens=12,
                                                schedule=task_schedule("e2e", 3.0, generator.num_layers, full=True)))
    assert final[1] and final[2]  # both panes filled
    message = list(playground.api_stream(values))[-1]  # the same run through the API: its texts
    assert message["skipdecode"][0] == reference.outputs[0] and message["full"][0] == full.outputs[0]
    assert message["places_swapped"] == [[]]  # The Eagle is a place the task model trained on
    assert message["unmentioned_facts"] == {"skipdecode": unmentioned_attributes(MR, message["skipdecode"][0]),
                                            "full": unmentioned_attributes(MR, message["full"][0])}
    assert message["made_up_facts"] == {"skipdecode": added_attributes(MR, message["skipdecode"][0]),
                                        "full": added_attributes(MR, message["full"][0])}
    assert "Facts of the MR: SkipDecode: " in final[3] and " stated" in final[3]
    assert message["wrong_facts"] == {"skipdecode": [f.attribute for f in check_facts(MR, message["skipdecode"][0])
                                                     if f.state == "wrong"],
                                      "full": [f.attribute for f in check_facts(MR, message["full"][0])
                                               if f.state == "wrong"]}
    chat_message = list(playground.api_stream({"prompt": "Hi", "max_new_tokens": 2}))[-1]
    assert chat_message["unmentioned_facts"] is None and chat_message["made_up_facts"] is None
    new = "name[Loch Fyne], food[French]"  # a test-set place the devset never names: the models see Aromi
    swapped = list(playground.api_stream(values | {"prompt": new}))[-1]
    given = generator.generate(GenerationRequest(prompts=(INSTRUCTION + "name[Aromi], food[French]",),
                                                 schedule=schedule, max_new_tokens=12))
    assert swapped["places_swapped"] == [[["Loch Fyne", "Aromi"]]] and swapped["prompts"] == [INSTRUCTION + new]
    assert swapped["skipdecode"][0] == given.outputs[0].replace("Aromi", "Loch Fyne")
    assert message["step_layers"] == [list(layers) for layers in reference.decode.step_layers]
    assert reference.layers_per_step and max(reference.layers_per_step) < generator.num_layers
    assert tasks.get("e2e", 3.0) is generator and tasks.get("e2e", 1.0) is generator  # cached, 1x reuses it
    figure, note = playground.schedule_preview(values)
    assert note == "" and figure is not None
    stepped = playground.step(values)  # step mode runs the task's models too
    assert "SkipDecode ran" in stepped[0] and f"all {generator.num_layers}" in stepped[0]
    with pytest.raises(gr.Error, match="The MR has a problem: unknown MR attribute &#x27;colour&#x27;"):
        list(playground.generate(values | {"prompt": "name[X], colour[red]"}))  # the toast renders HTML: escaped
    missing = Playground(lambda: chat, Limits(), tasks=TaskGenerators(root=root / "nowhere"))
    with pytest.raises(gr.Error, match="not available on this server yet"):
        list(missing.generate(values))
    assert "not available" in missing.load_task(values)


def test_new_places_are_swapped_for_known_ones_and_written_back_in_what_the_page_shows():
    """The models see a place they trained on in place of one they never did (a skip policy's few
    late layers copy a new name badly); the panes, the row labels and the API show the original."""
    from app.page.views import restored_tokens, shown_prompts, swap_note

    new = "name[The Vaults], eatType[pub], near[Rainbow Vegetarian Café]"
    settings = PlaygroundSettings.from_values(Limits(), prompt=new, task="e2e", batch_size=2)
    swaps = settings.place_swaps()
    assert swaps[0].mr == "name[The Eagle], eatType[pub], near[Aromi]"
    assert settings.request(full=False, num_layers=30).prompts[0] == INSTRUCTION + swaps[0].mr
    assert shown_prompts(settings.prompts(), swaps)[0] == INSTRUCTION + new
    tokens, depths = ["The", " E", "agle", " is", " near", " the", " Eagle", "."], [20, 19, 18, 17, 16, 15, 14, 13]
    assert restored_tokens(tokens, depths, swaps[0].swaps) == (
        ["The Vaults", " is", " near", " the Vaults", "."], [20, 17, 16, 15, 13])
    assert restored_tokens(["The", " E"], [20, 19], swaps[0].swaps) == (["The", " E"], [20, 19])  # not yet spelt
    note = swap_note(swaps[0].swaps)
    assert "The Vaults → The Eagle" in note and "Rainbow Vegetarian Café → Aromi" in note
    known = PlaygroundSettings.from_values(Limits(), prompt=MR, task="e2e")
    assert known.place_swaps()[0].swaps == () and swap_note(()) == ""
    assert known.prompts()[0] == INSTRUCTION + MR
    chat = PlaygroundSettings.from_values(Limits(), prompt="name[The Vaults]")
    assert chat.prompts()[0] == "name[The Vaults]" and chat.place_swaps()[0].swaps == ()
    spaced = dataclasses.replace(settings, prompt="name[The Vaults],eatType[pub]")  # shown as the visitor wrote it
    assert shown_prompts(spaced.prompts(), spaced.place_swaps())[0] == INSTRUCTION + "name[The Vaults],eatType[pub]"
    bad = dataclasses.replace(settings, prompt="name[X], colour[red]")
    assert bad.place_swaps()[0].mr == "name[X], colour[red]"  # refused elsewhere, with its reason


def test_the_headline_says_which_facts_of_the_mr_each_pane_states():
    from app.page.views import facts_note

    assert facts_note(None) == ""
    mr = "name[The Eagle], area[riverside], familyFriendly[yes], near[Burger King]"
    skip, full = "The Eagle is in the city centre. It is kid friendly.", "The Eagle is by the river near Burger King."
    checked = {"facts": 4, "mr": mr, "SkipDecode": {"checked": check_facts(mr, skip)},
               "full model": {"checked": check_facts(mr, full)}}
    assert facts_note(checked) == (' Facts of the MR: SkipDecode: <b>1 WRONG</b> (area: "city centre", the MR says '
                                   "riverside), 2 of 4 stated, missing: near · full model: 3 of 4 stated, "
                                   "missing: familyFriendly.")


def test_a_bare_visit_lands_on_the_task_lesson_where_its_models_serve_this_model_and_links_keep_their_meaning(
        default_model, tiny_folder, tmp_path):
    """The landing (app/page/lessons.py LANDING_LESSON): a visit without a link gets the paper's task at
    3x on the lesson's MR; a link (even one naming only the API's defaults) gets what it names, never
    the landing; a deployer's own model, or no task models, lands on chat as the page is built."""
    from types import SimpleNamespace

    from app.handlers import Playground
    from app.page.lessons import E2E_MR, LANDING_LESSON, LANDING_LINE, landing_values
    from app.tasks import TaskGenerators
    from model.generation.generator import TextGenerator
    from model.loading import load_model

    chat = TextGenerator(default_model)
    no_models = TaskGenerators(root=tmp_path)  # no e2e/task folder there
    stand_in = TaskGenerators(root=tmp_path, loader=lambda task, policy: default_model)
    assert stand_in.can_land("e2e", chat) and not stand_in.can_land("chat", chat)
    assert not no_models.can_land("e2e", chat)
    assert not stand_in.can_land("e2e", TextGenerator(load_model(str(tiny_folder), device="cpu", adapter=None)))  # a deployer's model shows itself first
    landing = landing_values(DEFAULTS)
    assert landing == lesson_values(lesson_by_title(LANDING_LESSON), DEFAULTS)
    assert (landing["task"], landing["prompt"], landing["target_speedup"]) == ("e2e", E2E_MR, 3.0)
    PlaygroundSettings.from_values(Limits(), **landing)  # a valid run as it stands
    assert lesson_by_title(LANDING_LESSON).then_label in LANDING_LINE  # the line names the button it points to

    playground = Playground(lambda: chat, Limits(), tasks=stand_in)
    names = PlaygroundSettings.api_names()

    def visit(query: dict) -> dict:
        values = playground.from_link(SimpleNamespace(query_params=query))
        assert len(values) == len(names) + 1
        return {name: value for name, value in zip([*names, "status"], values) if not isinstance(value, dict)}

    assert visit({}) == {}  # chat as built: the page lands on its build-time values
    playground.landing = landing
    for bare in ({}, {"__theme": "dark"}):
        assert visit(bare) == {name: landing[name] for name in names if name in landing}
    linked = visit({"target_speedup": "2"})  # an old link of chat at 2x keeps meaning chat at 2x
    assert linked["target_speedup"] == 2.0 and "task" not in linked and linked["status"].startswith("Settings loaded")
    assert stand_in.any("e2e") is None
    from app.ui import build_demo  # the page built under a deployer's lower limit lands within it

    limited = build_demo(lambda: chat, Limits(max_new_tokens=16), tasks=stand_in).playground.landing
    assert limited["max_new_tokens"] == 16 and limited["task"] == "e2e"
    PlaygroundSettings.from_values(Limits(max_new_tokens=16), **limited)
    assert build_demo(lambda: chat, tasks=stand_in, landing="chat").playground.landing is None
    with pytest.raises(ValueError, match="landing must be auto or chat"):
        build_demo(lambda: chat, tasks=stand_in, landing="e2e")
    playground.preload_landing().join()  # app.py at start: the first Generate does not wait for the load
    assert stand_in.any("e2e") is not None


def test_a_deployer_picks_the_landing_by_environment_and_a_bad_value_stops_the_start(environment_settings):
    """app.py's SKIPDECODE_LANDING: auto by default, chat to keep the task model out of memory."""
    import importlib.util

    from tests.support import ROOT

    spec = importlib.util.spec_from_file_location("app_entry", ROOT / "app.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    environment_settings(SKIPDECODE_LANDING="")
    assert entry.startup_settings().landing == "auto"
    environment_settings(SKIPDECODE_LANDING=" Chat ")
    assert entry.startup_settings().landing == "chat"
    with pytest.raises(ValueError, match="SKIPDECODE_LANDING must be one of auto, chat; got 'e2e'"):
        environment_settings(SKIPDECODE_LANDING="e2e")


def test_a_bad_setting_stops_the_start_with_the_reason(monkeypatch):
    """app.py reads every setting before anything loads; a bad one is a SystemExit naming the variable."""
    import importlib.util

    import model.common.settings as settings_module
    from tests.support import ROOT

    spec = importlib.util.spec_from_file_location("app_entry", ROOT / "app.py")
    entry = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(entry)
    monkeypatch.setattr(settings_module, "_installed", [])  # as at a start: nothing read yet
    monkeypatch.setenv("SKIPDECODE_LANDING", "e2e")
    with pytest.raises(SystemExit, match="SKIPDECODE_LANDING must be one of auto, chat; got 'e2e'"):
        entry.startup_settings()
    monkeypatch.setenv("SKIPDECODE_LANDING", "chat")
    monkeypatch.setenv("SKIPDECODE_STREAM_GRACE_S", "soon")
    with pytest.raises(SystemExit, match="SKIPDECODE_STREAM_GRACE_S must be a number; got 'soon'"):
        entry.startup_settings()


def test_the_4x_policy_line_says_its_wrong_facts_are_its_training_not_the_method():
    """The committed figures (assets/eval/e2e-facts.json, the delexicalised runs the playground matches;
    docs/RESULTS.md's facts table): 27.8% at 4x against 3.2% at 3x and 6.8% at 5x."""
    line = policy_line("e2e", 4.0, Path("adapters/e2e/skip-4x"))
    assert line.startswith("E2E task: the full pane is the task model; SkipDecode runs it at 4x with its skip policy "
                           "skip-4x. At 4x this policy states a wrong fact in 27.8% of the E2E test set's descriptions, "
                           "against 3.2% at 3x and 6.8% at 5x: that is this policy's training, not the method;")
    assert "5x's (skipping more layers) did not." in line
    results = (Path(__file__).resolve().parents[2] / "docs" / "RESULTS.md").read_text()
    assert "| per-speedup policy 4x | 27.8% |" in results and "| per-speedup policy 3x | 3.2% |" in results
    for speedup in (2.0, 3.0, 5.0):  # no dip there: the plain line
        assert policy_line("e2e", speedup, Path(f"e2e/skip-{speedup:g}x")).endswith(f"skip-{speedup:g}x.")
    assert "wrong fact" not in policy_line("e2e", 4.0, Path("e2e/skip-all"))  # shared: 18.3%, 5x worse at 21.6%
    assert "wrong fact" not in policy_line("e2e", 4.0, None)
    assert FACTS_FILE.is_file()


def test_the_wrong_fact_sentence_follows_the_figures_file(tmp_path):
    def line_with(shares: dict[str, float]) -> str:
        facts = tmp_path / f"facts-{len(list(tmp_path.iterdir()))}.json"
        facts.write_text(json.dumps({"e2e-delexicalised": {
            f"per-speedup policy {speedup}": {"wrong": share} for speedup, share in shares.items()}}))
        return policy_line("e2e", 4.0, Path("e2e/skip-4x"), facts_file=facts)

    assert "wrong fact in 30.0%" in line_with({"3x": 0.05, "4x": 0.30, "5x": 0.10})
    assert "wrong fact" not in line_with({"3x": 0.05, "4x": 0.08, "5x": 0.10})  # a retrained 4x: nothing to say
    assert "wrong fact" not in line_with({"3x": 0.05, "4x": 0.30})  # no higher speedup to show it is not the method
    assert "wrong fact" not in line_with({"3x": 0.05, "4x": 0.30, "5x": 0.40})  # skipping more is worse still
    assert policy_line("e2e", 4.0, Path("e2e/skip-4x"), facts_file=tmp_path / "none.json").endswith("skip-4x.")
