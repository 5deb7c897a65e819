"""Issue #52 in a real headless Chromium, at 1440x900 and 390x844: a run with a known WRONG fact
marked in both panes and named first in the line, the speed figure of an 8-token answer, a lesson's
"more" fold, the 4x and 5x presets of a task, Stop disabled while nothing runs.

The known wrong fact: a tiny task model trained here, in seconds, to write one description of one
MR word for word ("... in the city centre" for area[riverside]); at 1x both panes run it, so the
run's text, and its wrong fact, are known before it starts."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from app.page.lessons import E2E_MR
from app.ui import build_demo, launch_options
from model.generation.generator import TextGenerator
from model.generation.runs import GenerationRequest
from model.loading import load_model
from model.tasks.e2e import task_prompt
from model.tasks.task_models import task_schedule
from tests.support import CHROMIUM, open_page, wait_until

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                                      reason="Debian chromium not installed (scripts/test.sh installs it)")]
SIZES = [(1440, 900), (390, 844)]
MR = "name[The Eagle], eatType[coffee shop], area[riverside]"  # The Eagle: a place the task model trained on
WRONG = "The Eagle is a coffee shop in the city centre."


def _memorizer(default_model, folder: Path) -> Path:
    """A tiny Llama (the default tokenizer) trained to write WRONG for MR, greedy, and then stop."""
    import transformers as tf

    torch.manual_seed(0)
    tokenizer = default_model.tokenizer
    eos = default_model.eos_token_ids[0]
    model = tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=eos, pad_token_id=default_model.pad_token_id))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    prompt, _ = TextGenerator(load_model(str(folder), device="cpu", adapter=None)).text.encode([task_prompt(MR)])
    target = torch.tensor([*tokenizer(WRONG, add_special_tokens=False).input_ids, eos])
    sequence = torch.cat([prompt[0], target])[None]
    labels = sequence.clone()
    labels[:, : prompt.shape[1]] = -100
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        model(sequence, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(folder)
    generator = TextGenerator(load_model(str(folder), device="cpu", adapter=None))
    written = generator.generate(GenerationRequest(prompts=(task_prompt(MR),), max_new_tokens=24,
                                                   schedule=task_schedule("e2e", 1.0, generator.num_layers, full=True)))
    assert written.outputs[0] == WRONG, written.outputs[0]  # the run's outcome, known
    return folder


@pytest.fixture(scope="module")
def classroom_server(default_model, tmp_path_factory):
    from app.tasks import TaskGenerators

    folder = _memorizer(default_model, tmp_path_factory.mktemp("memorizer"))
    generator = TextGenerator(default_model)
    tasks = TaskGenerators(root=folder / "no-policies",
                           loader=lambda task, policy: load_model(str(folder), device="cpu", adapter=None))
    demo = build_demo(lambda: generator, tasks=tasks)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    yield demo
    demo.close()


_wait, _open = wait_until, open_page


def _generate(page, timeout: float = 180) -> None:
    """Generate, and wait for this run's end."""
    page.locator("#generate-btn").scroll_into_view_if_needed()
    page.click("#generate-btn")
    _wait(lambda: "Done" not in page.inner_text("#status"), 20)
    assert _wait(lambda: "Done" in page.inner_text("#status"), timeout), page.inner_text("#status")
    time.sleep(0.5)


def _stop_disabled(page) -> bool:
    return page.evaluate("() => document.querySelector('#stop-btn').disabled")


@pytest.mark.parametrize("width,height", SIZES)
def test_a_known_wrong_fact_is_marked_in_both_panes_and_named_first(classroom_server, width, height):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, classroom_server.local_url + "?task=chat", width, height)
        assert _wait(lambda: "loaded from the link" in page.inner_text("#status"), 30), page.inner_text("#status")
        assert not page.locator("#speedup-5-0").is_visible()  # chat: no policy is trained for 4x or 5x
        page.click("#setting-task label:has-text('E2E')")
        assert _wait(lambda: "E2E task" in page.inner_text("#status"), 120), page.inner_text("#status")
        assert _wait(lambda: page.locator("#speedup-4-0").is_visible() and page.locator("#speedup-5-0").is_visible(),
                     10)
        page.click("#speedup-5-0")  # a preset sets the speedup it names
        assert _wait(lambda: page.input_value("input[aria-label='number input for Target layer speedup']") == "5", 10)
        page.click("#speedup-1-0")  # 1x: both panes are the task model, whose text is known
        page.fill("#setting-prompt textarea", MR)
        assert _stop_disabled(page)  # nothing runs yet
        _generate(page)
        assert _wait(lambda: _stop_disabled(page), 10)  # and nothing runs after
        for pane in ("#full-output", "#skip-output"):
            assert WRONG in page.inner_text(pane).replace("\n", " "), page.inner_text(pane)
            wrong = page.locator(f"{pane} .fact-wrong")
            assert "".join(wrong.all_inner_texts()).strip() == "city centre"
            assert wrong.first.get_attribute("title").startswith("WRONG area: the MR says riverside")
            assert page.locator(f"{pane} .fact-stated").count() >= 2  # the name and the eatType
        line = page.inner_text("#headline")
        assert '1 WRONG (area: "city centre", the MR says riverside)' in line, line
        assert line.index("WRONG") < line.index("stated")


@pytest.mark.parametrize("width,height", SIZES)
def test_a_bare_visit_lands_on_the_papers_task_at_3x_ready_to_run(classroom_server, width, height):
    """The landing (app/page/lessons.py LANDING_LESSON): the E2E lesson's MR at 3x, its presets and its
    second run in reach, the line saying what the visitor looks at; one Generate runs it as is."""
    with playwright.sync_playwright() as p:
        browser, page = _open(p, classroom_server.local_url, width, height)
        assert _wait(lambda: page.input_value("#setting-prompt textarea") == E2E_MR, 30)
        assert page.is_checked("#setting-task input[value='e2e']")
        assert page.input_value("input[aria-label='number input for Target layer speedup']") == "3"
        assert _wait(lambda: page.locator("#speedup-5-0").is_visible(), 10)  # the next click: where it breaks
        assert page.inner_text("#status").startswith("You are looking at the paper's task")
        assert "The paper's task: 3x" in page.inner_text("#lesson-text") and page.locator("#lesson-then").is_visible()
        assert "E2E task model" in page.inner_text("#full-title")
        _generate(page)
        assert page.inner_text("#full-output").strip() and page.inner_text("#skip-output").strip()
        assert "stated" in page.inner_text("#headline")  # the facts line of the task


@pytest.mark.parametrize("width,height", SIZES)
def test_an_8_token_answer_gets_a_speed_figure_and_its_step_count(classroom_server, width, height):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, classroom_server.local_url + "?max_new_tokens=8", width, height)
        assert _wait(lambda: "loaded from the link" in page.inner_text("#status"), 30), page.inner_text("#status")
        _generate(page)
        line = page.inner_text("#headline")
        # the honest sentence: a figure in plain words ("1.3x faster", "no faster" or "slower") on 7 steps
        assert re.search(r"measured (\d+\.\d+x faster|no faster|slower) per decode step \(", line), line
        assert "the median of 7 steps, too few to trust" in line, line
        assert "middle half" in line and "cost model" in line
        status = page.inner_text("#status")
        example = page.locator("#chat-examples button:has-text('capital of France')").first
        example.scroll_into_view_if_needed()
        example.click()  # an example click only fills the prompt box, as its label says
        assert _wait(lambda: page.input_value("#setting-prompt textarea") == "What is the capital of France?", 10)
        time.sleep(3)
        assert page.inner_text("#status") == status and _stop_disabled(page)  # no run started


@pytest.mark.parametrize("width,height", SIZES)
def test_a_lesson_reads_in_three_lines_with_the_rest_folded(classroom_server, width, height):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, classroom_server.local_url, width, height)
        page.locator("#lesson-choice").scroll_into_view_if_needed()
        page.click("#lesson-choice input")
        page.click("li[role=option]:has-text(\"The paper's task\")")
        text = page.locator("#lesson-text")
        assert _wait(lambda: "The paper's task: 3x" in text.inner_text(), 10)
        fold = text.locator("details")
        assert fold.count() == 1 and fold.get_attribute("open") is None
        assert not text.locator("details p").first.is_visible()  # the detail is folded away
        assert text.locator("h4").inner_text().startswith("The paper's task")
        text.locator("summary").click()
        assert _wait(lambda: text.locator("details p").first.is_visible(), 5)
        assert "wrong fact in" in text.locator("details").inner_text()
