#!/usr/bin/env bash
# Set up (first run) and launch the playground on the embedded default model, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
exec python app.py "$@"
