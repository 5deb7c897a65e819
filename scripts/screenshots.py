"""Screenshots for the README: the playground after one generation, and the Results tab.

Starts `python app.py` on a free loopback port, drives Debian's Chromium with playwright, and
writes assets/images/playground.png and assets/images/results.png.

    python scripts/screenshots.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

sys.path.insert(0, str(Path(__file__).resolve().parent))
from load_test import free_port, start_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "assets" / "images"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]


VIEWPORTS = {"desktop": (1440, 900), "phone": (390, 844)}


def wait_done(page, seconds: float = 180) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline and "Done" not in page.inner_text("#status"):
        time.sleep(0.5)
    time.sleep(1.0)


def visitor_views(browser, port: int) -> list[Path]:
    """What a visitor sees without scrolling, at desktop and phone size: on arrival, ~3 s after
    pressing Generate on the default prompt, and when done."""
    written = []
    for name, (width, height) in VIEWPORTS.items():
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("#generate-btn", timeout=120_000)
        time.sleep(1.0)
        shots = [("arrival", None), ("streaming", lambda: (page.click("#generate-btn"), time.sleep(3))),
                 ("done", lambda: wait_done(page))]
        for label, action in shots:
            if action:
                action()
            path = OUT / "visitor" / f"{name}-{label}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(path))
            written.append(path)
        page.close()
    return written


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            written = visitor_views(browser, port)
            page = browser.new_page(viewport={"width": 1440, "height": 1300})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#generate-btn", timeout=120_000)
            page.fill("textarea", "Write a short story about a robot who learns to paint.")
            page.click("#generate-btn")
            wait_done(page)
            page.screenshot(path=str(OUT / "playground.png"), full_page=True)
            page.click("button[role=tab]:has-text('Results')")
            time.sleep(3)
            page.screenshot(path=str(OUT / "results.png"), full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    for path in [*written, OUT / "playground.png", OUT / "results.png"]:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
