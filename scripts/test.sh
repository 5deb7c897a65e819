#!/usr/bin/env bash
# Set up (first run) and run the test suite (CPU, offline, tiny random models + the default model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
# The browser test drives Debian's Chromium (playwright's own browser download is not used).
if ! command -v chromium >/dev/null 2>&1; then
  $SUDO apt-get install -y -q chromium >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q chromium >/dev/null 2>&1; } \
    || echo "warning: could not install chromium; the browser test will be skipped" >&2
fi
# The kernels' test on a CPU without AVX-512 or AMX emulates one (scripts/avx2_only_check.sh): QEMU's
# user-mode emulator.
if ! command -v qemu-x86_64 >/dev/null 2>&1; then
  $SUDO apt-get install -y -q qemu-user >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q qemu-user >/dev/null 2>&1; } \
    || echo "warning: could not install qemu-user; the emulated AVX2-only CPU test will be skipped" >&2
fi
. .venv/bin/activate
export HF_HUB_OFFLINE=1
# Lint and the written-down style first (rules in ruff.toml), then the types of the method's
# package and the tasks (mypy.ini): seconds each, and they name the line.
ruff check .
mypy
exec python -m pytest -q "$@"
