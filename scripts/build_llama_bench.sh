#!/usr/bin/env bash
# Build llama.cpp's `llama-bench` and `llama-batched-bench` (CPU only) for the llama.cpp rows of
# `python -m model bench` (batch 1 decode and `-p N` prompts; decode at batch N, `-npl`).
#
# The sources are the llama.cpp that llama-cpp-python vendors in its sdist, fetched from PyPI with
# pip (a registry package, pinned below); nothing else is downloaded. The binary is built for THIS
# CPU (-march=native) and cached under the user's cache folder, where the bench looks for it:
#   ${SKIPDECODE_CACHE_DIR:-~/.cache/skipdecode-playground}/llama.cpp/llama-bench (and llama-batched-bench)
# Never part of tests or CI. Needs cmake and a C/C++ compiler; takes a few minutes on 2 cores.
# `--force` rebuilds.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="0.3.36"  # llama-cpp-python release whose vendored llama.cpp is built
CACHE="${SKIPDECODE_CACHE_DIR:-$HOME/.cache/skipdecode-playground}/llama.cpp"
BIN="$CACHE/llama-bench"
if [ -x "$BIN" ] && [ -x "$CACHE/llama-batched-bench" ] && [ "${1:-}" != "--force" ]; then
  echo "build_llama_bench: $BIN is there ($(cat "$CACHE/VERSION" 2>/dev/null || echo unknown)); --force rebuilds" >&2
  exit 0
fi
for tool in cmake c++; do
  command -v "$tool" >/dev/null || { echo "build_llama_bench: needs $tool (apt-get install cmake g++)" >&2; exit 2; }
done
PYTHON=python3
if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; fi
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
echo "build_llama_bench: downloading the llama-cpp-python $VERSION sdist from PyPI" >&2
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK"
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SRC="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"
[ -f "$SRC/CMakeLists.txt" ] || { echo "build_llama_bench: no vendored llama.cpp in the sdist" >&2; exit 1; }
# No AMX: on the 2-core Xeon of our machines (AMX tile and int8 in its flags) the vendored ggml's AMX
# matmul dies with SIGILL at its first tilezero in llama-batched-bench at batch >= 4 (gdb:
# tinygemm_kernel_amx<block_q8_1, block_q4_1>), so its batched rows are built on AVX-512 VNNI, as
# ours run. Harmless on a CPU without AMX (GCC knows the flags either way).
NO_AMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
echo "build_llama_bench: building llama-bench and llama-batched-bench (CPU, native) in $WORK" >&2
cmake -S "$SRC" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF -DCMAKE_C_FLAGS="$NO_AMX" -DCMAKE_CXX_FLAGS="$NO_AMX" >"$WORK/cmake.log" 2>&1 \
  || { tail -30 "$WORK/cmake.log" >&2; exit 1; }
cmake --build "$WORK/build" --target llama-bench llama-batched-bench -j "$(nproc)" >"$WORK/build.log" 2>&1 \
  || { tail -30 "$WORK/build.log" >&2; exit 1; }
mkdir -p "$CACHE"
for tool in llama-bench llama-batched-bench; do
  cp "$WORK/build/bin/$tool" "$CACHE/$tool.partial"
  mv "$CACHE/$tool.partial" "$CACHE/$tool"
done
echo "llama-cpp-python $VERSION (no AMX)" > "$CACHE/VERSION"
echo "build_llama_bench: built $BIN and $CACHE/llama-batched-bench" >&2
