"""The compiled extension behind the native decode step (model/lowbit/lean_step.cpp with its kernels,
model/lowbit/decode_kernels.h) and the q4 kernels' weight layouts; the step itself is
model/lowbit/native_step.py.

A decode step of the default model at 2x runs ~15 layers of ~25 small torch ops each; at one
thread the interpreter's cost per op call was a measured ~17% of those layers (docs/RESULTS.md, "Speed").
Where the layer's projections are int4 and the q4 kernels run (``q4_kernel_selected``: x86-64 with
AVX2; the AVX-512 VNNI build where the CPU has it, ``q4_isa``), every op of the step is the
extension's own code and a step's run of layers is one call; elsewhere lean_step.cpp makes the
Python step's ATen calls in the same order, so with torch's kernels its output is the Python step's
bit for bit (tests/model/lowbit/test_native_step.py compares them with torch.equal).

Built once per machine and torch version with torch's own extension builder (a C++ compiler and
ninja, about a minute on 2 cores), cached under the project's cache folder; where it cannot be
built (no compiler) or ``SKIPDECODE_NATIVE=0``, every step runs the Python path, and the log says
so once.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import math
import os
import shutil
import sys
import threading
import weakref
from pathlib import Path
from types import ModuleType
from typing import Iterator, Sequence

import torch
from torch import nn
from torch.nn import functional as F

from model.common.checks import check_int
from model.common.hardware import cpu_flags
from model.common.huge_pages import on_huge_pages
from model.common.paths import cache_root
from model.common.progress import say
from model.common.settings import settings

SOURCE = Path(__file__).with_name("lean_step.cpp")
# included by SOURCE: copied and keyed with it
HEADERS = (Path(__file__).with_name("decode_kernels.h"), Path(__file__).with_name("amx_kernels.h"))
_build_lock = threading.Lock()


def native_enabled() -> bool:
    """False when ``SKIPDECODE_NATIVE=0`` (the Python step everywhere: comparisons, debugging)."""
    return settings().native


@functools.cache
def native_module() -> ModuleType | None:
    """The compiled extension (built on first use, then loaded from the cache), or None."""
    if not native_enabled():
        return None
    scripts = str(Path(sys.executable).parent)  # pip's ninja lives beside the interpreter, on PATH or not
    if scripts not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    if shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which("ninja") is None:
        say("no C++ compiler or ninja here: decode steps run the Python path (a few % slower on a CPU)")
        return None
    try:
        module = compiled_step([SOURCE.read_bytes()] + [header.read_bytes() for header in HEADERS])
    except Exception as error:  # noqa: BLE001 (any build failure: the Python path still works)
        say(f"the native decode step could not be built ({type(error).__name__}: {str(error)[:200]}); "
            "decode steps run the Python path")
        return None
    _loaded[:] = [module]
    return module


def compiled_step(sources: list[bytes]) -> ModuleType:
    """The extension compiled from these contents of SOURCE and HEADERS (in that order), built once and
    cached by content, with this process's settings applied (the instruction set, the AMX and int8 rows).
    native_module's build; lab/bench/native_ab.py builds another commit's sources beside it."""
    # -fopenmp: at::parallel_for is inline (header) code, serial unless the extension itself is built
    # with OpenMP. No instruction-set flags: the kernels are compiled once per instruction set
    # (GCC target regions in lean_step.cpp) and chosen at run time from the CPU, so one build runs
    # the AVX-512 kernels where the CPU has them and the AVX2 ones elsewhere.
    flags = ["-O3", "-fopenmp"]
    # Keyed by the sources' content, torch (its version and install: a build links against the
    # torch it was built with; another virtual environment builds its own) and the flags. The build
    # reads a copy of the sources inside its folder: a second checkout of the same code (another
    # path) finds the build current instead of rebuilding it.
    identity = [torch.__version__, str(Path(torch.__file__).resolve().parent), " ".join(flags)]
    key = hashlib.sha256(b"\n".join(sources) + "\n".join(identity).encode()).hexdigest()[:16]
    folder = cache_root() / "native" / f"lean-step-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    with _build_lock, builders_lock(folder):
        from torch.utils.cpp_extension import load  # noqa: PLC0415 (imports setuptools: only when used)

        for path, content in zip((SOURCE, *HEADERS), sources):
            copy = folder / path.name
            if not copy.is_file() or copy.read_bytes() != content:
                copy.write_bytes(content)
        if not any(folder.glob("*.so")):
            say("one-time preparation: compiling the native decode step (C++, about a minute); "
                f"cached in {folder.parent}")
        module = load(name=f"skipdecode_lean_step_{key}", sources=[str(folder / SOURCE.name)],
                      build_directory=str(folder), extra_cflags=flags, extra_ldflags=["-fopenmp"], verbose=False)
    _force_isa(module)
    module.set_q4_amx_rows(amx_rows_setting())
    module.set_int8_bf16_rows(int8_bf16_rows())
    return module


@contextlib.contextmanager
def builders_lock(folder: Path) -> Iterator[None]:
    """Hold the build folder's lock between processes (an OS file lock: a killed process releases it).
    torch's own build lock is a file it deletes when its build ends, so a build killed mid-way (a test
    run's timeout, a Ctrl-C during the first start) left it behind and every later start waited on
    it forever; whoever holds this lock is the only builder, so a torch lock file found then is stale."""
    with open(folder / "builders.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (folder / "lock").unlink(missing_ok=True)  # torch's FileBaton of a build that never ended
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


_loaded: list[ModuleType] = []  # the extension, once native_module has built or loaded it


def loaded_native_module() -> ModuleType | None:
    """The extension where a low-bit model has already built or loaded it (and SKIPDECODE_NATIVE does
    not turn it off), else None: for helpers a float model's step may call too (the argmax), which
    must not start the minute's compile."""
    return _loaded[0] if _loaded and native_enabled() else None


# From 4 rows the tiles beat the lane kernel since a decode batch's blocks go through a ring and up to 8
# rows stack their hi and lo bytes (a step at batch 4 / 5 / 6 1.11x / 1.22x / 1.51x faster than from 8;
# at 2 rows 0.79x, at 3 even: docs/RESULTS.md, round five); SKIPDECODE_Q4_AMX_ROWS's default in Settings
DEFAULT_AMX_ROWS = 4


def amx_rows_setting() -> int:
    """``SKIPDECODE_Q4_AMX_ROWS``: from how many rows a q4 matmul runs on AMX tiles where the CPU has
    AMX-INT8 (0: never)."""
    return settings().q4_amx_rows


# torch's int8 kernel (_weight_int8pack_mm) costs the same per row at any batch; from this many rows the
# weights' integer values as bfloat16 through oneDNN's AMX-BF16 matmul win. Each int8 module keeps that bfloat16
# copy from its load (``keeps_bfloat16_copy``: twice the int8 bytes; converting at each call cost as much as the
# matmul itself). 2-core Xeon (AMX), 2 threads, SmolLM2's projections, the kept copy against the int8 kernel:
# 0.27-0.39x at 1 row, 0.60-0.83x at 4, 1.27-1.95x at 8, 2.0-3.6x at 16, 3.0-4.4x at 32 (on-the-fly conversion:
# 0.55-0.77x at 8, 0.94-1.65x at 16, 1.9-2.4x at 32). AVX512-BF16 without AMX (2-core AMD EPYC Zen 4, 2 threads,
# 576 <-> 1536) would gain too: 0.4x at 1 row, 1.05-1.1x at 8, 2.0x at 30, 2.7-2.8x at 300 and 1,000; the default
# model at batch 30: prefill 1.90 -> 0.88 s, decode step 90 -> 67 ms (lab/bench/bench_int8_rows.py). It stays off
# there by default: a batch's rows then round otherwise than the same job alone (one row: torch's kernel), and
# `batch-check --quantize int8 --batch-size 16` fell from 0.9949 / 0.9938 / 0.9925 to 0.9906 / 0.9895 / 0.9893 at
# 1x / 2x / 3x, under the 0.99 a batched visitor's text is held to (SKIPDECODE_INT8_BF16_ROWS=8 opts in).
DEFAULT_INT8_BF16_ROWS = 8
_int8_bf16_rows: list[int] = []  # the setting, read once (set_int8_bf16_rows changes it)


def int8_bf16_rows() -> int:
    """From how many rows an int8 projection multiplies as bfloat16 (``int8_rows_mm``): SKIPDECODE_INT8_BF16_ROWS,
    by default ``default_int8_bf16_rows`` of this CPU."""
    if not _int8_bf16_rows:
        configured = settings().int8_bf16_rows  # None: this CPU's default
        _int8_bf16_rows[:] = [default_int8_bf16_rows(cpu_flags()) if configured is None else configured]
    return _int8_bf16_rows[0]


def default_int8_bf16_rows(flags: Sequence[str]) -> int:
    """DEFAULT_INT8_BF16_ROWS where the CPU has AMX-BF16, else 0 (never: torch's int8 kernel; why AVX512-BF16
    is not enough: the note above DEFAULT_INT8_BF16_ROWS)."""
    return DEFAULT_INT8_BF16_ROWS if "amx_bf16" in flags else 0


def keeps_bfloat16_copy() -> bool:
    """Whether int8 modules keep their weights' bfloat16 copy beside the int8 ones (made when they are):
    wherever some rows multiply as bfloat16 (``int8_bf16_rows``)."""
    return int8_bf16_rows() > 0


def set_int8_bf16_rows(rows: int) -> None:
    """The int8 rows' threshold for the Python step and the loaded native step alike (tests, A/B runs); modules
    made before it keep (or lack) their bfloat16 copy, and convert at each call without one."""
    _int8_bf16_rows[:] = [check_int("int8 bf16 rows", rows, low=0)]
    module = loaded_native_module()
    if module is not None:
        module.set_int8_bf16_rows(rows)


def int8_rows_mm(rows: torch.Tensor, weight_int8: torch.Tensor, scales: torch.Tensor,
                 weight_bf16: torch.Tensor | None = None) -> torch.Tensor:
    """(N, in) bfloat16 rows times int8 weights (O, in) with bfloat16 column scales: (N, O) bfloat16. From
    ``int8_bf16_rows()`` rows the weights' integers (exact in bfloat16: ``weight_bf16``, the module's kept copy,
    else converted now) go through ``F.linear`` and the columns are scaled after; fewer rows take torch's int8
    kernel. The native step's int8 projections do the same ops in the same order (lean_step.cpp's
    int8_rows_mm): the two steps stay equal bit for bit."""
    start = int8_bf16_rows()
    if start and rows.shape[0] >= start:
        integers = weight_bf16 if weight_bf16 is not None else weight_int8.to(torch.bfloat16)
        return F.linear(rows, integers).mul_(scales)
    return torch._weight_int8pack_mm(rows, weight_int8, scales)


def _force_isa(module: ModuleType) -> None:
    """``SKIPDECODE_Q4_ISA=avx2`` (or ``avx512-vnni``) runs the q4 kernels on that instruction set
    instead of the CPU's best (comparisons; a CPU without it keeps its own, and the log says so)."""
    wanted = settings().q4_isa
    if wanted != "auto" and not module.set_q4_isa(wanted):
        say(f"SKIPDECODE_Q4_ISA={wanted}: not on this CPU (it has {', '.join(module.q4_isas()) or 'none'}); "
            f"the q4 kernels run on {module.q4_isa() or 'nothing'}")


def q4_isa() -> str | None:
    """The instruction set the q4 kernels run on here ("avx512-vnni", "avx2"), or None where there
    are none (no build, not x86-64, no AVX2)."""
    module = native_module()
    return (module.q4_isa() or None) if module is not None else None


def q4_kernel_selected() -> bool:
    """True where decode steps multiply int4 weights with lean_step.cpp's q4 kernels (and the whole
    layer runs in C++) instead of torch's int4 kernel: wherever they exist (x86-64 with AVX2: the
    AVX-512 VNNI kernel where the CPU has it), unless ``SKIPDECODE_INT4_KERNEL=torch``. Why by
    default: their int16 activations are ~40x closer to float than torch's bfloat16 ones (agreement
    with float 0.9941 against 0.9890, docs/RESULTS.md), and they are the faster path on both kinds of
    CPU measured (AVX2 only: torch computes bfloat16 in software; AVX-512: docs/RESULTS.md, "Speed")."""
    if settings().int4_kernel == "torch":
        return False
    return q4_isa() is not None


# --- Q4_1 blocks back out of torch's packed int4 layout -------------------------------------------


def _pack(codes: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)


@functools.lru_cache(maxsize=16)
def _nibble_of_element(rows: int, cols: int) -> torch.Tensor:
    """For torch's CPU int4 packing of a (rows, cols) code matrix (its layout is the kernel's
    per-CPU choice, undocumented): the packed nibble that holds each element, learned from the
    packer itself by packing each base-16 digit of the element indices."""
    count = rows * cols
    index = torch.arange(count, dtype=torch.int64)
    sources = torch.zeros(count, dtype=torch.int64)  # packed nibble -> element
    for digit in range(max(1, math.ceil(math.log(count, 16)))):
        packed = _pack(((index >> (4 * digit)) & 15).to(torch.int32).view(rows, cols)).reshape(-1)
        nibbles = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(-1).long()
        sources |= nibbles << (4 * digit)
    return torch.empty_like(sources).scatter_(0, sources, index)  # element -> packed nibble


_verified: set[tuple[int, int]] = set()


def _period(rows: int) -> int:
    return 64 if rows % 64 == 0 else rows  # the layout repeats over blocks of rows; learnt on one


def codes_of(qs: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(rows, cols) uint8 codes 0..15 of Q4_1 bytes (byte j of a block: q[j] low, q[j + 16] high)."""
    blocks = qs.view(rows, cols // 32, 1, 16)
    return torch.cat([blocks & 15, blocks >> 4], dim=2).reshape(rows, cols)


def q4_bytes(packed: torch.Tensor, rows: int, cols: int) -> torch.Tensor | None:
    """torch's packed int4 weights as Q4_1 bytes (O, K/2) for q4_matmul, or None where the learned
    layout does not hold: the first matrix of each shape is packed again from the result's codes
    and must give the same bytes (the same packer gives every matrix of a shape the same layout)."""
    period = _period(rows)
    qs = native_module().q4_from_packed(packed, _nibble_of_element(period, cols), period)
    if (rows, cols) not in _verified:
        if not torch.equal(_pack(codes_of(qs, rows, cols).to(torch.int32)), packed):
            return None
        _verified.add((rows, cols))
    return qs


class Q4Blocks:
    """An int4 module's weights as lean_step.cpp's q4 kernels read them: ``qs`` (O, K/2) uint8, a
    block's 16 bytes holding q[j] (low nibble) and q[j + 16] (high); ``sz`` (O, K/32, 2) bfloat16,
    each block's (scale, zero): w = (q - 8) scale + zero — the values torch's kernel multiplies. A
    second copy of the 4-bit weights (the Python path and prefill keep torch's)."""

    _known: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple[torch.Tensor, ...], Q4Blocks | None]]" = (
        weakref.WeakKeyDictionary())

    def __init__(self, qs: torch.Tensor, sz: torch.Tensor, lanes: torch.Tensor | None = None,
                 amx: torch.Tensor | None = None, placed: bool = False) -> None:
        self.qs, self.sz = qs, sz
        # The same bytes in the lane kernel's layout (decode_kernels.h; lean_step.cpp, q4_lanes where the
        # CPU has AVX-512 VNNI, q4_lanes_avx2 where the q4 kernels run on AVX2): a third copy of the
        # 4-bit bytes (~58 MB for the default model) so that forcing the other instruction set still finds qs.
        self.lanes = lanes if lanes is not None else _lane_bytes(qs)
        # The whole groups of 16 rows in the AMX tiles' layout (amx_kernels.h, amx_layout), built where
        # the tiles run (q4_amx; from SKIPDECODE_Q4_AMX_ROWS rows, not 0): one more copy of the bytes and their
        # pairs (0.625 bytes a weight, ~84 MB for the default model) that spares a batch's step the
        # transposing (~a fifth of it).
        self.amx = amx if amx is not None else _amx_bytes(qs, sz)
        self.placed = placed  # on huge pages (``place``), or views of blocks that are

    def place(self) -> "Q4Blocks":
        """Every copy moved onto huge pages where the OS gives them (model/common/huge_pages.py: a decode
        step streams them all, and in a virtual machine each 4 KiB page's TLB miss is a two-level walk);
        once. Called where blocks are kept for every step (the native step's, the head's), not for
        blocks that live for one call: the arena does not reuse a dead tensor's space."""
        if not self.placed:
            self.qs, self.sz, self.lanes, self.amx = (on_huge_pages(t) for t in (self.qs, self.sz, self.lanes, self.amx))
            self.placed = True
        return self

    @classmethod
    def of(cls, module: nn.Module) -> "Q4Blocks | None":
        """The blocks of an Int4WeightLinear (kept per module while its packed weights stay)."""
        packed, scales_and_zeros = module.weight_int4pack, module.scales_and_zeros
        known = cls._known.get(module)
        if known is None or known[0][0] is not packed or known[0][1] is not scales_and_zeros:
            if known is not None and _same_values(known[0], (packed, scales_and_zeros)):
                blocks = known[1]  # re-pointed at a copy of the same values (the LoRA's stacked rows)
            else:
                blocks = cls._from_packed(packed, scales_and_zeros, module.out_features, module.in_features)
            known = cls._known[module] = ((packed, scales_and_zeros), blocks)
        return known[1]

    @classmethod
    def stacked(cls, parts: list[nn.Module]) -> "Q4Blocks | None":
        """The blocks of modules whose rows are stacked in one kernel call (a LoRA's A under its
        base): the parts' blocks concatenated, each part's own blocks then row slices of them (the
        base, which the original model's layers multiply too, held once)."""
        blocks = [cls.of(part) for part in parts]
        if any(b is None for b in blocks):
            return None
        joined = cls(torch.cat([b.qs for b in blocks]), torch.cat([b.sz for b in blocks])).place()
        start = 0
        for part, own in zip(parts, blocks):
            end = start + own.qs.shape[0]
            lanes = joined.lanes[start:end] if joined.lanes.numel() else joined.lanes
            cls._known[part] = (cls._known[part][0],
                                cls(joined.qs[start:end], joined.sz[start:end], lanes, _amx_rows_of(joined.amx, start, end),
                                    placed=True))
            start = end
        return joined

    @classmethod
    def _from_packed(cls, packed: torch.Tensor, scales_and_zeros: torch.Tensor, rows: int, cols: int) -> "Q4Blocks | None":
        qs = q4_bytes(packed, rows, cols)
        if qs is None:
            return None
        return cls(qs, scales_and_zeros.to(torch.bfloat16).transpose(0, 1).contiguous())  # (K/32, O, 2) -> (O, K/32, 2)

    def tensors(self) -> list[torch.Tensor]:
        return [self.qs, self.sz]

    def layouts(self) -> list[torch.Tensor]:
        """The lane kernel's and the AMX tiles' layouts (each empty where it does not run): the last two
        tensors of a q4 projection's spec (model/lowbit/native_step.py, projection_spec)."""
        return [self.lanes, self.amx]

    def __call__(self, rows: torch.Tensor, coarse: bool = False) -> torch.Tensor:
        """(N, K) float32 rows -> (N, O) float32 (``coarse``: activations at 8 bits, a ranking)."""
        return native_module().q4_matmul(rows, self.qs, self.sz, coarse, self.lanes, self.amx)

    def two_stage(self, rows: torch.Tensor, exact: torch.Tensor, scales: torch.Tensor | None,
                  candidates: int) -> torch.Tensor:
        """(N, K) float32 rows -> (N, O) float32: these blocks' logits, each row's top ``candidates``
        rescored with ``exact`` (O, K) float32 rows, or int8 rows times bfloat16 ``scales``
        (quantization.py, TwoStageHead), in one call."""
        return native_module().two_stage_head(rows, self.qs, self.sz, exact, scales, candidates, self.lanes, self.amx)


def _lane_bytes(qs: torch.Tensor) -> torch.Tensor:
    """``qs`` in the AVX-512 lane kernel's layout where this CPU has AVX-512 VNNI, in the AVX2 one's
    where the q4 kernels run on AVX2 (an AVX2-only CPU, or SKIPDECODE_Q4_ISA=avx2 at load), else an
    empty tensor (the group kernels then run)."""
    module = native_module()
    if module is None or not qs.is_contiguous():
        return qs.new_empty(0)
    if module.q4_isa() == "avx2":
        return module.q4_lanes_avx2(qs)
    if "avx512-vnni" in module.q4_isas():
        return module.q4_lanes(qs)
    return qs.new_empty(0)


def _amx_bytes(qs: torch.Tensor, sz: torch.Tensor) -> torch.Tensor:
    """``qs`` and ``sz`` in the AMX tiles' layout where the tiles run here, else an empty tensor (the
    tiles, when forced on later, then transpose the bytes on every call)."""
    module = native_module()
    if module is None or not module.q4_amx() or module.q4_amx_rows() == 0 or not qs.is_contiguous():
        return qs.new_empty(0)
    return module.q4_amx_layout(qs, sz.contiguous())


def _amx_rows_of(amx: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows [start, end) of a layout of 16-row groups: its groups where both ends fall on a group's edge
    (a LoRA's base rows under which the A rows are stacked), else empty."""
    if amx.numel() == 0 or start % 16 or end % 16:
        return amx.new_empty(0)
    return amx[start // 16:end // 16]


def _same_values(old: tuple[torch.Tensor, ...], new: tuple[torch.Tensor, ...]) -> bool:
    return all(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(old, new))


def lora_b_layout(weight_int8: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A LoRA's B (O, R) int8 rows (per-row ``scales``) as lean_step.cpp's kernels read it: (window, start,
    scale, tiles, tile_start, window_sum). ``window`` (O, W): each row's nonzero columns from column
    ``start`` (W a multiple of 16; q/k/v's and gate/up's B are block-diagonal, one LoRA per fused
    projection, so the windows hold a third to a half of B's bytes), for the per-output kernel; ``tiles``
    (O/16, TW/4, 16, 4): 16 outputs sharing one start column, columns 4i .. 4i + 3 of their rows side
    by side, what one VNNI instruction multiplies (AVX-512; empty where O is not a multiple of 16),
    with each tile's start and each row's sum."""
    window, start, tiles, tile_start, window_sum = native_module().lora_b_layout(weight_int8)
    return window, start, scales.float().contiguous(), tiles, tile_start, window_sum


def q4_scan(module: nn.Module) -> Q4Blocks | None:
    """The Q4Blocks an Int4WeightLinear is multiplied with where q4_matmul is selected, else None."""
    return Q4Blocks.of(module) if q4_kernel_selected() else None
