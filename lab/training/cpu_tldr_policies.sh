#!/usr/bin/env bash
# The Reddit TL;DR skip policies on a CPU, end to end, as the committed ones were made: the task model's
# TL;DRs of the distillation posts (made once, runs/tldr-summaries.jsonl), one gated LoRA per speedup
# (3x, then 2x, 5x, 4x in one process: the prompts' prefill is shared), the held-out pick of each
# (model/tasks/tldr_pick.py: the rule; the chosen checkpoint goes to assets/adapters/tldr/skip-<S>x,
# the record to assets/eval/tldr-picks.json), then the test-set evaluation (assets/eval/tldr.*).
#   bash lab/training/cpu_tldr_policies.sh [train|pick|eval|all|round2|round3|round4|round5|round6]
# A stopped training run continues with RESUME=1 (each speedup from its newest checkpoint, every 50
# steps; its log: runs/tldr-train.log).
# round2: 3x and 5x again, each from its shipped policy, cross-entropy + KL to the task model, 200 steps at
# lr 2e-4, then the pick (the shipped policy a candidate too). round3: 320 posts more from varied titles,
# then 3x and 5x from the shipped policies on all the usable posts, cross-entropy only, picked the same
# way. round4: 3x from a fresh LoRA on all 472 usable posts, the first round's recipe (300 steps, lr 5e-4).
# round5: 3x from the shipped policy, cross-entropy with the tokens its greedy choice gets wrong weighing 3
# (--flip-weight 2: one wrong early token sends a summary off its post, the subject lost), 200 steps at lr 2e-4.
# round6: 3x from a fresh LoRA in the front shape (--shape front: the first 8 tokens at 22 layers, then 6; the same
# average depth over 32 tokens), the first round's recipe (300 steps, lr 5e-4).
# Each ends with the evaluation of only the speedups that ran (--rerun: the other arms are kept).
set -euo pipefail
cd "$(dirname "$0")/../.."
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
STAGE=${1:-all}
SPEEDUPS="3 2 5 4"
resume=$([ "${RESUME:-0}" = 1 ] && echo --resume || echo --no-resume)
set_aside() {  # a round's runs go to runs/<round>/ when it ends, so the next round's pick reads only its own
  mkdir -p "runs/$STAGE" && mv "$@" "runs/$STAGE/"
}
round() {  # $1: extra train-task options; the speedups' runs go to runs/tldr-skip-<S>x
  python -m model train-task tldr --speedup 3 --then 5 --steps 200 --batch-size 8 --lr 2e-4 --from-shipped \
    --save-every 50 --threads 2 $1 $resume 2>&1 | tee -a "runs/tldr-train-$STAGE.log"
  for s in 3 5; do
    python -m model pick-policy tldr --speedup "$s" --run "runs/tldr-skip-${s}x" --device cpu
  done
  set_aside runs/tldr-skip-3x runs/tldr-skip-5x
  python -m model eval-task tldr --device cpu --threads 2 --rerun 3,5
  python -m model results
}
round_3x() {  # $1: train-task options; 3x alone, its run in runs/tldr-skip-3x
  python -m model train-task tldr --speedup 3 --batch-size 8 --save-every 50 --threads 2 $1 $resume 2>&1 \
    | tee -a "runs/tldr-train-$STAGE.log"
  python -m model pick-policy tldr --speedup 3 --run runs/tldr-skip-3x --device cpu
  set_aside runs/tldr-skip-3x
  python -m model eval-task tldr --device cpu --threads 2 --rerun 3
  python -m model results
}
if [ "$STAGE" = round2 ]; then
  round "--kl-weight 1"
  exit 0
fi
if [ "$STAGE" = round3 ]; then
  python -m model task-posts tldr --count 320 --seed 1 --varied
  round "--kl-weight 0"
  exit 0
fi
if [ "$STAGE" = round4 ]; then
  round_3x "--steps 300"
  exit 0
fi
if [ "$STAGE" = round5 ]; then
  round_3x "--steps 200 --lr 2e-4 --from-shipped --flip-weight 2"
  exit 0
fi
if [ "$STAGE" = round6 ]; then
  round_3x "--shape front --steps 300"
  exit 0
fi
if [ "$STAGE" = train ] || [ "$STAGE" = all ]; then
  python -m model train-task tldr --speedup 3 --then 2,5,4 --steps 300 --batch-size 8 --save-every 50 \
    --threads 2 $resume 2>&1 | tee -a runs/tldr-train.log
fi
if [ "$STAGE" = pick ] || [ "$STAGE" = all ]; then
  for s in $SPEEDUPS; do
    python -m model pick-policy tldr --speedup "$s" --run "runs/tldr-skip-${s}x" --device cpu
  done
fi
if [ "$STAGE" = eval ] || [ "$STAGE" = all ]; then
  # on a quiet machine: the speed rows time both arms at batch 1
  python -m model eval-task tldr --device cpu --threads 2
  python -m model results
fi
