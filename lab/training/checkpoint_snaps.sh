#!/usr/bin/env bash
# Sourced by the GPU scripts (gpu_e2e_distil.sh, gpu_e2e_family.sh): copies of a training run's
# checkpoints. The trainer keeps one adapter/, overwritten at every save; these keep each save as
# adapter-step-N so every checkpoint can be scored afterwards. Needs $PY (the Python to run).

# The step a checkpoint folder's training_info.json says (empty if unreadable).
step_of() { $PY -c "import json; print(json.load(open('$1/training_info.json'))['step'])" 2>/dev/null; }

# adapter/ -> adapter-step-N whenever the run's training_info.json says step N, until killed; the
# copy is named by the step its own training_info.json says, read after copying
snap() {
  local run=$1 n copied
  while true; do
    n=$(step_of "$run/adapter")
    if [ -n "$n" ] && [ ! -d "$run/adapter-step-$n" ]; then
      sleep 2; rm -rf "$run/copy.partial"
      if cp -r "$run/adapter" "$run/copy.partial"; then
        copied=$(step_of "$run/copy.partial")
        if [ -n "$copied" ] && [ ! -d "$run/adapter-step-$copied" ]; then mv "$run/copy.partial" "$run/adapter-step-$copied"; fi
      fi
    fi
    sleep 3
  done
}

# After the trainer and its snapper stopped: the last save, if the snapper had not copied it yet;
# no half copies left behind
snap_last() {
  local run=$1 n
  rm -rf "$run/copy.partial"
  n=$(step_of "$run/adapter")
  if [ -n "$n" ] && [ ! -d "$run/adapter-step-$n" ]; then cp -r "$run/adapter" "$run/adapter-step-$n"; fi
}
