#!/usr/bin/env bash
# A new E2E family on one CUDA GPU: a task model trained on the references that mention every fact
# of their MR (train-task --complete-references, with two rewritten copies of each MR), two arms
# side by side (continuing the shipped task model; from the default model), every checkpoint scored
# at 1x on the held-out devset MRs as written and rewritten beside the shipped task model and any
# CANDIDATES; the best mean is exported (bf16) and every skip policy distilled from it
# (lab/training/gpu_e2e_distil.sh with TASK_ADAPTER). With BRIDGE_ALSO=R the shipped family's 3x policy
# also learns an entry bridge of rank R from the shipped task model's own targets, side by side.
# Nothing here reads the test set. Every run is a plain `python -m model ...` command.
#   bash lab/training/gpu_e2e_family.sh OUT_DIR
# A dry run on a CPU: DEVICE=cpu TASK_STEPS_CONT=2 TASK_STEPS_SCRATCH=2 TASK_SAVE=1 HELDOUT=2 \
#   DISTIL_ENV="STEPS=2 SAVE=1 SYNTH=4 HELDOUT=2 LONG=0 SPARSE=4 POLICIES=3" BRIDGE_ENV="STEPS=2 SAVE=1 SPARSE=0" \
#   bash lab/training/gpu_e2e_family.sh OUT
# WAIT_FOR=FILE holds the policy phase until FILE exists (the starting weights may arrive later).
set -uo pipefail
OUT_DIR=${1:?usage: gpu_e2e_family.sh OUT_DIR}
WORK=${WORK:-runs/gpu-family}
INIT_ROOT=${INIT_ROOT:-assets/adapters/e2e}   # the shipped family: task, skip-2x ... skip-all
TASK_STEPS_CONT=${TASK_STEPS_CONT:-240}        # continuing the shipped task model
TASK_LR_CONT=${TASK_LR_CONT:-3e-4}
TASK_STEPS_SCRATCH=${TASK_STEPS_SCRATCH:-360}  # from the default model
TASK_LR_SCRATCH=${TASK_LR_SCRATCH:-1e-3}
TASK_SAVE=${TASK_SAVE:-40}
TASK_LIMIT=${TASK_LIMIT:-150}    # seconds the task phase may train (checkpoints survive a stop)
CANDIDATES=${CANDIDATES:-}       # task adapters made elsewhere, scored beside the new checkpoints
HELDOUT=${HELDOUT:-50}
BATCH=${BATCH:-32}
DEVICE=${DEVICE:-cuda}
BRIDGE_ALSO=${BRIDGE_ALSO:-0}
WAIT_FOR=${WAIT_FOR:-}
WAIT_LIMIT=${WAIT_LIMIT:-300}
DISTIL_ENV=${DISTIL_ENV:-}       # extra settings for the family's lab/training/gpu_e2e_distil.sh run
BRIDGE_ENV=${BRIDGE_ENV:-}       # extra settings for the bridge's run
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${PYTHONPATH:-}${PYTHONPATH:+:}$PWD
mkdir -p "$OUT_DIR" "$WORK/logs"
log() { echo "[$(date +%T)] $*" | tee -a "$WORK/logs/timeline.txt"; }
report() {
  for arm in cont scratch; do cp "$WORK/task-$arm/train_log.jsonl" "$WORK/logs/trainlog-task-$arm.jsonl" 2>/dev/null; done
  tar -C "$WORK/logs" -czf "$OUT_DIR/report-task.tar.gz" .
}
. "$(dirname "$0")/checkpoint_snaps.sh"  # step_of, snap, snap_last

log "device: $($PY -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', torch.__version__)")"
log "convert the default model once (parallel runs would race on the cache)"
$PY -c "from model.loading import default_model_folder; default_model_folder()" > "$WORK/logs/convert.log" 2>&1 || { log "convert failed"; report; exit 1; }

log "task model on complete references: continuing the shipped one ($TASK_STEPS_CONT steps, lr $TASK_LR_CONT) and from the default model ($TASK_STEPS_SCRATCH, lr $TASK_LR_SCRATCH)"
common=(--policy task --relexicalised 2 --complete-references --batch-size "$BATCH" --save-every "$TASK_SAVE"
        --threads 2 --device "$DEVICE" --heldout-mrs 0)
timeout "$TASK_LIMIT" $PY -m model train-task e2e "${common[@]}" --init-adapter "$INIT_ROOT/task" --steps "$TASK_STEPS_CONT" \
  --lr "$TASK_LR_CONT" --output-dir "$WORK/task-cont" > "$WORK/logs/task-cont.log" 2>&1 &
trainers=($!)
timeout "$TASK_LIMIT" $PY -m model train-task e2e "${common[@]}" --steps "$TASK_STEPS_SCRATCH" \
  --lr "$TASK_LR_SCRATCH" --output-dir "$WORK/task-scratch" > "$WORK/logs/task-scratch.log" 2>&1 &
trainers+=($!)
snappers=()
for arm in cont scratch; do mkdir -p "$WORK/task-$arm"; snap "$WORK/task-$arm" & snappers+=($!); done
wait "${trainers[@]}"
kill "${snappers[@]}" 2>/dev/null; wait "${snappers[@]}" 2>/dev/null
for arm in cont scratch; do
  snap_last "$WORK/task-$arm"
  log "task-$arm: $(tail -c 300 "$WORK/logs/task-$arm.log" | tr '\r' '\n' | tail -1)"
done
report

log "every task checkpoint, the shipped task model and the candidates at 1x on the held-out MRs (as written; rewritten copies)"
$PY lab/training/task_heldout_curve.py "$INIT_ROOT/task" $CANDIDATES --speedup 1 --relexicalised 0 2 --mrs "$HELDOUT" \
  --device "$DEVICE" > "$WORK/logs/heldout-task-start.jsonl" 2> "$WORK/logs/heldout-task-start.err" &
for arm in cont scratch; do
  ckpts=$(ls -d "$WORK/task-$arm"/adapter-step-[0-9]* 2>/dev/null | grep -E 'adapter-step-[0-9]+$' | sort -V)
  [ -n "$ckpts" ] && $PY lab/training/task_heldout_curve.py $ckpts --speedup 1 --relexicalised 0 2 --mrs "$HELDOUT" \
    --device "$DEVICE" > "$WORK/logs/heldout-task-$arm.jsonl" 2> "$WORK/logs/heldout-task-$arm.err" &
done
wait
best=$($PY - "$WORK" <<'EOF'
import glob, json, sys
from collections import defaultdict
bleus = defaultdict(list)
for path in glob.glob(f"{sys.argv[1]}/logs/heldout-task-*.jsonl"):
    for line in open(path):
        try:
            row = json.loads(line)
            bleus[row["adapter"]].append(row["1x"]["bleu"])
        except (ValueError, KeyError):
            pass
complete = {a: b for a, b in bleus.items() if len(b) == 2}  # as written and rewritten
ranked = sorted(complete.items(), key=lambda item: -sum(item[1]) / 2)
print(" ".join(f"{a}={sum(b) / 2:.2f}" for a, b in ranked), file=sys.stderr)
print(ranked[0][0] if ranked else "")
EOF
) 2>> "$WORK/logs/timeline.txt"
tail -1 "$WORK/logs/timeline.txt"
[ -n "$best" ] || { log "no task checkpoint was scored"; report; exit 1; }
log "task model: $best"
$PY -m model export-adapter "$best" "$WORK/task-pick/task" > "$WORK/logs/export-task.log" 2>&1 || { log "export failed"; report; exit 1; }
tar -C "$WORK/task-pick" -cf "$OUT_DIR/task.tar" task
report

if [ -n "$WAIT_FOR" ]; then
  log "waiting for $WAIT_FOR (at most $WAIT_LIMIT s)"
  for _ in $(seq "$WAIT_LIMIT"); do [ -e "$WAIT_FOR" ] && break; sleep 1; done
  [ -e "$WAIT_FOR" ] || { log "$WAIT_FOR never came"; report; exit 1; }
fi

if [ "$BRIDGE_ALSO" -gt 0 ]; then
  log "the shipped family's 3x with an entry bridge of rank $BRIDGE_ALSO, on the shipped task model's targets"
  mkdir -p "$OUT_DIR/bridge"
  gunzip -c assets/study/gpu-2026-11-26-e2e-distil/distilled.jsonl.gz > "$WORK/shipped-targets.jsonl"
  cp assets/study/gpu-2026-11-26-e2e-distil/distilled.source.json "$WORK/shipped-targets.source.json"
  env WORK="$WORK/bridge" POLICIES=3 BRIDGE="$BRIDGE_ALSO" INIT_ROOT="$INIT_ROOT" TASK_ADAPTER="$INIT_ROOT/task" \
    TARGETS_FILE="$WORK/shipped-targets.jsonl" INVENTED=0 DEVICE="$DEVICE" HELDOUT="$HELDOUT" LONG=0 $BRIDGE_ENV \
    bash lab/training/gpu_e2e_distil.sh "$OUT_DIR/bridge" > "$WORK/logs/bridge.log" 2>&1 &
fi
log "the family's skip policies, distilled from $best"
mkdir -p "$OUT_DIR/family"
env WORK="$WORK/family" INIT_ROOT="$INIT_ROOT" TASK_ADAPTER="$WORK/task-pick/task" DEVICE="$DEVICE" HELDOUT="$HELDOUT" \
  $DISTIL_ENV bash lab/training/gpu_e2e_distil.sh "$OUT_DIR/family" > "$WORK/logs/family.log" 2>&1
wait
log "done"
report
