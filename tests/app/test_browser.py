"""A real headless Chromium against the launched playground: click Generate, watch it stream."""

import os
import re
import time
from pathlib import Path

import pytest

from app.ui import build_demo, launch_options
from model.generation.generator import TextGenerator
from tests.support import BROWSER_ARGS, CHROMIUM, open_page, rendered_page, wait_until

playwright = pytest.importorskip("playwright.sync_api")
pytestmark = [pytest.mark.browser, pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium not installed (scripts/test.sh installs it)")]


@pytest.fixture(scope="module")
def server(default_model):
    generator = TextGenerator(default_model)
    demo = build_demo(lambda: generator, landing="chat")  # chat's page (the landing has its own test)
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    yield demo
    demo.close()


@pytest.fixture(scope="module")
def page_url(server):
    return server.local_url


def _open(p, url, width: int = 1400, height: int = 1400):
    return open_page(p, url, width, height)


def _page(browser, url, width: int = 1400, height: int = 1000):
    return rendered_page(browser, url, width, height)


def _open_from_link(p, url: str, query: str, width: int = 1400, height: int = 1400):
    """A page opened from a share link (``query``), once the link's settings are in the controls:
    a number typed into a control can reach the page's state after the next click on a slow machine."""
    browser, page = _open(p, f"{url}?{query}", width, height)
    assert _wait(lambda: "loaded from the link" in page.inner_text("#status"), 30), page.inner_text("#status")
    return browser, page


_wait = wait_until


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
        headline = page.inner_text("#headline")
        assert re.search(r"measured (\d+\.\d+x faster|no faster|slower) per decode step", headline), headline
        assert "positions" in headline
        page.click("text=Details: speeds")  # the Details expander (rendered when opened)
        assert _wait(lambda: "measured speedup" in page.inner_text("#stats"), 10)
        shot = Path(os.environ.get("SKIPDECODE_SCREENSHOT", tmp_path / "playground.png"))
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        assert not errors, errors
        browser.close()


def _length_is_steady(page, seconds: float = 0.5) -> bool:
    before = _full_length(page)
    time.sleep(seconds)
    return _full_length(page) == before


@pytest.mark.parametrize("how", ["stop button", "closed tab"])
def test_stop_and_closed_tab_end_the_generation(server, how):
    runs = server.playground.runs
    with playwright.sync_playwright() as p:
        # 256 new tokens: the default 48 can all stream before the Stop click lands on a fast engine
        # (the run then ends by itself and the status never says Stopped)
        browser, page = _open_from_link(p, server.local_url, "max_new_tokens=256")
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
            # Updates already sent before Stop may still be painting on a loaded machine: let the
            # pane settle (a run that kept streaming would never settle), then it must stay put.
            _wait(lambda: _length_is_steady(page), 5)
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
        browser, page = _open_from_link(p, server.local_url, "max_new_tokens=256")
        page.fill("textarea", "Tell me a very long story about the sea and its sailors.")
        page.click("#generate-btn")
        assert _wait(lambda: _full_length(page) >= 10, 90), "generation did not start"
        page.click("input[aria-label='Decay function']")
        page.click("li[role=option]:has-text('cosine')")
        assert _wait(lambda: "restarted" in page.inner_text("#status"), 30), page.inner_text("#status")
        assert _wait(lambda: "cosine" in page.inner_text("#skip-output .pane-note"), 30)  # the run's schedule
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
        # The legend is HTML under the plot (a plotly colourbar lost entries on a phone): every kind shown.
        legend = page.inner_text("#heatmap-note .legend")
        assert all(kind in legend for kind in ("bypassed", "prompt", "upper layer")), legend
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
            const x = strip.x[0] - 1, y = trace.z.length - 1;  // the last prompt position: all layers ran
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


def test_stop_shows_no_error_badge(server):
    with playwright.sync_playwright() as p:
        # 256 tokens: a run must outlast the test's own polling (streamed in frames, 48 took ~3 s here)
        browser, page = _open_from_link(p, server.local_url, "max_new_tokens=256")
        page.fill("textarea", "Tell me a very long story about the sea and its sailors.")
        for _ in range(3):
            page.click("#generate-btn")
            # this run's own tokens (the panes still hold the last run's until its first update)
            assert _wait(lambda: "Generating" in page.inner_text("#status") and _full_length(page) >= 5, 90), \
                "generation did not start"
            page.click("#stop-btn")
            assert _wait(lambda: "Stopped" in page.inner_text("#status"), 15), \
                f"no 'Stopped' after Stop: status {page.inner_text('#status')!r}, full {_full_length(page)} tokens"
            time.sleep(0.5)
            errors = page.evaluate("() => Array.from(document.querySelectorAll('.error, [class*=error]'))"
                                   ".filter(e => e.offsetParent !== null && /error/i.test(e.textContent))"
                                   ".map(e => e.className + ' | ' + e.closest('[id]')?.id + ' | ' + e.textContent.slice(0, 80))")
            assert not errors, f"an Error badge appeared after Stop: {errors}"
        browser.close()


# --- the classroom: layout, contrast, lessons, links --------------------------------------------

SIZES = [(1440, 900), (390, 844)]
SLIDER = "input[aria-label='number input for Target layer speedup']"


def _box(page, selector: str) -> dict:
    box = page.locator(selector).first.bounding_box()
    assert box is not None, f"{selector} is not rendered"
    return box


def _overlaps(a: dict, b: dict, slack: float = 1.0) -> bool:
    return (a["x"] + slack < b["x"] + b["width"] and b["x"] + slack < a["x"] + a["width"]
            and a["y"] + slack < b["y"] + b["height"] and b["y"] + slack < a["y"] + a["height"])


# Every visible text element of a plot, as boxes; plotly draws each label as one <text>.
SVG_TEXT_BOXES = """(selector) => Array.from(document.querySelectorAll(selector + ' .main-svg text'))
    .filter(t => t.textContent.trim() && t.getBBox().width > 0 && getComputedStyle(t).opacity !== '0')
    .map(t => { const r = t.getBoundingClientRect();
                return {text: t.textContent, x: r.x, y: r.y, width: r.width, height: r.height}; })"""

# WCAG contrast of every token span: its own text colour on its own background.
TOKEN_CONTRASTS = """() => {
  const rgb = s => s.match(/[\\d.]+/g).slice(0, 3).map(Number);
  const lum = c => { const l = c.map(v => { v /= 255; return v <= 0.04045 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
                     return 0.2126 * l[0] + 0.7152 * l[1] + 0.0722 * l[2]; };
  return Array.from(document.querySelectorAll('#skip-output .tok')).map(e => {
    const style = getComputedStyle(e);
    const [a, b] = [lum(rgb(style.color)), lum(rgb(style.backgroundColor))].sort((x, y) => y - x);
    return (a + 0.05) / (b + 0.05);
  });
}"""


def _text_overlaps(page, selector: str) -> list:
    boxes = page.evaluate(SVG_TEXT_BOXES, selector)
    return [(a["text"], b["text"]) for i, a in enumerate(boxes) for b in boxes[i + 1:] if _overlaps(a, b)]


def _run_to_done(page, timeout: float = 240) -> None:
    """Wait for a run started just now: past the previous run's status, then to its end."""
    _wait(lambda: "Done" not in page.inner_text("#status"), 20)
    assert _wait(lambda: "Done" in page.inner_text("#status"), timeout), page.inner_text("#status")
    time.sleep(0.5)


@pytest.mark.parametrize("width,height", SIZES)
def test_a_class_sees_the_picture_under_the_text_readable_and_honest(server, width, height):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url, width, height)
        note_height = _box(page, "#load-note")["height"]
        # Step and Reset sit beside Generate and Stop, above the fold.
        buttons = [_box(page, f"#{name}") for name in ("generate-btn", "stop-btn", "step-btn", "step-reset-btn")]
        assert max(b["y"] for b in buttons) - min(b["y"] for b in buttons) < 5, buttons
        assert all(b["y"] + b["height"] < height for b in buttons)
        assert not any(word in page.inner_text("#guide").lower() for word in (" left", " right")), "guide says left/right"
        page.click("#generate-btn")
        _run_to_done(page)
        # The heatmap directly under the two answers (and the honest line between them).
        skip, full, headline, heatmap = (_box(page, s) for s in ("#skip-output", "#full-output", "#headline", "#heatmap"))
        assert max(skip["y"] + skip["height"], full["y"] + full["height"]) <= headline["y"] + 1
        assert headline["y"] + headline["height"] <= heatmap["y"] + 1
        assert heatmap["x"] < skip["x"] + skip["width"] and skip["x"] < heatmap["x"] + heatmap["width"]
        if width >= 1000:  # one screen: the answers and the top of the heatmap together, beside the controls
            assert heatmap["y"] + heatmap["height"] / 2 < height + 60, heatmap
            assert skip["x"] > buttons[0]["x"] + buttons[0]["width"]
        boxes = [_box(page, s) for s in ("#status", "#skip-output", "#full-output", "#headline", "#heatmap", "#heatmap-note")]
        assert not [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if _overlaps(boxes[i], boxes[j])]
        assert not _text_overlaps(page, "#heatmap"), _text_overlaps(page, "#heatmap")
        page.locator("#schedule-plot").scroll_into_view_if_needed()
        assert not _text_overlaps(page, "#schedule-plot"), _text_overlaps(page, "#schedule-plot")
        # Every number means what its label says: the headline names its measures.
        line = page.inner_text("#headline")
        assert "median of" in line and "picks the same next token at" in line and "Regression remains" in line
        # Token text keeps WCAG AA contrast, computed from the rendered colours.
        ratios = page.evaluate(TOKEN_CONTRASTS)
        assert ratios and min(ratios) >= 4.5, min(ratios)
        # No emoji glyph that renders as a box without an emoji font; no stale busy line, no shift.
        status = page.inner_text("#status")
        assert all(ord(ch) < 0x2190 for ch in status), status
        assert "busy" not in page.inner_text("#load-note").lower()
        assert abs(_box(page, "#load-note")["height"] - note_height) < 2
        font = page.evaluate("() => getComputedStyle(document.querySelector('#skip-output .tokens')).fontFamily")
        assert "Noto Sans CJK SC" in font and "sans-serif" in font, font  # a named fallback for CJK tokens
        browser.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_a_lesson_runs_from_one_button_and_shows_every_batch_row(server, width, height):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url, width, height)
        page.click("#lesson-choice input")
        page.click("li[role=option]:has-text('One exit for the whole batch')")
        assert _wait(lambda: "four rows" in page.inner_text("#lesson-text"), 10)
        page.locator("#lesson-run").scroll_into_view_if_needed()
        page.click("#lesson-run")  # it sets the controls (batch size 4 is under Advanced) and generates
        _run_to_done(page)
        status = _box(page, "#status")
        assert -5 < status["y"] < height * 0.6, status  # scrolled to the answers
        rows = page.evaluate("""() => Array.from(document.querySelectorAll('#skip-output .tokens')).map(
            pane => Array.from(pane.querySelectorAll('.tok')).slice(0, 3).map(t => t.style.background))""")
        assert len(rows) == 4 and page.locator("#full-output .row-label").count() == 4
        assert all(row == rows[0] for row in rows), rows  # one exit per position for the whole batch
        assert not page.locator("#lesson-then").is_visible()  # this lesson has no second run
        page.click("#lesson-choice input")
        page.click("li[role=option]:has-text('Linear vs cosine at 3x')")
        assert _wait(lambda: page.locator("#lesson-then").is_visible(), 10)
        assert "Run it with linear decay" in page.inner_text("#lesson-then")
        browser.close()


@pytest.mark.parametrize("width,height", SIZES)
def test_a_share_link_is_short_has_a_qr_code_and_a_bad_value_is_named(server, width, height):
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        context = browser.new_context(viewport={"width": width, "height": height})
        context.grant_permissions(["clipboard-read", "clipboard-write"])
        page = context.new_page()
        page.goto(server.local_url)
        page.wait_for_selector("#generate-btn", timeout=60_000)
        page.click("#speedup-3-0")
        assert _wait(lambda: page.input_value(SLIDER) == "3", 10)
        page.click("input[aria-label='Decay function']")
        page.click("li[role=option]:has-text('cosine')")
        page.locator("#share-btn").scroll_into_view_if_needed()
        page.click("#share-btn")
        link = page.locator("#share-link textarea, #share-link input").first
        assert _wait(lambda: "target_speedup=3" in link.input_value(), 15), link.input_value()
        url = link.input_value()
        assert url.endswith("/?target_speedup=3&decay=cosine"), url  # only what differs from the page's defaults
        assert _wait(lambda: "Copied" in page.inner_text("#share-note"), 10), page.inner_text("#share-note")
        assert page.evaluate("() => navigator.clipboard.readText()") == url
        qr = _box(page, "#share-qr svg")
        assert qr["width"] >= 90 and qr["x"] + qr["width"] <= width  # big enough for a projector, on screen
        fresh = context.new_page()
        fresh.goto(url)
        assert _wait(lambda: fresh.input_value(SLIDER) == "3", 30), fresh.input_value(SLIDER)
        assert "cosine" in fresh.input_value("input[aria-label='Decay function']")
        bad = context.new_page()
        cjk = "%E4%BB%80%E4%B9%88%E6%98%AF%E5%85%89%E5%90%88%E4%BD%9C%E7%94%A8%EF%BC%9F"  # 什么是光合作用？
        bad.goto(server.local_url.rstrip("/") + f"/?target_speedup=9&decay=zigzag&max_new_tokens=8&prompt={cjk}")
        bad.wait_for_selector("#generate-btn", timeout=60_000)
        assert _wait(lambda: "target_speedup=9 is outside" in bad.inner_text("#status"), 20), bad.inner_text("#status")
        assert "decay" in bad.inner_text("#status") and bad.input_value(SLIDER) == "2"
        bad.click("#generate-btn")
        _run_to_done(bad, 120)
        errors = bad.evaluate("() => Array.from(document.querySelectorAll('.error, [class*=error]'))"
                              ".filter(e => e.offsetParent !== null && /error/i.test(e.textContent)).length")
        assert errors == 0
        for pane in ("#skip-output", "#full-output"):  # characters split over byte tokens arrive whole
            text = bad.inner_text(pane)
            assert "\ufffd" not in text and any("\u4e00" <= ch <= "\u9fff" for ch in text), text
        browser.close()


def test_results_tables_scroll_sideways_on_a_phone(server):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url, 390, 844)
        page.click("button[role=tab]:has-text('Results')")
        page.wait_for_selector(".results-table table", timeout=20_000)
        tables = page.evaluate("""() => Array.from(document.querySelectorAll('.results-table table')).map(t => ({
            scroll: t.scrollWidth, client: t.clientWidth, width: t.getBoundingClientRect().width,
            cell: t.querySelector('td').getBoundingClientRect().height,
            line: parseFloat(getComputedStyle(t.querySelector('td')).lineHeight) || 24}))""")
        assert tables
        for table in tables:
            assert table["width"] <= 390 and table["scroll"] >= table["client"]
            assert table["cell"] < 2 * table["line"] + 20, table  # one line per cell, not one character per line
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 392  # the page itself does not scroll
        browser.close()


# The live heatmap as Plotly drew it: its cells (positions, z, hover), its traces and shapes.
DRAWN_HEATMAP = """() => {
  const gd = document.querySelector('#heatmap .plotly-live');
  if (!gd || !gd.data) return null;
  const cells = gd.data[0], strip = gd.data.find(t => t.type === 'scatter');
  return {x: Array.from(cells.x), z: cells.z, text: cells.text, traces: gd.data.map(t => t.type),
          strip: strip ? Array.from(strip.x) : [], shapes: (gd.layout.shapes || []).length,
          band: Array.from((gd.data.find(t => t.name === 'prompt (folded)') || {x: []}).x),
          ticks: (gd.layout.xaxis.tickvals || []).length,
          nticks: gd.layout.xaxis.nticks, updates: Number(gd.dataset.updates || 0), width: gd.clientWidth,
          svg: !!gd.querySelector('.main-svg')};
}"""


def _final_figure(server, **values) -> dict:
    """The heatmap figure of a finished run with these settings (greedy: the page's run again),
    as the page's renderer builds it, whole."""
    from app.page.views import RaceRenderer

    checked = server.playground.checked(values)
    for update in checked.race(compute_lock=server.playground.compute):
        pass
    return RaceRenderer(checked.settings).heatmap(update, highlight_last=False)


def _drawn_is(page, expected: dict) -> dict:
    """The heatmap Plotly drew (patched in the page, run by run) is ``expected``, cell by cell."""
    drawn = page.evaluate(DRAWN_HEATMAP)
    assert drawn is not None and drawn["svg"], "the heatmap is not drawn"
    cells = expected["data"][0]
    assert drawn["x"] == cells["x"], (len(drawn["x"]), len(cells["x"]))  # the same positions
    assert drawn["z"] == cells["z"] and drawn["text"] == cells["text"]  # every cell's kind and hover (the lens)
    assert drawn["traces"] == [trace["type"] for trace in expected["data"]]
    strip = next(trace["x"] for trace in expected["data"] if trace["type"] == "scatter")
    assert drawn["strip"] == strip and drawn["shapes"] == len(expected["layout"]["shapes"])
    return drawn


def _set_run(page, prompt: str, lens: bool) -> None:
    page.fill("#setting-prompt textarea", prompt)
    if page.is_checked("#setting-lens input") != lens:
        page.click("#setting-lens input")


@pytest.mark.parametrize("width,height", SIZES)
def test_the_streamed_heatmap_is_the_final_figure_and_the_next_run_starts_clean(server, width, height):
    """Issue #37: the heatmap streams as one figure and then patches, applied in the page. After a
    run with a long prompt and the lens, Plotly shows exactly the final figure; Reset clears it; a
    second run, and a third without Reset, each draw their own figure, not the last one's patched."""
    long_prompt = "Tell me about the sea and its old sailors. " * 25  # ~280 positions with the template
    runs = [dict(prompt=long_prompt, lens=True), dict(prompt="Name three colours.", lens=False)]
    with playwright.sync_playwright() as p:
        browser, page = _open_from_link(p, server.local_url, "max_new_tokens=20", width, height)  # CI ran one at 48
        page.click("button:has-text('Advanced')")
        assert page.locator("input[aria-label='number input for Max new tokens']").input_value() == "20"
        _set_run(page, **runs[0])
        page.click("#generate-btn")
        _run_to_done(page)
        first = _final_figure(server, max_new_tokens=20, **runs[0])
        drawn = _drawn_is(page, first)
        assert drawn["updates"] >= 2  # redrawn in place while it streamed
        assert drawn["band"] and drawn["band"][-1] > 250  # the long prompt folded into one band
        if width < 1000:  # a phone draws it too, with its own axis (fewer ticks)
            assert drawn["ticks"] <= 6 and drawn["width"] <= width, drawn["ticks"]
            browser.close()
            return
        page.click("#step-reset-btn")
        assert _wait(lambda: page.evaluate(DRAWN_HEATMAP) is None, 15), "Reset did not clear the heatmap"
        _set_run(page, **runs[1])
        page.click("#generate-btn")
        _run_to_done(page)
        _drawn_is(page, _final_figure(server, max_new_tokens=20, **runs[1]))
        _set_run(page, **runs[0])  # a new Generate straight after a run (no Reset)
        page.click("#generate-btn")
        _run_to_done(page)
        _drawn_is(page, first)
        browser.close()


@pytest.fixture(scope="module")
def task_server(default_model, tiny_task_adapters):
    """The app with the E2E task on tiny task models trained by the fixture (the shipped ones
    arrive as assets; a test never depends on files that are not committed)."""
    from app.tasks import TaskGenerators

    root, loader = tiny_task_adapters
    generator = TextGenerator(default_model)
    demo = build_demo(lambda: generator, tasks=TaskGenerators(root=root, loader=loader), landing="chat")
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", quiet=True, **launch_options())
    yield demo
    demo.close()


def _pick(page, selector: str, value: str) -> None:
    page.click(f"{selector} input")
    page.click(f"li[role=option]:has-text(\"{value}\")")


@pytest.mark.parametrize("width,height", SIZES)
def test_the_e2e_task_from_the_form_to_both_panes_and_its_lesson(task_server, width, height):
    with playwright.sync_playwright() as p:
        browser, page = _open(p, task_server.local_url, width, height)
        assert not page.locator("#mr-form").is_visible() and page.locator("#setting-decay").is_visible()
        assert "the full model original" in page.inner_text("#page-header")
        page.click("#setting-task label:has-text('E2E')")
        # the header names the task's model at once (the general model + the task's LoRA, as it loads)
        assert _wait(lambda: "E2E task model" in page.inner_text("#page-header"), 10), page.inner_text("#page-header")
        assert "the full model original" not in page.inner_text("#page-header")
        assert _wait(lambda: "E2E task" in page.inner_text("#status"), 120), page.inner_text("#status")
        assert _wait(lambda: "12 layers" in page.inner_text("#page-header"), 10)  # then the loaded model's facts
        assert "name[" in page.input_value("#setting-prompt textarea")  # an example MR replaced the chat prompt
        assert not page.locator("#setting-decay").is_visible()  # the task fixes the schedule, and says so
        assert "fixes the schedule" in page.inner_text("#task-note")
        page.click("#speedup-3-0")
        page.click("#mr-form button")
        page.fill("#mr-name input, #mr-name textarea", "The Eagle")
        _pick(page, "#mr-eattype", "coffee shop")
        _pick(page, "#mr-food", "French")
        page.fill("#mr-near input, #mr-near textarea", "The Painted Lighthouse")  # a place no training MR names
        page.click("#mr-compose")
        mr = "name[The Eagle], eatType[coffee shop], food[French], near[The Painted Lighthouse]"
        assert _wait(lambda: page.input_value("#setting-prompt textarea") == mr, 10)
        page.locator("#generate-btn").scroll_into_view_if_needed()
        page.click("#generate-btn")
        _run_to_done(page, 180)
        assert "skip policy skip-3x" in page.inner_text("#status")
        assert _token_count(page) > 0 and _full_length(page) > 0  # both panes filled
        assert "E2E task model" in page.inner_text("#full-output")
        # both models were given a place they trained on, and the pane says which
        assert "The Painted Lighthouse → The Punter" in page.inner_text("#skip-output")
        page.locator("#lesson-choice").scroll_into_view_if_needed()
        page.click("#lesson-choice input")
        page.click("li[role=option]:has-text(\"The paper's task\")")
        assert _wait(lambda: "third" in page.inner_text("#lesson-text"), 10)
        page.click("#lesson-run")
        _run_to_done(page, 180)
        assert page.input_value("#setting-prompt textarea").startswith("name[Giraffe]")
        assert "at 3x" in page.inner_text("#status") and _token_count(page) > 0 and _full_length(page) > 0
        assert "E2E task model" in page.inner_text("#page-header")
        if width >= 1000:  # once: a bad MR is named, as text; a bad task in a link is refused, escaped
            page.fill("#setting-prompt textarea", "name[X], <b>red</b>")  # quoted in parse_mr's message
            problem = page.locator("#mr-problem")
            assert _wait(lambda: problem.is_visible() and "attribute[value] pairs" in problem.inner_text(), 20)
            assert problem.locator("b:has-text('red')").count() == 0 and "<b>red</b>" in problem.inner_text()
            page.click("#generate-btn")  # refused before it queues: the page stays up, the line stays
            time.sleep(2)
            assert "<b>red</b>'" in problem.inner_text()
            page.fill("#setting-prompt textarea", mr)
            assert _wait(lambda: not problem.is_visible(), 10)
            bad = _page(browser, task_server.local_url.rstrip("/") + "/?task=%3Cb%3Ebold%3C/b%3E", width, height)
            assert _wait(lambda: "task must be one of chat, e2e" in bad.inner_text("#status"), 20)
            assert bad.locator("#status b:has-text('bold')").count() == 0 and "<b>bold</b>" in bad.inner_text("#status")
        page.click("#setting-task label:has-text('General chat')")  # back to chat: the header says so again
        assert _wait(lambda: "the full model original" in page.inner_text("#page-header"), 10)
        assert "task model" not in page.inner_text("#page-header")


def test_the_tldr_task_from_an_example_post_to_both_panes_and_the_subject_line(server):
    """TL;DR runs the default model the page already serves (no task models needed): pick the task, click
    a test-set post, Generate; both panes fill and the line under them says whether each names the subject."""
    from app.tasks import post_examples

    with playwright.sync_playwright() as p:
        browser, page = _open(p, server.local_url, 1440, 900)
        assert not page.locator("#tldr-box").is_visible()
        page.click("#setting-task label:has-text('TL;DR')")
        assert _wait(lambda: page.locator("#tldr-box").is_visible(), 10)
        assert "default model prompted for a TL;DR" in page.inner_text("#tldr-note")
        assert _wait(lambda: "TL;DR task" in page.inner_text("#status"), 60), page.inner_text("#status")
        box = "#setting-prompt textarea"
        assert page.input_value(box).startswith(post_examples()[0].title + "\n\n")  # an example replaced the chat prompt
        post = post_examples()[1]
        page.click(f"#tldr-examples button:has-text({post.title[:30]!r})")
        assert _wait(lambda: page.input_value(box).startswith(post.title), 10), page.input_value(box)[:80]
        assert not page.locator("#setting-decay").is_visible() and "stays yours" in page.inner_text("#task-note")
        page.locator("#generate-btn").scroll_into_view_if_needed()
        page.click("#generate-btn")
        _run_to_done(page, 180)
        status = page.inner_text("#status")  # the shipped TL;DR policy for the speedup, else the general one
        assert ("TL;DR skip policy skip-" in status) != ("general skip policy" in status)
        assert _token_count(page) > 0 and _full_length(page) > 0  # both panes filled
        headline = page.inner_text("#headline")
        assert "Main subject: dad; games, play (the people the test set's reference TL;DR names" in headline, headline
        assert re.search(r"Full model: (names the subject|misses)", headline) and "SkipDecode 2x: " in headline
        assert re.search(r"The prompt: \d+ tokens, read once at full depth for both models .*; time to the first token",
                         headline), headline
        page.fill(box, "Only a title")  # a post without its text: named under the box, as text
        assert _wait(lambda: "it has a title but no text" in page.inner_text("#mr-problem"), 10)
        browser.close()


# Links a stranger could post: each part tries to draw a page element of its own.
HOSTILE_LINK = {
    '<form action="http://evil.example/s"><p>Your session expired. Sign in</p><input type="password" name="pw">'
    "<button>Sign in</button></form>": "1",
    '<a href="http://evil.example" style="position:fixed;top:0;left:0;width:100%;height:100%">continue</a>': "1",
    "[text](http://evil.example)": "1",
    "decay": '<b style="position:fixed;inset:0">x</b><form><input name="q"></form>',
    "seed": "<img src=x>[seed](http://evil.example)",
}
FOREIGN_ELEMENTS = """() => {
  const status = document.querySelector('#status');
  const inStatus = Array.from(status.querySelectorAll('form, input, button, a, img, [style], svg'))
      .map(e => e.outerHTML.slice(0, 120));
  const forms = Array.from(document.querySelectorAll('form')).length;
  const passwords = document.querySelectorAll('input[type=password]').length;
  const evil = Array.from(document.querySelectorAll('a[href], form[action], img[src]'))
      .filter(e => /evil\\.example|^x$/.test(e.getAttribute('href') || e.getAttribute('action') || e.getAttribute('src'))).length;
  const covering = Array.from(document.querySelectorAll('body *')).filter(e => {
      const s = getComputedStyle(e);
      return s.position === 'fixed' && e.getBoundingClientRect().width * e.getBoundingClientRect().height
          > 0.5 * innerWidth * innerHeight;
  }).length;
  return {inStatus, forms, passwords, evil, covering};
}"""


def test_a_hostile_link_is_shown_as_text_and_the_page_still_works_under_its_csp(server):
    from urllib.parse import urlencode

    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=BROWSER_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        console = []
        page.on("console", lambda message: console.append(message.text))
        page.on("pageerror", lambda error: console.append(str(error)))
        before = server.fair_queue.page_sessions()
        clean = page.goto(server.local_url)  # the normal page first: it loads and renders under the policy
        page.wait_for_selector("#generate-btn", timeout=60_000)
        # its heartbeat carried the page token the load set: a page session (app/serving/page_tokens.py)
        assert _wait(lambda: server.fair_queue.page_sessions() > before, 10), server.fair_queue.page_sessions()
        assert "'nonce-" in clean.headers["content-security-policy"]
        page.wait_for_selector("#schedule-plot .main-svg", timeout=30_000)
        baseline = page.evaluate(FOREIGN_ELEMENTS)
        response = page.goto(server.local_url.rstrip("/") + "/?" + urlencode(HOSTILE_LINK))
        assert response.status == 200
        page.wait_for_selector("#generate-btn", timeout=60_000)
        assert _wait(lambda: "The link has a problem" in page.inner_text("#status"), 20), page.inner_text("#status")
        status = page.inner_text("#status")
        # Shown as the characters of the link, capped: the markup is visible text, not elements.
        assert '<form action="http://evil.example/s">' in status and "[text](http://evil.example)" in status, status
        assert "decay must be one of" in status and "seed must be" in status and len(status) < 700, status
        found = page.evaluate(FOREIGN_ELEMENTS)
        assert found == baseline and found["passwords"] == found["evil"] == 0, found  # gradio's own elements only
        assert found["covering"] == 0, found
        page.click("#generate-btn")  # and Generate still works
        _run_to_done(page, 120)
        assert _token_count(page) > 0 and _full_length(page) > 0
        page.wait_for_selector("#heatmap .main-svg", timeout=10_000)
        violations = [text for text in console if "Content Security Policy" in text]
        assert not violations, violations[:3]
        browser.close()
