#!/usr/bin/env bash
# wait for the family run (at most $1 s), then copy results to $OUT: reports first, then adapters,
# at most 8 files and 60 MB a call; what did not fit is listed in /root/st/left.txt for the next call
limit=${1:-500}
start=$(date +%s)
while pgrep -f gpu_e2e_family.sh > /dev/null && [ $(( $(date +%s) - start )) -lt "$limit" ]; do sleep 5; done
pgrep -f gpu_e2e_family.sh > /dev/null && echo "STILL RUNNING after $limit s"
cat /root/job/runs/gpu-family/logs/timeline.txt 2>/dev/null
for w in family bridge; do echo "== $w"; cat /root/job/runs/gpu-family/$w/logs/timeline.txt 2>/dev/null; done
tail -5 /root/st/family.out
cd /root/res
for f in report-task.tar.gz family/report.tar.gz bridge/report.tar.gz task.tar family/skip-3x.tar bridge/skip-3x.tar \
   family/skip-2x.tar family/skip-5x.tar family/skip-4x.tar family/skip-all.tar; do [ -f "$f" ] && echo "$f"; done > /root/st/all.txt
[ -f /root/st/sent.txt ] || touch /root/st/sent.txt
n=0; bytes=0; : > /root/st/left.txt
while read -r f; do
  grep -qx "$f" /root/st/sent.txt && continue
  size=$(stat -c %s "$f")
  if [ $n -lt 8 ] && [ $(( bytes + size )) -lt 60000000 ]; then
    mkdir -p "$OUT/$(dirname "$f")"; cp "$f" "$OUT/$f"; echo "$f" >> /root/st/sent.txt
    n=$((n + 1)); bytes=$((bytes + size))
  else echo "$f" >> /root/st/left.txt; fi
done < /root/st/all.txt
echo "sent $n files, $bytes bytes; left: $(tr '\n' ' ' < /root/st/left.txt)"
