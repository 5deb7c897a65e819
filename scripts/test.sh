#!/usr/bin/env bash
# Set up (first run) and run the test suite (CPU, offline, tiny random models + the default model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
# apt_install COMMAND PACKAGE TEST: Debian's PACKAGE where COMMAND is missing (the package lists refreshed
# once if the first try fails); without it TEST is skipped, and this says so.
apt_install() {
  command -v "$1" >/dev/null 2>&1 && return 0
  $SUDO apt-get install -y -q "$2" >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q "$2" >/dev/null 2>&1; } \
    || echo "warning: could not install $2; $3 will be skipped" >&2
}
# The browser test drives Debian's Chromium (playwright's own browser download is not used).
apt_install chromium chromium "the browser test"
# The kernels' test on a CPU without AVX-512 or AMX emulates one (scripts/avx2_only_check.sh): QEMU's
# user-mode emulator.
apt_install qemu-x86_64 qemu-user "the emulated AVX2-only CPU test"
. .venv/bin/activate
export HF_HUB_OFFLINE=1
# Lint and the written-down style first (rules in ruff.toml), then the types of the method's
# package and the tasks (mypy.ini): seconds each, and they name the line.
ruff check .
mypy
exec python -m pytest -q "$@"
