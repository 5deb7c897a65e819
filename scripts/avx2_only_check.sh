#!/usr/bin/env bash
# The int4 kernels' tests on a CPU without AVX-512 or AMX, emulated: QEMU's user-mode emulator
# (qemu-user 7.2 or later, whose TCG runs AVX2, FMA and F16C) with a CPU model whose CPUID has AVX2
# and nothing above it (Haswell by default; EPYC-Rome is the AMD one), so the extension picks its
# kernels as it would on such a machine. Under qemu-user /proc/cpuinfo is still the host's; a private
# mount namespace lays a copy over it whose vector flags are the emulated CPUID's, so the Python side
# (model/common/hardware.py) sees the same CPU as the kernels. The results are real; the speed is
# TCG's and means nothing. Needs qemu-user, gcc and root (for the mount namespace); where this machine
# cannot emulate such a CPU (no qemu-user, a qemu older than 7.2 without AVX2, no mount namespace) it
# says why and exits 77, which tests/scripts/test_avx2_only_check.py reads as a skip.
#
#   bash scripts/avx2_only_check.sh [CPU_MODEL] [pytest arguments]   (default: Haswell tests/model/lowbit)
set -euo pipefail
cd "$(dirname "$0")/.."
model="${1:-Haswell}"
shift || true
tests=("$@")
[ ${#tests[@]} -gt 0 ] || tests=(-q -p no:cacheprovider tests/model/lowbit)
cannot() { echo "cannot emulate here: $1"; exit 77; }
command -v qemu-x86_64 >/dev/null || cannot "needs qemu-user (apt-get install qemu-user)"
command -v gcc >/dev/null || cannot "needs gcc (the CPUID probe)"
python="$(pwd)/.venv/bin/python"
[ -x "$python" ] || { echo "run bash scripts/setup.sh --dev first"; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The vector flags the emulated CPU's CPUID reports, named as /proc/cpuinfo names them.
cat > "$work/probe.c" <<'PROBE'
#include <cpuid.h>
#include <stdio.h>
struct flag { const char* name; unsigned leaf, sub, reg, bit; };  /* reg: 0 eax, 1 ebx, 2 ecx, 3 edx */
static const struct flag flags[] = {
  {"avx", 1, 0, 2, 28}, {"fma", 1, 0, 2, 12}, {"f16c", 1, 0, 2, 29}, {"avx2", 7, 0, 1, 5},
  {"avx512f", 7, 0, 1, 16}, {"avx512dq", 7, 0, 1, 17}, {"avx512ifma", 7, 0, 1, 21}, {"avx512cd", 7, 0, 1, 28},
  {"avx512bw", 7, 0, 1, 30}, {"avx512vl", 7, 0, 1, 31}, {"avx512vbmi", 7, 0, 2, 1}, {"avx512_vbmi2", 7, 0, 2, 6},
  {"avx512_vnni", 7, 0, 2, 11}, {"avx512_bitalg", 7, 0, 2, 12}, {"avx512_vpopcntdq", 7, 0, 2, 14},
  {"avx512_fp16", 7, 0, 3, 23}, {"amx_bf16", 7, 0, 3, 22}, {"amx_tile", 7, 0, 3, 24}, {"amx_int8", 7, 0, 3, 25},
  {"avx_vnni", 7, 1, 0, 4}, {"avx512_bf16", 7, 1, 0, 5},
};
int main(void) {
  for (unsigned i = 0; i < sizeof flags / sizeof flags[0]; ++i) {
    unsigned r[4] = {0, 0, 0, 0};
    if (__get_cpuid_count(flags[i].leaf, flags[i].sub, &r[0], &r[1], &r[2], &r[3]) && (r[flags[i].reg] >> flags[i].bit & 1))
      printf("%s\n", flags[i].name);
  }
  return 0;
}
PROBE
gcc -O1 "$work/probe.c" -o "$work/probe"
qemu-x86_64 -cpu "$model" "$work/probe" 2>/dev/null > "$work/flags"
grep -qx avx2 "$work/flags" || cannot "this qemu's $model runs no AVX2 (TCG has it from qemu 7.2)"
echo "emulated $model: $(tr '\n' ' ' < "$work/flags")"

# /proc/cpuinfo with the host's vector flags replaced by the emulated ones, and the model named
python3 - "$work/flags" "$model" > "$work/cpuinfo" <<'EDIT'
import sys
emulated = set(open(sys.argv[1]).read().split())
vector = ("avx", "amx", "fma", "f16c")
for line in open("/proc/cpuinfo").read().splitlines():
    if line.startswith("flags"):
        key, value = line.split(":", 1)
        kept = [f for f in value.split() if not f.startswith(vector)]
        line = f"{key}: {' '.join(kept + sorted(emulated))}"
    elif line.startswith("model name"):
        line = f"model name\t: QEMU TCG {sys.argv[2]} (emulated)"
    print(line)
EDIT

unshare -m --propagation private mount --bind "$work/cpuinfo" /proc/cpuinfo 2>/dev/null \
  || cannot "no private mount namespace for the emulated /proc/cpuinfo (needs root, CAP_SYS_ADMIN)"

site="$("$python" -c 'import site; print(site.getsitepackages()[0])')"
interpreter="$(readlink -f "$python")"
# qemu runs the interpreter itself, not the virtual environment's link to it: the packages go on the path.
unshare -m --propagation private bash -c '
  mount --bind "$1" /proc/cpuinfo
  shift
  exec "$@"' _ "$work/cpuinfo" \
  env HF_HUB_OFFLINE=1 PYTHONPATH="$(pwd):$site" PATH="$(dirname "$python"):$PATH" \
  qemu-x86_64 -cpu "$model" "$interpreter" -m pytest "${tests[@]}" 2> >(grep -v "TCG doesn't support" >&2)
