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


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = start_server(port)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1300})
            page.goto(f"http://127.0.0.1:{port}/")
            page.wait_for_selector("#generate-btn", timeout=120_000)
            page.fill("textarea", "Write a short story about a robot who learns to paint.")
            page.click("#generate-btn")
            deadline = time.time() + 180
            while time.time() < deadline and "Done" not in page.inner_text("#status"):
                time.sleep(0.5)
            time.sleep(1.0)
            page.screenshot(path=str(OUT / "playground.png"), full_page=True)
            page.click("button[role=tab]:has-text('Results')")
            time.sleep(3)
            page.screenshot(path=str(OUT / "results.png"), full_page=True)
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
    print(f"wrote {OUT / 'playground.png'} and {OUT / 'results.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
