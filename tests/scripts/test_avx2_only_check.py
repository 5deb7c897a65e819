"""scripts/avx2_only_check.sh: the int4 kernels on an emulated CPU without AVX-512 or AMX (QEMU's Haswell).

The CPUs CI and users have differ (AVX2 or AVX-512, AMX or not); this machine has AMX, so without an
emulated one the AVX2-only road (the module's own choice of AVX2, no tiles, the Python side reading the
same flags) would run nowhere. A test of the head's scan failed there and nowhere else (it compared the
lane kernel with the layout-free one, which add in another order on AVX2)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.support import ROOT

STEP = "tests/model/lowbit/test_native_step.py::"
# The instruction-set choice, the head (both rescorings), argmax, and the decode step on AVX2's lane kernel:
# the native step against the Python step bit for bit, and the fused layer against its weights' reference.
# (Under TCG each parity test takes a minute; the whole folder, scripts/avx2_only_check.sh alone, ~25 min.)
EMULATED = [STEP + name for name in (
    "test_the_q4_kernels_take_the_cpus_best_instruction_set_and_agree_across_them",
    "test_the_native_two_stage_head_rescores_the_scans_top_candidates",
    "test_the_native_argmax_picks_torchs_ids_ties_and_nan_included[avx2]",
    "test_the_native_step_equals_the_python_step_bit_for_bit[int4-False]",
    "test_the_fused_layer_computes_the_decode_step_of_its_weights[avx2-lanes-False]",
)]

CANNOT_EMULATE = 77  # the script's exit status where this machine cannot emulate such a CPU (it says why)

pytestmark = [
    pytest.mark.slow,  # the kernels' tests under TCG: a few minutes
    pytest.mark.skipif(shutil.which("qemu-x86_64") is None,
                       reason="needs qemu-user 7.2 or later (scripts/test.sh installs it where it can)"),
]


def test_an_avx2_only_cpu_takes_the_avx2_kernels_and_they_agree():
    done = subprocess.run(["bash", "scripts/avx2_only_check.sh", "Haswell", "-q", "-p", "no:cacheprovider", *EMULATED],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800)
    if done.returncode == CANNOT_EMULATE:
        pytest.skip(done.stdout.strip().splitlines()[-1])
    assert "emulated Haswell: avx fma f16c avx2 \n" in done.stdout, done.stdout + done.stderr  # CPUID: no AVX-512
    summary = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed is not None and int(passed.group(1)) == 6 and "failed" not in summary and "skipped" not in summary, \
        summary
