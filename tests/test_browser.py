"""A real headless Chromium against the launched playground: click Generate, watch it stream."""

import os
import shutil
import time
from pathlib import Path

import pytest

from app.ui import build_demo, launch_options
from model.generation import TextGenerator

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium not installed (scripts/test.sh installs it)")]
BROWSER_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="module")
def server(default_model):
    generator = TextGenerator(default_model)
    demo = build_demo(lambda: generator)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    yield demo
    demo.close()


@pytest.fixture(scope="module")
def page_url(server):
    return server.local_url


def _open(p, url, width: int = 1400, height: int = 1400):
    browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
    return browser, _page(browser, url, width, height)


def _page(browser, url, width: int = 1400, height: int = 1000):
    """A new tab on ``url``, once the app has rendered."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    page.wait_for_selector("#generate-btn", timeout=60_000)
    return page


def _wait(condition, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def _token_count(page) -> int:
    return page.evaluate("() => document.querySelectorAll('#skip-output .tok').length")


def _full_length(page) -> int:
    return page.evaluate("() => (document.querySelector('#full-output .tokens') || {innerText: ''}).innerText.length")


def test_generate_streams_both_outputs_and_renders_the_heatmap(page_url, tmp_path):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(page_url)
        page.wait_for_selector("#generate-btn", timeout=60_000)
        page.wait_for_selector("#schedule-plot .main-svg", timeout=30_000)  # the policy is drawn before any run
        page.fill("#component-0 textarea, textarea", "Write a short story about a robot who learns to paint.")
        page.click("#generate-btn")

        samples = []
        deadline = time.time() + 90
        while time.time() < deadline:
            samples.append((_token_count(page), _full_length(page)))
            if "Done" in page.inner_text("#status"):
                break
            time.sleep(0.3)
        assert "Done" in page.inner_text("#status"), page.inner_text("#status")
        skip_counts = [s[0] for s in samples]
        full_lengths = [s[1] for s in samples]
        assert len({c for c in skip_counts if c > 0}) >= 3, "SkipDecode output did not grow step by step"
        assert len({n for n in full_lengths if n > 0}) >= 3, "full-model output did not grow step by step"

        page.wait_for_selector("#heatmap .main-svg", timeout=10_000)
        updates = int(page.evaluate("() => document.querySelector('#heatmap .plotly-live').dataset.updates || 0"))
        assert updates >= 2, "the heatmap was not updated in place while streaming"
        assert "measured speedup" in page.inner_text("#stats")
        shot = Path(os.environ.get("SKIPDECODE_SCREENSHOT", tmp_path / "playground.png"))
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        assert not errors, errors
        browser.close()


@pytest.mark.parametrize("how", ["stop button", "closed tab"])
def test_stop_and_closed_tab_end_the_generation(server, how):
    runs = server.playground.runs
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url)
        page.fill("#component-0 textarea, textarea", "Tell me a very long story about the sea and its sailors.")
        page.click("#generate-btn")
        # the full model's pane: SkipDecode may legitimately stop early at EOS
        if not _wait(lambda: _full_length(page) >= 10, 90):
            page.screenshot(path="/tmp/stop-failure.png", full_page=True)
            raise AssertionError(f"generation did not start: {page.inner_text('#status')!r}")
        assert runs.active_count() == 1
        assert not runs.sessions()[0].startswith("no-session"), "the UI run is not tied to its browser session"
        if how == "stop button":
            page.click("#stop-btn")
            assert _wait(lambda: runs.active_count() == 0, 15)
            assert _wait(lambda: "Stopped" in page.inner_text("#status"), 15)
            length = _full_length(page)
            time.sleep(1.0)
            assert _full_length(page) == length, "tokens kept arriving after Stop"
            browser.close()
        else:
            page.close()
            assert _wait(lambda: runs.active_count() == 0, 20), "the run survived its closed tab"
            browser.close()


def test_changing_the_decay_while_generating_restarts_both_streams(server):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url)
        page.fill("textarea", "Tell me a very long story about the sea and its sailors.")
        page.click("button:has-text('Advanced')")
        tokens = page.locator("input[aria-label='number input for Max new tokens']")
        tokens.fill("256")
        tokens.press("Enter")
        time.sleep(0.5)
        page.click("#generate-btn")
        assert _wait(lambda: _full_length(page) >= 10, 90), "generation did not start"
        page.click("input[aria-label='Decay function']")
        page.click("li[role=option]:has-text('cosine')")
        assert _wait(lambda: "restarted" in page.inner_text("#status"), 30), page.inner_text("#status")
        assert _wait(lambda: "cosine" in page.inner_text("#stats"), 30)
        assert server.playground.runs.active_count() == 1  # the old run ended, the new one runs
        page.click("#stop-btn")
        assert _wait(lambda: server.playground.runs.active_count() == 0, 15)
        browser.close()


@pytest.mark.parametrize("width,height", [(1440, 900), (390, 844)])
def test_both_outputs_are_in_view_after_generate(server, width, height):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url, width, height)
        assert page.locator("#generate-btn").bounding_box()["y"] < height, "Generate is below the fold"
        page.click("#generate-btn")
        assert _wait(lambda: _full_length(page) >= 10, 90), "generation did not start"
        time.sleep(1.0)  # the smooth scroll on a phone
        for pane in ("#skip-output", "#full-output"):
            box = page.locator(pane).bounding_box()
            assert box["y"] < height - 40 and box["y"] + 40 > 0, (pane, box)
        page.click("#stop-btn")
        assert _wait(lambda: page.evaluate("() => !!document.querySelector('#heatmap .plotly-live').data"), 30)
        legend = page.evaluate("() => document.querySelector('#heatmap .plotly-live').data[0].colorbar.orientation")
        assert legend == "h" if width < 520 else legend in (None, "v"), legend  # phones: legend under the plot
        browser.close()


def test_presets_set_the_speedup_and_lens_hover_names_the_top_tokens(server):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url)
        page.fill("textarea", "What is the capital of France?")
        page.click("#speedup-3-0")
        slider = "input[aria-label='number input for Target layer speedup']"
        assert _wait(lambda: page.input_value(slider) == "3", 10), page.input_value(slider)
        page.click("#speedup-1-5")
        assert _wait(lambda: page.input_value(slider) == "1.5", 10)
        page.click("label:has-text('Logit lens')")
        page.click("label:has-text('lens\\'s KL')")
        page.click("#generate-btn")
        assert _wait(lambda: "Done" in page.inner_text("#status"), 120), page.inner_text("#status")
        time.sleep(0.5)
        # Hover the top layer of the last prompt column (it ran every layer and produced token 0).
        point = page.evaluate("""() => {
            const gd = document.querySelector('#heatmap .plotly-live');
            const layout = gd._fullLayout, trace = gd._fullData[0];
            const strip = gd.data.find(t => t.type === 'scatter');
            const x = strip.x[0], y = trace.z.length - 1;
            const box = gd.getBoundingClientRect();
            return {x: box.left + layout.margin.l + layout.xaxis.l2p(x),
                    y: box.top + layout.margin.t + layout.yaxis.l2p(y)};
        }""")
        page.mouse.move(point["x"], point["y"])
        assert _wait(lambda: "lens" in (page.evaluate(
            "() => Array.from(document.querySelectorAll('#heatmap .hovertext')).map(e => e.textContent).join(' ')") or ""), 10)
        hover = page.evaluate("() => Array.from(document.querySelectorAll('#heatmap .hovertext')).map(e => e.textContent).join(' ')")
        assert "layer 29: ran" in hover and "%" in hover, hover
        assert "lens KL to the full model" in hover
        colourbars = page.evaluate("() => document.querySelector('#heatmap .plotly-live').data"
                                   ".map(t => t.colorbar && t.colorbar.title && t.colorbar.title.text)")
        assert "lens KL" in colourbars, colourbars
        browser.close()


def test_newlines_are_drawn_as_marks(server):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url)
        page.fill("textarea", "List five animals that live in the ocean.")
        page.click("#generate-btn")
        assert _wait(lambda: "Done" in page.inner_text("#status"), 120), page.inner_text("#status")
        marks = page.evaluate("() => document.querySelectorAll('#full-output .nl').length")
        assert marks >= 1  # the full model's list has line breaks; each run is one visible mark
        browser.close()


def test_a_lesson_sets_the_controls_and_a_link_round_trips_them(server):
    slider = "input[aria-label='number input for Target layer speedup']"
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url)
        page.click("button:has-text('Lessons')")
        page.click("#lesson-3")  # linear vs cosine at 3x
        assert _wait(lambda: page.input_value(slider) == "3", 10), page.input_value(slider)
        assert "cosine" in page.input_value("input[aria-label='Decay function']")
        assert "Look for" in page.inner_text("#lesson-text")
        page.fill("textarea", "Why do we have seasons?")
        page.click("#share-btn")
        link = page.locator("#share-link textarea, #share-link input").first
        assert _wait(lambda: "target_speedup=3" in link.input_value(), 10), link.input_value()
        url = link.input_value()
        assert "decay=cosine" in url and "prompt=Why+do+we+have+seasons" in url
        fresh = _page(browser, url)
        assert _wait(lambda: fresh.input_value(slider) == "3", 15), fresh.input_value(slider)
        assert _wait(lambda: "seasons" in fresh.input_value("#setting-prompt textarea"), 5)
        assert "cosine" in fresh.input_value("input[aria-label='Decay function']")
        bad = _page(browser, server.local_url.rstrip("/") + "/?decay=zigzag&target_speedup=2.5")
        assert _wait(lambda: "decay" in bad.inner_text("#status"), 15), bad.inner_text("#status")
        assert _wait(lambda: bad.input_value(slider) == "2.5", 5)
        browser.close()


def test_stop_shows_no_error_badge(server):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url)
        page.fill("textarea", "Tell me a very long story about the sea and its sailors.")
        for _ in range(3):
            page.click("#generate-btn")
            assert _wait(lambda: _full_length(page) >= 5, 90), "generation did not start"
            page.click("#stop-btn")
            assert _wait(lambda: "Stopped" in page.inner_text("#status"), 15)
            time.sleep(0.5)
            errors = page.evaluate("() => Array.from(document.querySelectorAll('.error, [class*=error]'))"
                                   ".filter(e => e.offsetParent !== null && /error/i.test(e.textContent))"
                                   ".map(e => e.className + ' | ' + e.closest('[id]')?.id + ' | ' + e.textContent.slice(0, 80))")
            assert not errors, f"an Error badge appeared after Stop: {errors}"
        browser.close()
