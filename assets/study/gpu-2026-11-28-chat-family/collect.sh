#!/usr/bin/env bash
# Wait for the family run (at most $1 s), then send back /root/res in one xz tar split into 15 MiB
# parts (a call brings back at most 8 files of 16 MiB): untar with `cat res.tar.xz.* | tar -xJf -`.
limit=${1:-500}
start=$(date +%s)
while pgrep -f gpu_chat_family.sh > /dev/null && [ $(( $(date +%s) - start )) -lt "$limit" ]; do sleep 3; done
pgrep -f gpu_chat_family.sh > /dev/null && echo "STILL RUNNING after $limit s"
tail -25 /root/job/runs/gpu-chat-family/logs/timeline.txt 2>/dev/null
tail -3 /root/st/family.out
cp /root/job/runs/gpu-chat-family/logs/timeline.txt /root/res/timeline.txt 2>/dev/null
tar -C /root/res -cf - . | xz -T16 -1 | split -b 15M - "$OUT/res.tar.xz."
ls -la "$OUT"
