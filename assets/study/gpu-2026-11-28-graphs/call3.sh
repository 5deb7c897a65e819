#!/usr/bin/env bash
# Lease call 3 of 3 (carry .lease3): the shipped skip policy's weights and llama-bench (built by
# scripts/build_llama_bench.sh on the development Xeon) into place, wait for call 2's warm-up (at most
# 120 s), then the lease's one command: bash scripts/gpu_check.sh "$OUT".
set -uo pipefail
mkdir -p ~/.cache/skipdecode-playground/llama.cpp
xz -d < .lease3/llama-bench.xz > ~/.cache/skipdecode-playground/llama.cpp/llama-bench
chmod +x ~/.cache/skipdecode-playground/llama.cpp/llama-bench
cp .lease3/VERSION ~/.cache/skipdecode-playground/llama.cpp/
cp .lease3/adapter_model.safetensors assets/adapters/smollm2-135m-skipdecode/
for _ in $(seq 120); do [ -f /root/st/warm.done ] && break; sleep 1; done
{ echo "== call 2's warm-up (GGUF -> float weights, native step build):"; cat /root/st/warm.log; } > "$OUT/log.txt"
PYTHONPATH=/root/st/site bash scripts/gpu_check.sh "$OUT"
