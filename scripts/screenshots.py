"""Screenshots for the README and for reading the page as a visitor and a teacher would.

Starts `python app.py` on a free loopback port, drives Debian's Chromium with playwright, and
writes, at desktop (1440x900) and phone (390x844) size, what the screen shows without scrolling:
on arrival (the landing: the paper's task at 3x, docs/SERVING.md "The first run"), ~3 s after Generate, when done, an empty prompt's refusal (the outputs, and by Generate), after running a lesson (the batch one), and the
Results and How it works tabs; plus the README's assets/images/playground.png and results.png,
and the paper's E2E task at both sizes (assets/images/e2e-1440x900.png, e2e-390x844.png: the task
picked, an MR composed in the form, generated at 3x; then its lesson's second run, the MR where the task
model states every fact and 3x drops one: assets/images/visitor/e2e-lesson-then-*.png; SKIPDECODE_TASK_ADAPTERS names other adapters),
and the issue 52 run at 5x, its wrong fact marked (assets/images/e2e-facts-*.png), and a class of four
pages in one batch (assets/images/visitor/class-batch-*.png).

    python scripts/screenshots.py [--only desktop|phone|readme|e2e|facts|batch]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_test import free_port, start_server  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from app.page.lessons import LESSONS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "images"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
VIEWPORTS = {"desktop": (1440, 900), "phone": (390, 844)}


def wait_done(page, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and "Done" not in page.inner_text("#status"):
        time.sleep(0.5)
    time.sleep(1.5)


def start_and_wait(page, button: str, seconds: float = 180) -> None:
    """Press ``button`` (a run starts), let the previous run's "Done" clear, wait for the new one's."""
    page.click(button)
    deadline = time.time() + 30
    while time.time() < deadline and "Done" in page.inner_text("#status"):  # the previous run's status
        time.sleep(0.2)
    wait_done(page, seconds)


def run_lesson(page, title: str) -> None:
    """Pick a lesson and press "Run this lesson" (it sets the controls, generates, scrolls)."""
    page.click("#lesson-choice input")
    page.click(f"li[role=option]:has-text(\"{title}\")")
    time.sleep(0.5)
    start_and_wait(page, "#lesson-run")


def refuse_empty_prompt(page) -> None:
    """An empty prompt's Generate: the refusal on the status line (then the prompt is put back)."""
    box = page.locator("#setting-prompt textarea")
    prompt = box.input_value()
    box.fill("")
    page.click("#generate-btn")
    time.sleep(1.5)
    page.evaluate("document.querySelector('#generate-btn').scrollIntoView({block: 'center'})")
    time.sleep(0.5)
    page.screenshot(path=str(OUT / "visitor" / f"{page.viewport_size['width']}-refused.png"))
    box.fill(prompt)


def visitor_views(browser, port: int, name: str) -> list[Path]:
    width, height = VIEWPORTS[name]
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(f"http://127.0.0.1:{port}/")
    page.wait_for_selector("#generate-btn", timeout=120_000)
    time.sleep(1.0)
    shots = [("arrival", None), ("streaming", lambda: (page.click("#generate-btn"), time.sleep(3))),
             ("done", lambda: wait_done(page)),
             ("refused-empty-prompt", lambda: refuse_empty_prompt(page)),
             ("lesson-batch", lambda: (page.evaluate("window.scrollTo(0, 0)"), run_lesson(page, "One exit for the whole batch"))),
             ("results", lambda: (page.click("button[role=tab]:has-text('Results')"), time.sleep(3))),
             ("how-it-works", lambda: (page.click("button[role=tab]:has-text('How it works')"), time.sleep(3)))]
    written = []
    for label, action in shots:
        if action:
            action()
        path = OUT / "visitor" / f"{name}-{label}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=label in ("results", "how-it-works"))
        written.append(path)
    page.close()
    return written


def pick_e2e(page, seconds: float = 300) -> None:
    """Pick the E2E task and wait for its model to load (the status line names its policy)."""
    page.click("#setting-task label:has-text('E2E')")
    deadline = time.time() + seconds
    while time.time() < deadline and "task" not in page.inner_text("#status"):
        time.sleep(0.5)


def e2e_views(browser, port: int) -> list[Path]:
    """The E2E task at 3x, an MR composed in the form (near a place the task model never trained on,
    so the pane note names the swap), both panes done, at each size."""
    written = []
    for width, height in VIEWPORTS.values():
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#generate-btn", timeout=120_000)
        pick_e2e(page)
        page.click("#speedup-3-0")
        page.click("#mr-form button")  # open the form
        page.fill("#mr-name textarea, #mr-name input", "The Eagle")
        for key, value in (("eattype", "coffee shop"), ("food", "French"), ("area", "riverside")):
            page.click(f"#mr-{key} input")
            page.click(f"li[role=option]:has-text(\"{value}\")")
        page.fill("#mr-near textarea, #mr-near input", "The Painted Lighthouse")  # new: swapped, written back
        page.click("#mr-compose")
        time.sleep(1.0)
        page.click("#generate-btn")
        time.sleep(2)
        wait_done(page, 600)
        path = OUT / f"e2e-{width}x{height}.png"
        page.screenshot(path=str(path))
        written.append(path)
        page.evaluate("window.scrollTo(0, 0)")
        run_lesson(page, "The paper's task: 3x")  # then its second run: 3x drops a fact the task model states
        start_and_wait(page, "#lesson-then", 600)
        path = OUT / "visitor" / f"e2e-lesson-then-{width}x{height}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path))
        written.append(path)
        page.close()
    return written


# The issue 52 run: at 5x SkipDecode puts this riverside coffee shop in the city centre (a WRONG fact).
FACTS_MR = ("name[The Golden Palace], eatType[coffee shop], food[Italian], priceRange[cheap], area[riverside], "
            "familyFriendly[yes], near[Café Rouge]")


def facts_views(browser, port: int) -> list[Path]:
    """The E2E task at 5x on FACTS_MR, both panes done, the facts marked in them and named in the line
    under them (assets/images/e2e-facts-1440x900.png, e2e-facts-390x844.png)."""
    written = []
    for width, height in VIEWPORTS.values():
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#generate-btn", timeout=120_000)
        pick_e2e(page)
        page.click("#speedup-5-0")
        page.fill("#setting-prompt textarea", FACTS_MR)
        time.sleep(1.0)
        page.click("#generate-btn")
        time.sleep(2)
        wait_done(page, 600)
        page.evaluate("document.querySelector('#status').scrollIntoView({block: 'start'})")
        path = OUT / f"e2e-facts-{width}x{height}.png"
        page.screenshot(path=str(path))
        written.append(path)
        page.close()
    return written


def batch_views(browser, port: int) -> list[Path]:
    """The class as one batch: four pages (three desktops, a phone) open the lesson's link and press
    Generate together; the desktop and the phone each show their own row and the batch it shared
    (assets/images/visitor/class-batch-1440x900.png, class-batch-390x844.png)."""
    number = next(i for i, lesson in enumerate(LESSONS, 1) if lesson.title == "The class as one batch")
    sizes = [VIEWPORTS["desktop"]] * 3 + [VIEWPORTS["phone"]]
    pages = [browser.new_page(viewport={"width": w, "height": h}) for w, h in sizes]
    for page in pages:
        page.goto(f"http://127.0.0.1:{port}/?lesson={number}")
        page.wait_for_selector("#generate-btn", timeout=120_000)
    time.sleep(2.0)
    for page in pages:  # within the batcher's gathering moment: one evaluate each, no waits
        page.evaluate("document.querySelector('#generate-btn').click()")
    for page in pages:
        wait_done(page, 300)
    written = []
    for page, (width, height) in ((pages[0], sizes[0]), (pages[-1], sizes[-1])):
        page.evaluate("document.querySelector('#headline').scrollIntoView({block: 'center'})")
        time.sleep(0.5)
        path = OUT / "visitor" / f"class-batch-{width}x{height}.png"
        page.screenshot(path=str(path))
        written.append(path)
    for page in pages:
        page.close()
    return written


def readme_images(browser, port: int) -> list[Path]:
    """The landing's first run (the paper's task at 3x, as a visitor's first Generate) and the Results tab."""
    page = browser.new_page(viewport={"width": 1440, "height": 1300})
    page.goto(f"http://127.0.0.1:{port}/")
    page.wait_for_selector("#generate-btn", timeout=120_000)
    time.sleep(2.0)  # the landing's settings, set on load
    page.click("#generate-btn")
    wait_done(page)
    page.screenshot(path=str(OUT / "playground.png"), full_page=True)
    page.click("button[role=tab]:has-text('Results')")
    time.sleep(3)
    page.screenshot(path=str(OUT / "results.png"), full_page=True)
    page.close()
    return [OUT / "playground.png", OUT / "results.png"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=[*VIEWPORTS, "readme", "e2e", "facts", "batch"], help="one set of screenshots")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port)
    written = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            for name in VIEWPORTS:
                if args.only in (None, name):
                    written += visitor_views(browser, port, name)
            if args.only in (None, "readme"):
                written += readme_images(browser, port)
            if args.only in (None, "e2e"):
                written += e2e_views(browser, port)
            if args.only in (None, "facts"):
                written += facts_views(browser, port)
            if args.only in (None, "batch"):
                written += batch_views(browser, port)
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
