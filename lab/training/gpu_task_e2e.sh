#!/usr/bin/env bash
# The E2E task on one CUDA GPU: the task model (rank 16, with rank 8 and 32 beside it to measure
# the rank the task needs), then its skip policies side by side (2x, 3x, 4x, 5x, all, and 3x with
# KL to the task model), then the float32 test-set evaluation. Every run is a plain
# `python -m model train-task` / `eval-task` command; this script only runs them in parallel
# (a 135M model leaves a GPU mostly idle) and packs each bfloat16 adapter into OUT_DIR as soon as
# it exists (one tar each), then the logs, summaries and evaluation (report.tar.gz).
#   bash lab/training/gpu_task_e2e.sh OUT_DIR
set -uo pipefail
OUT_DIR=${1:-runs/gpu-e2e-out}
WORK=runs/gpu-e2e
mkdir -p "$OUT_DIR" "$WORK/logs"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
STEPS_TASK=${STEPS_TASK:-400}
STEPS_POLICY=${STEPS_POLICY:-600}
BATCH=${BATCH:-32}
PY=${PYTHON:-python3}
TRAIN_LIMIT=${TRAIN_LIMIT:-150}    # seconds a training phase may take; checkpoints every 100 steps
DEVICE=${DEVICE:-cuda}
HELDOUT=${HELDOUT:-50}          # held-out MRs each run scores itself on
EVAL_ARGS=${EVAL_ARGS:-}        # e.g. "--mrs 4" for a dry run on a CPU
SAVE=$(( STEPS_POLICY < 100 ? STEPS_POLICY : 100 ))
common="--device $DEVICE --batch-size $BATCH --save-every $SAVE --threads 2 --heldout-mrs $HELDOUT"
log() { echo "[$(date +%T)] $*" | tee -a "$WORK/logs/timeline.txt"; }
pack() { tar -C assets/adapters/e2e -cf "$OUT_DIR/$1.tar" "$1"; }
report() { cp runs/e2e-*/summary.json "$WORK/logs/" 2>/dev/null
  for f in runs/e2e-*/summary.json; do cp "$f" "$WORK/logs/summary-$(basename "$(dirname "$f")").json"; done
  for f in runs/e2e-*/train_log.jsonl; do cp "$f" "$WORK/logs/trainlog-$(basename "$(dirname "$f")").jsonl"; done
  tar -C "$WORK" -czf "$OUT_DIR/report.tar.gz" .; }

log "convert the default model once (parallel runs would race on the cache)"
$PY -c "from model.loading import default_model_folder; default_model_folder()" || exit 1

log "task model: rank 16 (shipped), 8 and 32 (the rank study), $STEPS_TASK steps of $BATCH"
for rank in 16 8 32; do
  timeout "$TRAIN_LIMIT" $PY -m model train-task e2e --policy task --lora-rank "$rank" --steps "$STEPS_TASK" \
    $common --output-dir "runs/e2e-task-r$rank" > "$WORK/logs/task-r$rank.log" 2>&1 &
done
wait
$PY -m model export-adapter runs/e2e-task-r16/adapter assets/adapters/e2e/task || { report; exit 1; }
pack task
report

log "skip policies on the task model, $STEPS_POLICY steps of $BATCH"
for policy in 2 3 4 5 all; do
  timeout "$TRAIN_LIMIT" $PY -m model train-task e2e --policy "$policy" --steps "$STEPS_POLICY" $common \
    --output-dir "runs/e2e-skip-$policy" > "$WORK/logs/skip-$policy.log" 2>&1 &
done
timeout "$TRAIN_LIMIT" $PY -m model train-task e2e --policy 3 --kl-weight 1 --steps "$STEPS_POLICY" $common \
  --output-dir runs/e2e-skip-3-kl1 > "$WORK/logs/skip-3-kl1.log" 2>&1 &
wait
for policy in 2 3 4 5; do
  $PY -m model export-adapter "runs/e2e-skip-$policy/adapter" "assets/adapters/e2e/skip-${policy}x" && pack "skip-${policy}x"
done
$PY -m model export-adapter runs/e2e-skip-all/adapter assets/adapters/e2e/skip-all && pack skip-all
mkdir -p runs/kl-root/e2e && cp -r assets/adapters/e2e/task runs/kl-root/e2e/task
$PY -m model export-adapter runs/e2e-skip-3-kl1/adapter runs/kl-root/e2e/skip-3x
report

log "float32 evaluation on the 630 test MRs (one batch: lock-step decoding)"
timeout 180 $PY -m model eval-task e2e --device $DEVICE --batch-size 640 --speed-mrs 0 $EVAL_ARGS \
  --output "$WORK/eval" > "$WORK/logs/eval.log" 2>&1
timeout 45 $PY -m model eval-task e2e --device $DEVICE --batch-size 640 --speed-mrs 0 $EVAL_ARGS --speedups 3 \
  --no-baselines --adapters runs/kl-root --output "$WORK/eval-kl" > "$WORK/logs/eval-kl.log" 2>&1
log "done"
report
