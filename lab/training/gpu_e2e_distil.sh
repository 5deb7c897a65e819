#!/usr/bin/env bash
# The E2E skip policies distilled from the shipped task model on one CUDA GPU: the task model's
# greedy descriptions of the training MRs and of SYNTH new ones, INVENTED of them about invented
# places so that a policy learns to copy a place (one pass, one file shared by every run), then
# the 2x, 3x, 4x, 5x and shared policies side by side, each from its shipped weights
# (`--init-adapter`), checkpoints every SAVE steps; then every checkpoint (and the shipped weights,
# "step 0") scored on the held-out devset MRs as written and on their rewritten copies (pubs,
# restaurants, the other cuisines), never the test set, and on LONG new MRs naming all eight
# attributes about invented held-out places, against the task model's own text (logs/long-*.jsonl,
# reported beside the pick), and on SPARSE new MRs with few facts, how often a policy makes up a
# fact the task model's text does not (logs/sparse-*.jsonl, reported); then, per policy, the
# checkpoint with the best mean of the two held-out BLEUs is exported in bf16 and packed into
# OUT_DIR (one tar each), with the logs, scores and targets (report.tar.gz).
# Every step is a plain `python -m model ...` or lab/training/task_heldout_curve.py command; this script
# runs them in parallel and picks.
#   bash lab/training/gpu_e2e_distil.sh OUT_DIR
# A dry run on a CPU: DEVICE=cpu STEPS=2 SAVE=1 SYNTH=4 HELDOUT=2 LONG=4 SPARSE=4 POLICIES="3 all" bash lab/training/gpu_e2e_distil.sh OUT
# (the study of 2026-11-26 ran it before invented places existed: INVENTED=0 LONG=0 SPARSE=0 reproduces it;
# SHARE=0.5 draws the synthetic MRs with fewer facts: train-task --synthetic-attribute-share; BRIDGE=16 adds
# an entry bridge to every policy, zero-initialised on top of its shipped weights: train-task --bridge-rank;
# TASK_ADAPTER=DIR distils another task model and runs every policy on it (train-task --task-adapter);
# INIT_ROOT=DIR takes the starting weights from DIR/skip-2x ... DIR/skip-all instead of assets/adapters/e2e;
# TARGETS_FILE=FILE adopts a distillation file made earlier from the same source instead of a pass)
set -uo pipefail
OUT_DIR=${1:?usage: gpu_e2e_distil.sh OUT_DIR}
WORK=${WORK:-runs/gpu-distil}
STEPS=${STEPS:-400}
SAVE=${SAVE:-100}
SYNTH=${SYNTH:-3000}
INVENTED=${INVENTED:-0.5}         # the share of the synthetic MRs about invented places (train-task --invented-places)
SHARE=${SHARE:-0.75}              # each optional attribute's chance in a synthetic MR (train-task --synthetic-attribute-share)
SPARSE=${SPARSE:-100}             # new MRs with few facts: facts made up beyond the task model's (reported)
BRIDGE=${BRIDGE:-0}               # > 0: each policy also learns an entry bridge of this rank (train-task --bridge-rank)
BATCH=${BATCH:-32}
DEVICE=${DEVICE:-cuda}
HELDOUT=${HELDOUT:-50}
LONG=${LONG:-100}                 # new eight-attribute MRs about invented held-out places: near place named (reported)
TRAIN_LIMIT=${TRAIN_LIMIT:-270}   # seconds the training phase may take (checkpoints survive a stop)
POLICIES=${POLICIES:-2 3 4 5 all}
INIT_ROOT=${INIT_ROOT:-assets/adapters/e2e}   # the starting weights: INIT_ROOT/skip-2x ... skip-all
TASK_ADAPTER=${TASK_ADAPTER:-}    # empty: the shipped task model
TARGETS_FILE=${TARGETS_FILE:-}    # empty: the task model's pass here
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${PYTHONPATH:-}${PYTHONPATH:+:}$PWD
mkdir -p "$OUT_DIR" "$WORK/logs"
log() { echo "[$(date +%T)] $*" | tee -a "$WORK/logs/timeline.txt"; }
shipped() { if [ "$1" = all ]; then echo "$INIT_ROOT/skip-all"; else echo "$INIT_ROOT/skip-${1}x"; fi; }
on_task=(); [ -n "$TASK_ADAPTER" ] && on_task=(--task-adapter "$TASK_ADAPTER")
report() {
  for p in $POLICIES; do
    cp "$WORK/skip-$p/train_log.jsonl" "$WORK/logs/trainlog-skip-$p.jsonl" 2>/dev/null
  done
  cp "$WORK/targets/distilled.jsonl" "$WORK/targets/distilled.source.json" "$WORK/logs/" 2>/dev/null
  tar -C "$WORK/logs" -czf "$OUT_DIR/report.tar.gz" .
}
. "$(dirname "$0")/checkpoint_snaps.sh"  # step_of, snap, snap_last

log "device: $($PY -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', torch.__version__)")"
log "distillation targets: the task model's descriptions of the training MRs and $SYNTH new ones ($INVENTED of them about invented places)"
$PY - > "$WORK/logs/targets.log" 2>&1 <<EOF || { log "targets failed"; report; exit 1; }
from model.tasks.task_training import TaskRun, training_file
print(training_file(TaskRun(policy="3", targets="task-model", synthetic_mrs=$SYNTH, invented_places=$INVENTED,
                            synthetic_attribute_share=$SHARE, device="$DEVICE", output_dir="$WORK/targets",
                            task_adapter="$TASK_ADAPTER" or None, targets_file="$TARGETS_FILE" or None)))
EOF
log "targets: $(wc -l < "$WORK/targets/distilled.jsonl") descriptions"

log "policies $POLICIES: $STEPS steps of $BATCH, from the shipped weights"
snappers=(); trainers=()
for p in $POLICIES; do
  run="$WORK/skip-$p"
  mkdir -p "$run"
  cp "$WORK/targets/distilled.jsonl" "$WORK/targets/distilled.source.json" "$run/"  # same source: reused
  lr=3e-4; [ "$p" = 2 ] && lr=2e-4
  timeout "$TRAIN_LIMIT" $PY -m model train-task e2e --policy "$p" --targets task-model --synthetic-mrs "$SYNTH" \
    --invented-places "$INVENTED" --synthetic-attribute-share "$SHARE" --bridge-rank "$BRIDGE" \
    --init-adapter "$(shipped "$p")" "${on_task[@]}" --steps "$STEPS" --lr "$lr" --batch-size "$BATCH" --save-every "$SAVE" \
    --threads 2 --device "$DEVICE" --heldout-mrs 0 --output-dir "$run" > "$WORK/logs/skip-$p.log" 2>&1 &
  trainers+=($!)
  snap "$run" & snappers+=($!)
done
wait "${trainers[@]}"  # a run stopped by TRAIN_LIMIT keeps its last checkpoint (the steps after it are lost)
kill "${snappers[@]}" 2>/dev/null; wait "${snappers[@]}" 2>/dev/null
for p in $POLICIES; do snap_last "$WORK/skip-$p"; done
for p in $POLICIES; do log "skip-$p: $(tail -c 300 "$WORK/logs/skip-$p.log" | tr '\r' '\n' | tail -1)"; done
report

log "held-out scores of every checkpoint and the shipped weights (as written; rewritten copies)"
for p in $POLICIES; do
  speeds=$p; [ "$p" = all ] && speeds="2 3 5"
  ckpts=$(ls -d "$WORK/skip-$p"/adapter-step-[0-9]* 2>/dev/null | grep -E 'adapter-step-[0-9]+$' | sort -V)
  for s in $speeds; do
    $PY lab/training/task_heldout_curve.py "$(shipped "$p")" $ckpts --speedup "$s" --relexicalised 0 2 --mrs "$HELDOUT" \
      "${on_task[@]}" --device "$DEVICE" --no-task-model > "$WORK/logs/heldout-skip-$p-$s.jsonl" 2> "$WORK/logs/heldout-skip-$p-$s.err" &
    [ "$LONG" -gt 0 ] && $PY lab/training/task_heldout_curve.py "$(shipped "$p")" $ckpts --speedup "$s" --relexicalised \
      --long "$LONG" --invented-places "${on_task[@]}" --device "$DEVICE" > "$WORK/logs/long-skip-$p-$s.jsonl" 2> "$WORK/logs/long-skip-$p-$s.err" &
    [ "$SPARSE" -gt 0 ] && $PY lab/training/task_heldout_curve.py "$(shipped "$p")" $ckpts --speedup "$s" --relexicalised \
      --sparse "$SPARSE" "${on_task[@]}" --device "$DEVICE" > "$WORK/logs/sparse-skip-$p-$s.jsonl" 2> "$WORK/logs/sparse-skip-$p-$s.err" &
  done
done
wait
report

log "per policy: the best mean of the two held-out BLEUs (at all its speedups for the shared one)"
$PY - "$WORK" "$POLICIES" > "$WORK/logs/picked.txt" <<'EOF'
import glob, json, sys
from collections import defaultdict
work, policies = sys.argv[1], sys.argv[2].split()
for policy in policies:
    bleus = defaultdict(list)
    for path in glob.glob(f"{work}/logs/heldout-skip-{policy}-*.jsonl"):
        speed = path.rsplit("-", 1)[1].removesuffix(".jsonl") + "x"  # heldout-skip-P-S.jsonl scores speed S
        for line in open(path):
            try:
                row = json.loads(line)
                bleus[row["adapter"]].append(row[speed]["bleu"])
            except (ValueError, KeyError):
                print(f"# {path}: a line that is not a score, skipped", file=sys.stderr)
    full = max((len(scores) for scores in bleus.values()), default=0)
    complete = {a: b for a, b in bleus.items() if len(b) == full}  # every set and speed scored: comparable means
    ranked = sorted(complete.items(), key=lambda item: -sum(item[1]) / len(item[1]))
    print(policy, ranked[0][0] if ranked else "none", *(f"{a}={sum(b) / len(b):.2f}" for a, b in ranked))
EOF
cat "$WORK/logs/picked.txt" | tee -a "$WORK/logs/timeline.txt"
while read -r p best _; do
  case "$best" in *adapter-step-*)
    name=skip-${p}x; [ "$p" = all ] && name=skip-all
    $PY -m model export-adapter "$best" "$WORK/export/$name" > "$WORK/logs/export-$name.log" 2>&1 \
      && tar -C "$WORK/export" -cf "$OUT_DIR/$name.tar" "$name" && log "packed $name from $best" ;;
  none) log "skip-$p: nothing was scored" ;;
  *) log "skip-$p: the shipped weights stay best" ;;
  esac
done < "$WORK/logs/picked.txt"
log "done"
report
