"""Time `bash scripts/start.sh` to a served page: every line it prints, stamped with the seconds
since launch, then the time until http://127.0.0.1:PORT answers 200. Stops the server after.

    python lab/serving/time_start.py           # a warm start (the caches already filled)
    python lab/serving/time_start.py --cold    # an empty model cache: the one-time conversion and packing

The start-up figures (README, docs/SERVING.md) come from this script (run it twice: the first run fills the caches).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def served(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cold", action="store_true", help="start with an empty SKIPDECODE_CACHE_DIR")
    parser.add_argument("--port", type=int, default=7871)
    parser.add_argument("--timeout", type=float, default=600.0)
    args, extra = parser.parse_known_args()
    env = dict(os.environ, GRADIO_SERVER_PORT=str(args.port))
    scratch = tempfile.TemporaryDirectory() if args.cold else None
    if scratch:
        env["SKIPDECODE_CACHE_DIR"] = scratch.name
    start = time.perf_counter()
    process = subprocess.Popen(["bash", "scripts/start.sh", *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def echo() -> None:
        for line in process.stdout:
            print(f"[{time.perf_counter() - start:6.1f} s] {line.rstrip()}", flush=True)

    threading.Thread(target=echo, daemon=True).start()
    url = f"http://127.0.0.1:{args.port}/"
    try:
        while not served(url):
            if process.poll() is not None:
                print(f"start.sh exited with {process.returncode} before serving", file=sys.stderr)
                return 1
            if time.perf_counter() - start > args.timeout:
                print(f"not served after {args.timeout:.0f} s", file=sys.stderr)
                return 1
            time.sleep(0.1)
        seconds = time.perf_counter() - start
        print(f"{'cold' if args.cold else 'warm'} start: page served after {seconds:.1f} s ({url})", flush=True)
        return 0
    finally:
        stop(process)
        if scratch:
            scratch.cleanup()


def stop(process: subprocess.Popen) -> None:
    """Terminate start.sh and the server it started (its whole process group)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=30)
            return
        except subprocess.TimeoutExpired:
            continue


if __name__ == "__main__":
    sys.exit(main())
