#!/usr/bin/env bash
# Distillation data at scale, offline: installs the one Debian text package the wordnet source
# reads (wordnet-base) when it is missing, then runs (or resumes) `python -m model make-data`.
# Extra arguments go to make-data, e.g. `bash scripts/make_data.sh --threads 1`.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f /usr/share/wordnet/data.noun ]; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi
  $SUDO apt-get install -y -q wordnet-base >/dev/null 2>&1 \
    || { $SUDO apt-get update -q >/dev/null 2>&1 && $SUDO apt-get install -y -q wordnet-base >/dev/null 2>&1; } \
    || echo "make_data: could not install wordnet-base; the wordnet source will be skipped" >&2
fi
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1
exec python -m model make-data "$@"
