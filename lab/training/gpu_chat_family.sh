#!/usr/bin/env bash
# General chat's skip-policy family on one CUDA GPU (issue #53): one policy per target speedup
# (1.5x, 2x, 3x), the way the E2E family got there.
#   1. fresh distillation targets: the full model's greedy and SAMPLES sampled continuations of the
#      committed prompt sources (templates x topics, the standard library's docstrings, Magpie turns
#      the model samples itself; WordNet is not on a lease machine), on the GPU (make-data, --seed SEED
#      so the draw is not the shipped policy's);
#   2. the start: the shipped shared policy (INIT, rank 64) cut to rank RANK by truncated SVD
#      (mix-adapters INIT INIT --weight 1 --rank RANK), so the three policies fit the size budget;
#   3. one run per speedup S, side by side, trained ONLY on S's schedules (train --speedup-range S S,
#      every decay, the focused mix), from that start, with an entry bridge of rank BRIDGE
#      (zero-initialised: step 0 is the start), the shipped placement, trimmed targets; the held-out
#      curve (teacher-forced agreement and KL on HELDOUT prompts of assets/prompts/eval.jsonl, never
#      the fact questions) every SAVE steps, copied to OUT_DIR/curves/ as it goes; every checkpoint
#      snapped (a cut run keeps its progress);
#   4. per policy the checkpoint the rule picks (assets/study/gpu-chat-family/RULE.txt, printed first:
#      the best held-out agreement at its own speedup, then the lower KL), exported in bf16 and packed
#      into OUT_DIR (skip-1.5x.tar, skip-2x.tar, skip-3x.tar: untar into a family folder), with the
#      logs (report.tar.gz) and the family's size.
# Every step is a plain `python -m model ...` command; this script runs them side by side and picks.
#   bash lab/training/gpu_chat_family.sh OUT_DIR
# Estimated on an H100 from the logged step times of the chat leases (assets/study/gpu-2026-11-23*:
# 8,427 prompts x 3 continuations in 231 s; three batch-64 rank-64 runs side by side ~80 steps a
# minute each) and the E2E family lease (the GGUF converted in 43 s): convert 45 s, targets (3,000
# templates + 1,000 docstrings + 500 Magpie turns, 2 continuations each: ~9,000) <= DATA_LIMIT 180 s,
# the start made beside them (its SVD on the CPU), the three runs (300 steps of 64 and 7 held-out points
# each) <= TRAIN_LIMIT 300 s, pick and export 30 s: about 9.5 minutes in all, every phase capped (a
# capped phase keeps what it wrote).
# A dry run on the CPU, every stage on a tiny random model made here (3-10 minutes on 2 shared cores, by their load):
#   DRY_RUN=1 bash lab/training/gpu_chat_family.sh OUT
set -uo pipefail
OUT_DIR=${1:?usage: gpu_chat_family.sh OUT_DIR}
DRY_RUN=${DRY_RUN:-0}
WORK=${WORK:-runs/gpu-chat-family}
RULE=${RULE:-assets/study/gpu-chat-family/RULE.txt}
SPEEDUPS=${SPEEDUPS:-1.5 2 3}
INIT=${INIT:-assets/adapters/smollm2-135m-skipdecode}   # the shipped shared policy: every run's start
MODEL=${MODEL:-}                 # empty: the default model (the family's base)
RANK=${RANK:-32}                 # 3 x rank 32 (~18.5 MB each in bf16) + the shared fallback (37 MB) <= 100 MB
BRIDGE=${BRIDGE:-16}
STEPS=${STEPS:-300}
SAVE=${SAVE:-50}                 # checkpoint and held-out point every SAVE steps
BATCH=${BATCH:-64}
LR=${LR:-5e-4}
# > 0: the unlikelihood term the shipped shared policy was continued with (loops kept, each repeated
# 4-gram pushed down). The 2026-11-28 lease ran without it (0) and the family's text repeated itself
# three times as often as the shipped policy's (assets/study/gpu-2026-11-28-chat-family/).
UNLIKELIHOOD=${UNLIKELIHOOD:-0}
HELDOUT=${HELDOUT:-64}           # held-out prompts of the curve (assets/prompts/eval.jsonl has 64)
EVAL_TOKENS=${EVAL_TOKENS:-48}   # the full model's continuation of each, as eval scores it
TEMPLATES=${TEMPLATES:-3000}
PYDOC=${PYDOC:-1000}
MAGPIE=${MAGPIE:-500}
SAMPLES=${SAMPLES:-1}            # sampled continuations per prompt besides the greedy one
NEW_TOKENS=${NEW_TOKENS:-128}
DATA_BATCH=${DATA_BATCH:-512}
SEED=${SEED:-1}
DATA_LIMIT=${DATA_LIMIT:-180}    # seconds the targets may take (make-data appends whole batches: a cut keeps them)
TRAIN_LIMIT=${TRAIN_LIMIT:-300}  # seconds the three runs may take (snapped checkpoints survive a stop)
DEVICE=${DEVICE:-cuda}
WEIGHTS=float                    # the text is written by the float full model
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=${PYTHONPATH:-}${PYTHONPATH:+:}$PWD
mkdir -p "$OUT_DIR/curves" "$WORK/logs"
log() { echo "[$(date +%T)] $*" | tee -a "$WORK/logs/timeline.txt"; }
name_of() { echo "skip-${1}x"; }
report() {
  for s in $SPEEDUPS; do cp "$WORK/$(name_of "$s")/train_log.jsonl" "$WORK/logs/trainlog-$(name_of "$s").jsonl" 2>/dev/null; done
  cp "$WORK/data/manifest.json" "$WORK/logs/data-manifest.json" 2>/dev/null
  tar -C "$WORK/logs" -czf "$OUT_DIR/report.tar.gz" .
}
. "$(dirname "$0")/checkpoint_snaps.sh"  # step_of, snap, snap_last
# the held-out curves, copied out every 10 s while the runs train (a cut lease still brings them back)
curves() { while true; do for s in $SPEEDUPS; do
  cp "$WORK/$(name_of "$s")/train_log.jsonl" "$OUT_DIR/curves/$(name_of "$s").jsonl" 2>/dev/null; done; sleep 10; done; }

if [ "$DRY_RUN" = 1 ]; then
  # Every stage on the CPU, on a tiny random Llama (8 layers, the default model's tokenizer) and a
  # tiny rank-4 policy trained here for one step as the "shipped" start; no Magpie turns (a random
  # model samples turns for minutes and never ends one): minutes of work become seconds.
  DEVICE=cpu RANK=2 BRIDGE=2 STEPS=2 SAVE=1 BATCH=2 HELDOUT=2 EVAL_TOKENS=8 TEMPLATES=4 PYDOC=2 MAGPIE=0 NEW_TOKENS=8 DATA_BATCH=4
  MODEL="$WORK/tiny-model" INIT="$WORK/tiny-start/adapter"
  log "dry run: a tiny model in $MODEL and a tiny start policy in $INIT"
  $PY - "$MODEL" > "$WORK/logs/tiny-model.log" 2>&1 <<'EOF' || { log "the tiny model failed"; exit 1; }
import sys
import torch
import transformers as tf
from model.loading import load_tokenizer, default_model_folder
tokenizer = load_tokenizer(default_model_folder())
torch.manual_seed(0)
config = tf.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=8,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
tf.LlamaForCausalLM(config).save_pretrained(sys.argv[1])
tokenizer.save_pretrained(sys.argv[1])
EOF
  $PY -m model train --model "$MODEL" --output-dir "$WORK/tiny-start" --steps 1 --batch-size 2 --lora-rank 4 \
    --lora-alpha 8 --warmup 1 --max-prompts 2 --continuation-tokens 4 --eval-every 0 --save-every 1 --device cpu \
    > "$WORK/logs/tiny-start.log" 2>&1 || { log "the tiny start policy failed"; exit 1; }
fi
model_args=(); [ -n "$MODEL" ] && model_args=(--model "$MODEL")

log "the rule, written before the run ($RULE):"
cat "$RULE" | tee -a "$WORK/logs/timeline.txt" || { log "no rule at $RULE: nothing runs without one"; exit 1; }
log "device: $($PY -c "import torch; print(torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'cpu', torch.__version__)")"
if [ -z "$MODEL" ]; then
  log "convert the default model once (parallel runs would race on the cache)"
  $PY -c "from model.loading import default_model_folder; default_model_folder()" > "$WORK/logs/convert.log" 2>&1 \
    || { log "convert failed"; report; exit 1; }
fi

rank_of_init=$($PY -c "import json; print(json.load(open('$INIT/adapter_config.json'))['r'])") \
  || { log "no start policy at $INIT"; report; exit 1; }
# The SVD runs on the CPU (seconds on one quiet thread, minutes on 2 busy cores), beside the targets on the GPU.
if [ "$rank_of_init" = "$RANK" ]; then
  cp -r "$INIT" "$WORK/start" & starter=$!
else
  log "the start, beside the targets: $INIT (rank $rank_of_init) cut to rank $RANK by truncated SVD"
  $PY -m model mix-adapters "$INIT" "$INIT" "$WORK/start" --weight 1 --rank "$RANK" --dtype float32 \
    > "$WORK/logs/start.log" 2>&1 & starter=$!
fi

log "fresh targets: $TEMPLATES templates, $PYDOC docstrings, $MAGPIE Magpie turns; greedy + $SAMPLES sampled, $NEW_TOKENS tokens (at most $DATA_LIMIT s)"
timeout "$DATA_LIMIT" $PY -m model make-data "${model_args[@]}" --output-dir "$WORK/data" --device "$DEVICE" \
  --sources magpie,templates,pydoc --magpie-turns "$MAGPIE" --template-prompts "$TEMPLATES" --pydoc-prompts "$PYDOC" \
  --wordnet-prompts 0 --samples "$SAMPLES" --max-new-tokens "$NEW_TOKENS" --batch-size "$DATA_BATCH" --seed "$SEED" \
  --weights "$WEIGHTS" --threads 2 > "$WORK/logs/data.log" 2>&1
sequences=$(wc -l < "$WORK/data/sequences.jsonl" 2>/dev/null || echo 0)
log "targets: $sequences sequences ($(tail -c 300 "$WORK/logs/data.log" | tr '\r' '\n' | tail -1))"
[ "$sequences" -gt 0 ] || { log "no targets were written"; report; exit 1; }
report

wait "$starter" || { log "the start failed ($(tail -1 "$WORK/logs/start.log" 2>/dev/null))"; report; exit 1; }
log "the start: $(tail -1 "$WORK/logs/start.log" 2>/dev/null || echo "$INIT as it is")"
# the start's placement (warmup, order, ranking): the playground's shared placement, kept by every policy.
# The shared policy's measured schedule floor is its own (docs/DESIGN.md, "The schedule's shape"): the
# start drops it, so step 0 is scored, trained and shipped on the solver's shape like every checkpoint.
placement=$($PY - "$WORK/start" <<'EOF'
import json, sys
path = f"{sys.argv[1]}/training_info.json"
info = json.load(open(path))
policy = info.get("skip_policy", {})
if policy.pop("schedule_floor", None) is not None:
    json.dump(info, open(path, "w"), indent=2)
args = ["--warmup", str(policy.get("warmup", 1)), "--order", policy.get("order", "warmup_top")]
if policy.get("ranking"):
    args += ["--ranking", ",".join(str(i) for i in policy["ranking"])]
print(" ".join(args))
EOF
) || { log "the start has no readable placement"; report; exit 1; }

log "policies $SPEEDUPS: $STEPS steps of $BATCH, each on its own speedup's schedules only, rank $RANK, bridge $BRIDGE, unlikelihood $UNLIKELIHOOD ($placement)"
trainers=(); snappers=()
for s in $SPEEDUPS; do
  run="$WORK/$(name_of "$s")"
  mkdir -p "$run"
  # shellcheck disable=SC2086  # $placement is a list of options
  timeout "$TRAIN_LIMIT" $PY -m model train "${model_args[@]}" --output-dir "$run" --sequences "$WORK/data" --trim-loops \
    --init-adapter "$WORK/start" --lora-rank "$RANK" --lora-alpha $((2 * RANK)) --bridge-rank "$BRIDGE" \
    --speedup-range "$s" "$s" --schedule-mix focused $placement --lr "$LR" --unlikelihood "$UNLIKELIHOOD" --warmup-steps 20 \
    --batch-size "$BATCH" --steps "$STEPS" --save-every "$SAVE" --eval-every "$SAVE" --eval-prompts "$HELDOUT" \
    --eval-tokens "$EVAL_TOKENS" --device "$DEVICE" --threads 2 > "$WORK/logs/$(name_of "$s").log" 2>&1 &
  trainers+=($!)
  snap "$run" & snappers+=($!)
done
curves & snappers+=($!)
wait "${trainers[@]}"  # a run stopped by TRAIN_LIMIT keeps its snapped checkpoints (the steps after the last are lost)
kill "${snappers[@]}" 2>/dev/null; wait "${snappers[@]}" 2>/dev/null
for s in $SPEEDUPS; do
  snap_last "$WORK/$(name_of "$s")"
  cp "$WORK/$(name_of "$s")/train_log.jsonl" "$OUT_DIR/curves/$(name_of "$s").jsonl" 2>/dev/null
  log "$(name_of "$s"): $(tail -c 300 "$WORK/logs/$(name_of "$s").log" | tr '\r' '\n' | tail -1)"
done
report

log "per policy, the rule's pick: the best held-out agreement at its own speedup, then the lower KL"
$PY lab/training/chat_family_pick.py "$WORK" $SPEEDUPS > "$WORK/logs/picked.txt" 2>> "$WORK/logs/timeline.txt"
tee -a "$WORK/logs/timeline.txt" < "$WORK/logs/picked.txt"
while read -r s pick _; do
  name=$(name_of "$s")
  case "$pick" in
    none) log "$name: no checkpoint was scored" ;;
    *) $PY -m model export-adapter "$pick" "$WORK/export/$name" > "$WORK/logs/export-$name.log" 2>&1 \
         && tar -C "$WORK/export" -cf "$OUT_DIR/$name.tar" "$name" && log "packed $name from $pick" ;;
  esac
done < "$WORK/logs/picked.txt"
log "the family's size (bf16): $(du -cb "$WORK"/export/skip-*/adapter_model.safetensors "$WORK"/export/skip-*/*bridge* 2>/dev/null | tail -1 | cut -f1) bytes"
log "done"
report
