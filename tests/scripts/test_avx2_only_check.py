"""scripts/avx2_only_check.sh: the int4 kernels on an emulated CPU without AVX-512 or AMX (QEMU's Haswell).

The CPUs CI and users have differ (AVX2 or AVX-512, AMX or not); this machine has AMX, so without an
emulated one the AVX2-only road (the module's own choice of AVX2, no tiles, the Python side reading the
same flags) would run nowhere. A test of the head's scan failed there and nowhere else (it compared the
lane kernel with the layout-free one, which add in another order on AVX2)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.support import ROOT

EMULATED = ("best_instruction_set or two_stage_head or argmax or equals_the_python_step_bit_for_bit "
            "or fused_layer_computes")

pytestmark = [
    pytest.mark.slow,  # the kernels' tests under TCG: a minute or two
    pytest.mark.skipif(shutil.which("qemu-x86_64") is None or shutil.which("gcc") is None
                       or shutil.which("unshare") is None or os.geteuid() != 0,
                       reason="needs qemu-user, gcc and root (scripts/test.sh installs qemu-user where it can)"),
]


def test_an_avx2_only_cpu_takes_the_avx2_kernels_and_they_agree():
    done = subprocess.run(["bash", "scripts/avx2_only_check.sh", "Haswell", "-q", "-p", "no:cacheprovider",
                           "tests/model/lowbit/test_native_step.py", "-k", EMULATED],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert "emulated Haswell: avx fma f16c avx2 \n" in done.stdout, done.stdout + done.stderr  # CPUID: no AVX-512
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    # the instruction-set choice, both heads, argmax, the step's parity on both paths and the fused layer:
    # what runs on AVX2 (the AVX-512 and AMX tests skip, as they must on such a CPU)
    assert passed is not None and int(passed.group(1)) >= 10 and "failed" not in summary, summary
