"""The Reddit TL;DR task in the playground: its settings, input checks, links, the model and policy it
runs, the subject line, the prompt's line; and one TL;DR generation through the Playground handler."""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import gradio as gr
import pytest

from app.page.fact_view import subject_line, subject_phrase
from app.page.lessons import TLDR_POST, lesson_by_title, lesson_values
from app.page.results import TLDR_FILE
from app.page.share import settings_from_query, share_link
from app.page.views import _api_subject, prompt_note, subject_check, subject_note
from app.settings import EXAMPLE_PROMPTS, Limits, PlaygroundSettings
from app.task_view import POST_LABEL, full_title, header_markdown, input_feedback, switch_values, task_view
from app.tasks import (
    TASK_FIXED,
    TaskGenerators,
    check_input,
    example_inputs,
    examples,
    fixed_controls,
    fixed_note,
    policy_line,
    post_examples,
    tldr_shape,
)
from model.loading import DEFAULT_MODEL
from model.race import StreamProgress
from model.skipdecode.decoder import DecodeResult
from model.tasks import tldr

DEFAULTS = {"prompt": "What is photosynthesis?", "warmup": 0, "order": "ranked"}
POST = "My sister keeps borrowing my car\nEvery weekend my sister takes the car and brings it back empty."


def test_tldr_is_a_setting_that_runs_the_tasks_schedule_on_the_post_greedily_to_the_first_line_break():
    first, second = post_examples()[:2]
    settings = PlaygroundSettings.from_values(Limits(), prompt=tldr.post_text(first), task="tldr", target_speedup=3.0,
                                              decay="cosine", warmup=5, temperature=1.0, batch_size=2,
                                              prompt_at_full_depth=False)
    # decay, warmup not read; the depth is; the shape is the shipped 3x policy's
    expected = tldr.task_schedule(3.0, 30, prompt_at_full_depth=False, shape=tldr_shape(3.0))
    assert settings.schedule_request(num_layers=30) == expected and expected.min_layers_floor in (6, 7)
    assert settings.schedule_request(full=True, num_layers=30).full
    request = settings.request(full=False, num_layers=30)
    assert request.prompts == (tldr.task_prompt(first), tldr.task_prompt(second))  # another example as row 2
    assert request.prompts[0].endswith("TL;DR of the post above in one sentence:")
    assert request.stop == tldr.STOP == ("\n",) and request.sampling.temperature == 0
    assert settings.place_swaps() == () and settings.posts()[0] == first  # the test post, its reference with it
    assert len(post_examples()) == len(example_inputs("tldr")) >= 6
    assert PlaygroundSettings.from_values(Limits(), prompt="Hi").request(full=False).stop == ()  # chat unchanged


def test_the_playground_runs_a_tldr_policy_under_the_shape_it_was_trained_in(tmp_path, monkeypatch):
    """A speedup whose shipped policy was trained in the front shape runs it, and the fixed note says so;
    one without a shipped policy (the general one runs) keeps the linear shape."""
    import dataclasses

    import app.tasks as tasks
    from model.tasks.tldr_training import TldrRun, train_config

    front = tmp_path / "skip-3x"
    front.mkdir()
    config = dataclasses.asdict(train_config(TldrRun(speedup=3.0, shape="front"), tmp_path / "targets.jsonl"))
    (front / "training_info.json").write_text(json.dumps({"config": config}))
    monkeypatch.setattr(tasks, "shipped_policy", lambda speedup, root=None: front if speedup == 3.0 else None)
    at = {speedup: PlaygroundSettings.from_values(Limits(), prompt=POST, task="tldr", target_speedup=speedup)
          for speedup in (3.0, 2.0)}
    request = at[3.0].schedule_request(num_layers=30)
    assert (request.decay, request.decay_length, request.speedup_steps, request.min_layers_floor) == ("step", 16, 32, 6)
    assert request == tldr.task_schedule(3.0, 30, shape=tldr.SHAPES["front"])
    assert at[2.0].schedule_request(num_layers=30) == tldr.task_schedule(2.0, 30)  # linear
    assert "3x: its first 8 tokens deep" in fixed_note("tldr")
    # a run takes the shape from the policy its generator holds, not from the speedup alone
    from app.handlers import Playground

    asked = []
    generator = SimpleNamespace(num_layers=30, loaded=SimpleNamespace(adapter_path=str(front)),
                                prepare=lambda request, **options: asked.append(request.schedule))
    playground = Playground(lambda: generator, Limits())
    monkeypatch.setattr(playground, "generator_for", lambda settings, load=True: generator)
    playground.prepared(at[2.0])  # a 2x run on a generator holding a front-shape policy: front
    assert asked[-1] == tldr.task_schedule(2.0, 30, shape=tldr.SHAPES["front"])
    generator.loaded.adapter_path = None  # the general policy: linear, at 3x too
    playground.prepared(at[3.0])
    assert asked[-1] == tldr.task_schedule(3.0, 30)


def test_the_task_view_keeps_the_prompts_depth_and_shows_the_posts_and_what_the_model_is():
    assert "prompt_at_full_depth" not in fixed_controls("tldr") and "prompt_at_full_depth" in fixed_controls("e2e")
    shown = task_view("tldr")
    fixed = dict(zip(TASK_FIXED, shown[:len(TASK_FIXED)]))
    assert fixed.pop("prompt_at_full_depth")["visible"] and not any(update["visible"] for update in fixed.values())
    note, e2e_box, post_box, chat_examples, title, prompt = shown[len(TASK_FIXED):]
    assert note["visible"] and "linear decay over 32 tokens" in note["value"] and "stays yours" in note["value"]
    assert not e2e_box["visible"] and post_box["visible"] and not chat_examples["visible"]
    assert "default model prompted for a TL;DR" in title["value"] == full_title("tldr")
    assert prompt["label"] == POST_LABEL and prompt["lines"] > 2 and "first line is the title" in prompt["placeholder"]
    assert "TL;DR task fixes" in fixed_note("tldr")
    general = SimpleNamespace(num_layers=30, loaded=SimpleNamespace(name="SmolLM2-135M-Instruct", device="cpu",
                                                                    quantize="int4", adapter_path="assets/adapters/skip"))
    header = header_markdown(general, "tldr")
    assert "**SmolLM2-135M-Instruct**, 30 layers, cpu, int4 weights" in header  # its own name: no task adapter
    assert "the default model prompted for a TL;DR (the paper fine-tuned one)" in header


def test_a_bad_post_is_named_as_text_and_a_good_one_passes():
    check_input("tldr", POST)
    check_input("tldr", tldr.post_text(post_examples()[0]))
    for text, words in (("Just a title", "The post has a problem: it has a title but no text"),
                        ("a" * 400 + "\nbody", "its first line is read as the title and is 400 characters long")):
        with pytest.raises(ValueError, match=re.escape(words)):
            check_input("tldr", text)
    with pytest.raises(ValueError, match="the post is empty: write its title on the first line"):
        PlaygroundSettings.from_values(Limits(), prompt=" \n ", task="tldr")
    with pytest.raises(ValueError, match="the prompt is empty"):  # chat's words stay
        PlaygroundSettings.from_values(Limits(), prompt=" ")
    shown = input_feedback("tldr", "<b>bold</b> title")  # under the prompt box, as typed
    assert shown["visible"] and shown["value"].startswith("**The post has a problem:** it has a title")
    assert not input_feedback("tldr", POST)["visible"] and not input_feedback("chat", "Just a title")["visible"]
    assert "<b>" not in input_feedback("tldr", "<b>" * 200 + "\nx")["value"]  # quoted as text


def test_switching_to_tldr_fills_an_example_post_and_back_restores_a_chat_prompt():
    post = example_inputs("tldr")[0]
    assert switch_values("tldr", "What is photosynthesis?") == (post, tldr.MAX_NEW_TOKENS)
    assert switch_values("tldr", examples()[0])[0] == post  # an MR is no post
    assert isinstance(switch_values("tldr", POST)[0], type(gr.skip()))  # a post already there stays
    assert switch_values("chat", post)[0] == EXAMPLE_PROMPTS[0]  # an example post is no chat prompt
    assert switch_values("e2e", post)[0] == examples()[0]
    assert switch_values("tldr", POST, max_new_tokens=16)[1] == 16  # a deployer's lower limit holds


def test_a_link_carries_the_task_and_the_post_and_opens_them():
    link = share_link("http://h/", {"task": "tldr", "prompt": POST}, DEFAULTS, Limits())
    assert "task=tldr" in link and "prompt=My+sister" in link
    from urllib.parse import parse_qsl, urlsplit

    values, problem = settings_from_query(dict(parse_qsl(urlsplit(link).query)), Limits(), DEFAULTS)
    assert problem == "" and values == {"task": "tldr", "prompt": POST}
    assert "task must be one of chat, e2e, tldr" in settings_from_query({"task": "summary"}, Limits(), DEFAULTS)[1]


def _generator(name: str = DEFAULT_MODEL):
    return SimpleNamespace(loaded=SimpleNamespace(name=name), num_layers=30)


def test_the_tldr_model_is_the_general_generator_unless_a_tldr_policy_is_shipped_for_the_speedup(tmp_path, tiny_folder):
    """No TL;DR policy: the general generator itself (no second copy of the model). A shipped one
    (tldr_training.shipped_policy: <root>/tldr/skip-<S>x) is loaded once, for its speedup only."""
    from model.loading import load_model

    loads = []

    def loader(task, policy):
        loads.append((task, policy))
        return load_model(str(tiny_folder), device="cpu", adapter=None)

    general = _generator()
    tasks = TaskGenerators(root=tmp_path, loader=loader)
    assert tasks.get("tldr", 3.0, general=general) is general and tasks.policy("tldr", 3.0, general) is None
    assert not tasks.trained_for("tldr", 3.0) and tasks.trained_for("e2e", 4.0) and not tasks.trained_for("chat", 2.0)
    folder = tmp_path / "tldr" / "skip-3x"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    assert tasks.policy("tldr", 3.0, general) == folder and tasks.trained_for("tldr", 3.0)
    assert tasks.get("tldr", 3.0, load=False, general=general) is None  # not loaded yet: admission sizes it
    loaded = tasks.get("tldr", 3.0, general=general)
    assert loaded is not general and loads == [("tldr", folder)]
    assert tasks.get("tldr", 3.0, general=general) is loaded and len(loads) == 1  # kept
    assert tasks.get("tldr", 2.0, general=general) is general and tasks.get("tldr", 1.0, general=general) is general
    assert policy_line("tldr", 3.0, folder).endswith("with its TL;DR skip policy skip-3x.")
    assert "the general skip policy (no TL;DR policy is shipped for 2x yet)" in policy_line("tldr", 2.0, None)
    assert "both panes are the default model prompted for a TL;DR" in policy_line("tldr", 1.0, None)
    own = TaskGenerators(root=tmp_path)  # a deployer's own model: the TL;DR policy is the default model's
    assert own.policy("tldr", 3.0, _generator("my-model")) is None and own.policy("tldr", 3.0, general) == folder
    assert not own.can_land("tldr", general)


def test_the_policy_choice_follows_shipped_policy(monkeypatch, tmp_path):
    import app.tasks

    asked = []
    monkeypatch.setattr(app.tasks, "shipped_policy", lambda speedup, root: asked.append((speedup, root)) or tmp_path)
    assert TaskGenerators(root=tmp_path).policy("tldr", 4.0, _generator()) == tmp_path
    assert asked == [(4.0, tmp_path)]


POSTED = tldr.TldrPost("t3_x", "relationships", "My boyfriend forgot my birthday", "He forgot my birthday again.",
                       "Boyfriend forgot my birthday party, what do I do?")


def test_the_subject_line_names_the_source_and_what_each_pane_names_or_misses():
    subject = tldr.post_subject(POSTED)
    named = tldr.subject_verdict("My boyfriend forgot my birthday.", subject)
    missed = tldr.subject_verdict("My boyfriend is nice.\n", subject)
    line = subject_line(subject, {"Full model": named, "SkipDecode 3x": missed})
    assert line == ('<div class="subject-line"><b>Main subject:</b> boyfriend; forgot, birthday (the people the test '
                    "set's reference TL;DR names, the words it shares with the title). Full model: <b>names the "
                    "subject</b> (boyfriend; forgot, birthday) · SkipDecode 3x: <b>misses</b> all of 'forgot', "
                    "'birthday' (names boyfriend).</div>")
    dog = tldr.post_subject(tldr.parse_post("My dog is lost\nI lost the dog today, my brother and I."))
    assert subject_phrase("SkipDecode 2x", tldr.subject_verdict("", dog)) == "SkipDecode 2x: <b>misses</b> all of 'dog', 'lost'"
    assert subject_phrase("SkipDecode 2x", tldr.subject_verdict("I found a dog.", tldr.post_subject(POSTED))) == \
        "SkipDecode 2x: <b>misses</b> 'boyfriend' and all of 'forgot', 'birthday'"
    assert subject_phrase("SkipDecode 2x", None) == "SkipDecode 2x: still writing"
    own = subject_line(tldr.post_subject(tldr.parse_post(POST)), {"Full model": None})
    assert "sister; car (from the title alone, your post having no reference" in own
    hostile = tldr.parse_post("My <b>boss</b> & <i>coworker</i> fight\nThe boss and the coworker fight daily.")
    drawn = subject_line(tldr.post_subject(hostile), {"Full model": None})
    assert "<b>boss" not in drawn and "<i>" not in drawn and "boss, coworker; fight" in drawn
    blank = subject_line(tldr.post_subject(tldr.parse_post("Help!\nWhat do I do?")), {"Full model": None})
    assert "<b>Main subject:</b> none this check can see" in blank


def _stream(text: str, done: bool, prefill_s: float, steps: int, depth: int, prompt_layers: int = 30) -> StreamProgress:
    record = DecodeResult(num_layers=30, prompt_lengths=[357], tokens=[list(range(steps + 1))], finish_reasons=["stop"],
                          prefill_layers=tuple(range(30 - prompt_layers, 30)),
                          step_layers=[tuple(range(30 - depth, 30))] * steps, prefill_seconds=prefill_s,
                          step_seconds=[0.01 * depth / 30] * steps)
    return StreamProgress("s", rows=1, record=record, texts=[SimpleNamespace(text=text, texts=[])], done=done)


def _update(skip: StreamProgress, full: StreamProgress):
    return SimpleNamespace(skip=skip, full=full, num_layers=30)


def test_the_prompts_line_counts_its_tokens_and_times_each_first_token_and_the_whole_request():
    settings = PlaygroundSettings.from_values(Limits(), prompt=tldr.post_text(POSTED), task="tldr", target_speedup=3.0)
    running = _update(_stream("My boy", False, 0.40, 3, 10), _stream("", False, 0.42, 0, 30))
    line = prompt_note(running, settings)
    assert line == (" The prompt: 357 tokens, read at full depth by both models; time to the first token: "
                    "SkipDecode 0.40 s, the full model 0.42 s.")
    shared = _update(_stream("", False, 0.42, 0, 10), _stream("", False, 0.42, 0, 30))  # the race read it once
    assert "read once at full depth for both models (the same computation, so the same time)" in prompt_note(shared, settings)
    done = _update(_stream("My boyfriend is nice.\n", True, 0.40, 20, 10), _stream("x", True, 0.42, 20, 30))
    finished = prompt_note(done, settings)
    assert finished.endswith("; the whole request over the first 21 tokens both wrote, prefill included: SkipDecode "
                             "0.47 s, the full model 0.62 s, <b>1.33x faster</b>.")  # 0.40 + 20 x 0.0033, 0.42 + 20 x 0.01
    short = _update(_stream("My boyfriend is nice.\n", True, 0.40, 20, 10), _stream("x", True, 0.42, 5, 30))
    assert "over the first 6 tokens both wrote" in prompt_note(short, settings)  # the same tokens of each
    budget = _update(_stream("", False, 0.15, 0, 10, prompt_layers=13), _stream("", False, 0.42, 0, 30))
    assert "by SkipDecode through the schedule's first budget (13 of 30 layers), by the full model at full depth" in \
        prompt_note(budget, settings)
    assert prompt_note(done, PlaygroundSettings.from_values(Limits(), prompt="Hi")) == ""  # chat: no such line
    checked = subject_check(done, settings)
    assert checked[1]["SkipDecode"].summary == "My boyfriend is nice." and not checked[1]["SkipDecode"].names_subject
    assert "SkipDecode 3x: <b>misses</b> all of 'forgot', 'birthday'" in subject_note(checked, 3.0)
    assert subject_check(running, settings)[1] == {"full model": None, "SkipDecode": None}  # while they write
    assert _api_subject(checked) == {"from": "title", "people": ["boyfriend"], "event": ["forgot", "birthday"],
                                     "skipdecode": {"summary": "My boyfriend is nice.", "names_subject": False,
                                                    "missing": [["forgot", "birthday"]]},
                                     "full": {"summary": "x", "names_subject": False,
                                              "missing": [["boyfriend"], ["forgot", "birthday"]]}}
    assert _api_subject(None) is None


def test_the_lesson_runs_a_test_post_at_3x_then_the_same_post_with_the_prompt_at_the_first_budget():
    lesson = lesson_by_title("A long prompt: the TL;DR task at 3x")
    values = lesson_values(lesson, DEFAULTS)
    assert values["task"] == "tldr" and values["target_speedup"] == 3.0 and values["prompt"] == TLDR_POST
    assert values["prompt_at_full_depth"] is True and values["max_new_tokens"] == tldr.MAX_NEW_TOKENS
    assert tldr.parse_post(TLDR_POST).reference  # a test post: the subject comes from its reference
    second = lesson_values(lesson, DEFAULTS, then=True)
    assert second == values | {"prompt_at_full_depth": False}
    text = lesson.markdown()
    assert "time to the first token" in text and "prefilled at full depth" in text
    assert not re.search(r"\d+[- ]token", text) and not re.search(r"\d\.\d+ ?s\b", text)  # no figure typed in


@pytest.mark.slow
def test_one_tldr_generation_through_the_playground_handler(default_model, tmp_path):
    """TL;DR without a shipped policy runs the general generator already loaded (no second model): the
    full pane at full depth, SkipDecode at 3x on the task's schedule to the first line break; the line
    under the panes says whether each summary names the post's subject. A 300-word post is admitted at
    the default settings; a post too long for the job-cost cap is refused with a message that says so."""
    from app.handlers import Playground
    from model.generation.generator import TextGenerator
    from model.generation.runs import GenerationRequest

    chat = TextGenerator(default_model)
    tasks = TaskGenerators(root=tmp_path)  # no tldr/ folder: no TL;DR policy
    playground = Playground(lambda: chat, Limits(), tasks=tasks)
    post = post_examples()[0]
    values = {"task": "tldr", "prompt": tldr.post_text(post), "target_speedup": 3.0, "max_new_tokens": 8}
    assert playground.admission_problem("ui_generate", values) is None
    assert "the general skip policy" in playground.load_task(values) and len(tasks.loaded) == 0
    outputs = list(playground.generate(values))
    assert "general skip policy" in outputs[0][0] and "Done" in outputs[-1][0]
    final = next(out for out in reversed(outputs) if isinstance(out[1], str) and out[1])
    assert final[1] and final[2] and "default model prompted for a TL;DR" in final[2]  # both panes filled
    assert "<b>Main subject:</b> " in final[3] and "Full model: " in final[3] and "SkipDecode 3x: " in final[3]
    assert "The prompt: " in final[3] and "once at full depth for both models" in final[3]  # the race read it once
    committed = json.loads(TLDR_FILE.read_text())  # the committed report's 3x arm, quoted, not made up
    three = next(arm for arm in committed["arms"] if arm["speedup"] == 3.0 and arm["prompt_at_full_depth"])
    assert f"On {committed['posts_scored']} TL;DR test posts, 3x keeps " in final[3]
    assert f"{three['shares']['rougeL']['share']:.3f} of the 1x arm's ROUGE-L" in final[3]
    message = list(playground.api_stream(values))[-1]
    reference = chat.generate(GenerationRequest(prompts=(tldr.task_prompt(post),), max_new_tokens=8, stop=tldr.STOP,
                                                schedule=tldr.task_schedule(3.0, chat.num_layers)))
    assert message["main_subject"]["skipdecode"]["summary"] == tldr.clean_summary(reference.outputs[0])
    assert message["step_layers"] == [list(layers) for layers in reference.decode.step_layers]
    assert message["main_subject"]["from"] == "reference" and message["unmentioned_facts"] is None
    assert len(tasks.loaded) == 0  # the general generator served it: no copy loaded
    words = post.post.split()
    long_post = tldr.post_text(post).split("\n", 1)[0] + "\n\n" + " ".join((words * 2)[:300])
    assert playground.admission_problem("ui_generate", values | {"prompt": long_post, "max_new_tokens": 48}) is None
    too_long = values | {"prompt": long_post + " " + " ".join(words * 4), "max_new_tokens": 48}
    problem = playground.admission_problem("ui_generate", too_long)
    assert problem is not None and problem[1].startswith("the post is too long for one job here")
    assert "shorten the post" in problem[1]
    with pytest.raises(gr.Error, match="The post has a problem: it has a title but no text"):
        list(playground.generate(values | {"prompt": "Only a title"}))
