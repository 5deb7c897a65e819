#!/usr/bin/env bash
# Set up (first run) and run the test suite (CPU, offline, tiny random models + the default model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1
exec python -m pytest -q "$@"
