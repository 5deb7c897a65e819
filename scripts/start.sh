#!/usr/bin/env bash
# Set up (first run) and launch the playground on the embedded default model, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
# glibc gives every worker thread its own malloc arena; a server with many request threads then
# keeps growing its resident memory. Two arenas keep it flat under load (scripts/load_test.py).
export MALLOC_ARENA_MAX="${MALLOC_ARENA_MAX:-2}"
exec python app.py "$@"
