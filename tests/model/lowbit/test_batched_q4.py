"""The q4 kernels on batches and prompts (model/lowbit/decode_kernels.h: the AVX-512 lane kernel, the
group kernel, AVX2; model/lowbit/amx_kernels.h: AMX tiles): random shapes, odd batch sizes, padding
rows, every instruction set this CPU can run, forced; against exact float arithmetic on the very
weights they multiply. The margins hold on any x86-64 CPU: 16-bit activations err ~1e-5 relative, the
tolerance is 1e-3, and a kernel that mixes up a lane, a block, a row, a tile or a column errs by O(1)."""

import shutil

import pytest
import torch

from model.lowbit.native_kernels import Q4Blocks, amx_rows_setting, native_module, q4_isa, q4_scan
from model.lowbit.quantization import Int4Blocks, Int4WeightLinear, TwoStageHead, int4_supported

has_q4 = (shutil.which("c++") is not None and shutil.which("ninja") is not None and int4_supported()
          and q4_isa() is not None)
pytestmark = pytest.mark.skipif(not has_q4, reason="the q4 kernels need an x86-64 CPU with AVX2 and a C++ compiler")

# (out, in): in = 576 is one superblock of 16 blocks and a tail of 2 (SmolLM2's width), 512 exactly one,
# 1536 three (its MLP), 96 none (3 blocks: a partial group), 1056 two and a tail of 1
SHAPES = [(48, 576), (80, 512), (32, 1536), (16, 96), (208, 1056)]  # out: multiples of 16 (torch's packer)
ROWS = (1, 2, 3, 5, 8, 13, 17)  # a decode row; tiles of 4 and their remainders; past a 16-row block


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _exact(source: Int4Blocks, blocks: Q4Blocks) -> torch.Tensor:
    """(out, in) float64: (code - 8) scale + zero with the bfloat16 scale and zero the kernels read."""
    scale, zero = (blocks.sz[..., i].double().repeat_interleave(32, dim=1) for i in (0, 1))
    return (source.codes.double() - 8.0) * scale + zero


def _isas() -> list[str]:
    return list(native_module().q4_isas())


def _amx() -> bool:
    return bool(native_module().q4_amx())


def _on(isa: str, run, amx_rows: int = 0):
    """``run`` on ``isa``'s kernels; AMX tiles from ``amx_rows`` rows (0: never, the vector kernels)."""
    module = native_module()
    assert module.set_q4_isa(isa)
    module.set_q4_amx_rows(amx_rows)
    try:
        return run()
    finally:
        module.set_q4_isa("auto")
        module.set_q4_amx_rows(amx_rows_setting())


def _weights(out: int, width: int, seed: int) -> tuple[Int4Blocks, Q4Blocks]:
    generator = torch.Generator().manual_seed(seed)
    source = Int4Blocks.from_float(torch.randn(out, width, generator=generator) * 0.05)
    blocks = Q4Blocks.of(Int4WeightLinear(source))
    assert blocks is not None
    return source, blocks


def _rows(rows: int, width: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, width, generator=torch.Generator().manual_seed(seed)) * 2.0
    x[:, 5] = 40.0  # an outlier dimension, as SmolLM2 has
    return x


@pytest.mark.parametrize(("out", "width"), SHAPES)
def test_every_kernel_multiplies_a_batch_as_exact_float_arithmetic_does(out, width):
    source, blocks = _weights(out, width, seed=out * width)
    exact = _exact(source, blocks)
    if "avx512-vnni" in _isas():
        assert blocks.lanes.shape == blocks.qs.shape  # the lane kernel's layout is built where it runs
    for rows in ROWS:
        x = _rows(rows, width, seed=rows)
        reference = x.double() @ exact.T
        results = {isa: _on(isa, lambda: blocks(x)) for isa in _isas()}
        if "avx512-vnni" in results:  # the group kernel, without the lane layout
            results["group"] = _on("avx512-vnni", lambda: native_module().q4_matmul(x, blocks.qs, blocks.sz, False))
        if _amx():  # AMX tiles at every row count (by default from 4 rows)
            results["amx"] = _on("avx512-vnni", lambda: blocks(x), amx_rows=1)
        if "avx2" in results:  # AVX2's lane kernel (built where the kernels run on AVX2; here by hand)
            lanes2 = native_module().q4_lanes_avx2(blocks.qs)
            results["avx2-lanes"] = _on("avx2", lambda: native_module().q4_matmul(x, blocks.qs, blocks.sz, False, lanes2))
        for name, y in results.items():
            assert y.shape == (rows, out)
            assert _relative(y, reference) < 1e-3, (name, rows)  # ~1e-5 measured
        first = next(iter(results.values()))
        for y in results.values():  # the same integer dot products: only float additions differ (~3e-7)
            assert _relative(y, first) < 1e-5


@pytest.mark.parametrize("isa", ["avx512-vnni", "avx2", "avx2-lanes", "amx"])
def test_a_row_of_a_batch_is_that_row_alone_and_padding_rows_change_nothing(isa):
    if isa.removesuffix("-lanes") not in _isas() and not (isa == "amx" and _amx()):
        pytest.skip(f"this CPU has no {isa}")
    amx_rows = 1 if isa == "amx" else 0  # on one kernel: AMX at every row count, or never
    source, blocks = _weights(48, 576, seed=3)
    # AVX2 without a layout of its own (the AVX-512 one here is not its): its row kernel; with one: its lane kernel
    lanes = native_module().q4_lanes_avx2(blocks.qs) if isa == "avx2-lanes" else blocks.lanes
    isa = {"amx": "avx512-vnni", "avx2-lanes": "avx2"}.get(isa, isa)

    def multiply(rows: torch.Tensor) -> torch.Tensor:
        return native_module().q4_matmul(rows, blocks.qs, blocks.sz, False, lanes, blocks.amx)

    x = _rows(21, 576, seed=4)  # an AMX tile of 16 and one of 5 padded
    x[0] = 0.0  # padding rows as a left-padded batch may hold them: zeros, and one very large row
    x[6] = 1e4
    batch = _on(isa, lambda: multiply(x), amx_rows)
    for r in range(21):  # every tile shape and remainder computes a row the same way, bit for bit
        assert torch.equal(_on(isa, lambda r=r: multiply(x[r:r + 1]), amx_rows), batch[r:r + 1]), r
    # on the tiles: up to 8 rows stack their hi and lo bytes, up to 16 make one row tile through a ring of
    # blocks, more take the group-wide unpacking; all of them the same bits
    for n in (3, 8, 12, 16):
        assert torch.equal(_on(isa, lambda n=n: multiply(x[:n]), amx_rows), batch[:n]), n
    assert torch.equal(batch[0], torch.zeros(48))
    assert _relative(batch[6], 1e4 * x.new_ones(576).double() @ _exact(source, blocks).T) < 1e-3


@pytest.mark.parametrize("isa", ["avx512-vnni", "avx2"])
def test_the_lane_kernels_read_every_weight_byte_from_their_lanes_copy(isa):
    """The blocks past the last superblock (576 columns: 2 of 18) are read from the lanes copy the kernel
    streams, where they lie as in qs (AVX2 had read them from qs: a line of a second array per weight row).
    qs with those bytes zeroed must change nothing."""
    if isa not in _isas():
        pytest.skip(f"this CPU has no {isa}")
    _, blocks = _weights(48, 576, seed=11)
    module = native_module()
    lanes = module.q4_lanes_avx2(blocks.qs) if isa == "avx2" else module.q4_lanes(blocks.qs)
    holed = blocks.qs.clone()
    holed[:, 256:] = 0  # blocks 16 and 17 of every weight row: the tail of either lane layout
    for rows in (1, 2, 5, 8):
        x = _rows(rows, 576, seed=rows)
        whole = _on(isa, lambda: module.q4_matmul(x, blocks.qs, blocks.sz, False, lanes))
        assert torch.equal(_on(isa, lambda: module.q4_matmul(x, holed, blocks.sz, False, lanes)), whole), rows
        # the test can fail: without the lanes copy the same hole changes the products
        assert not torch.equal(_on(isa, lambda: module.q4_matmul(x, holed, blocks.sz, False)), whole), rows


def test_avx2s_tiled_lora_b_multiplies_like_float_and_a_row_alone_as_in_a_batch():
    """A LoRA's B (block-diagonal, as q/k/v fuse three LoRAs: 48 outputs, rank 36 in three diagonal blocks of 12)
    on AVX2's tiled kernel (the native step's, from lora_b_layout's tiles of 16 outputs) against float64, its
    windowed row kernel beside it, and each row of a batch the same bits as that row alone."""
    if "avx2" not in _isas():
        pytest.skip("this CPU has no AVX2")
    module = native_module()
    g = torch.Generator().manual_seed(5)
    b = torch.zeros(48, 36, dtype=torch.int8)
    for part in range(3):
        b[16 * part:16 * part + 16, 12 * part:12 * part + 12] = torch.randint(-127, 128, (16, 12), generator=g, dtype=torch.int8)
    scale = torch.rand(48, generator=g) * 1e-2 + 1e-3
    window, start, tiles, tile_start, _ = module.lora_b_layout(b)
    assert tiles.shape[0] == 3  # one tile of 16 outputs a part
    x = torch.randn(7, 36, generator=g)
    reference = (x.double() @ b.double().T) * scale.double()

    def tiled(rows: torch.Tensor) -> torch.Tensor:
        return _on("avx2", lambda: module.lora_b_matmul(rows, window, start, scale, tiles, tile_start))

    batch = tiled(x)
    assert _relative(batch, reference) < 1e-5
    windows = _on("avx2", lambda: module.lora_b_matmul(x, window, start, scale))
    assert _relative(windows, reference) < 1e-5
    for r in range(7):  # rows in pairs, the last alone: the same sums either way
        assert torch.equal(tiled(x[r:r + 1]), batch[r:r + 1]), r
    assert torch.equal(tiled(x[:4]), batch[:4])
    # a wrong output, column or tile errs by O(1)
    assert _relative(tiled(x.flip(1)), reference) > 0.1


@pytest.mark.skipif(not has_q4 or not _amx(), reason="this CPU (or its kernel) has no AMX-INT8 for this process")
@pytest.mark.parametrize("rows", [1, 3, 4, 8, 9, 16, 40])
def test_amx_tiles_take_whole_groups_of_16_columns_and_the_vector_kernel_the_rest(rows):
    """72 columns: four groups of 16 on the tiles (two pairs), the last 8 on the lane kernel; the
    default threshold sends 4 rows and more to the tiles, fewer to the vector kernels."""
    source, blocks = _weights(80, 576, seed=rows)
    module = native_module()
    qs, sz, lanes = (t[:72].contiguous() for t in (blocks.qs, blocks.sz, blocks.lanes))
    x = _rows(rows, 576, seed=rows + 1)
    reference = x.double() @ _exact(source, blocks)[:72].T
    tiles = _on("avx512-vnni", lambda: module.q4_matmul(x, qs, sz, False, lanes), amx_rows=1)
    vector = _on("avx512-vnni", lambda: module.q4_matmul(x, qs, sz, False, lanes))
    assert _relative(tiles, reference) < 1e-3 and _relative(tiles[:, 64:], reference[:, 64:]) < 1e-3
    assert _relative(tiles, vector) < 1e-5  # the same integers: only float additions differ (~2e-7)
    assert torch.equal(tiles[:, 64:], vector[:, 64:])  # the tail columns ran the vector kernel itself
    assert module.q4_amx_rows() == amx_rows_setting()  # 4 unless SKIPDECODE_Q4_AMX_ROWS says otherwise
    if rows >= module.q4_amx_rows() > 0:
        assert torch.equal(module.q4_matmul(x, qs, sz, False, lanes), tiles)  # by default on the tiles
    else:
        assert torch.equal(module.q4_matmul(x, qs, sz, False, lanes), vector)


@pytest.mark.skipif(not has_q4 or not _amx(), reason="this CPU (or its kernel) has no AMX-INT8 for this process")
@pytest.mark.parametrize("rows", [1, 8, 12, 40])
def test_the_tiles_give_one_threads_bits_on_several_threads(rows):
    """Threads take a matmul's pairs of column groups in chunks as they come free, so which thread
    multiplies a column changes from call to call; a column is still one thread's whole sum, so two
    threads give one thread's bits, fine and coarse."""
    _, blocks = _weights(1536, 576, seed=rows)  # 48 pairs of groups: chunks of a few pairs
    x = _rows(rows, 576, seed=rows + 2)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 1, 2):
            torch.set_num_threads(threads)
            results.append([_on("avx512-vnni", lambda c=coarse: blocks(x, coarse=c), amx_rows=1) for coarse in (False, True)])
    finally:
        torch.set_num_threads(before)
    for fine, coarse in results[1:]:
        assert torch.equal(fine, results[0][0]) and torch.equal(coarse, results[0][1])


@pytest.mark.skipif(not has_q4 or not _amx(), reason="this CPU (or its kernel) has no AMX-INT8 for this process")
@pytest.mark.parametrize(("out", "width"), SHAPES)
def test_the_load_time_amx_layout_gives_the_tiles_the_very_bits_of_transposing_every_call(out, width):
    """Q4Blocks lays its whole groups of 16 rows out for the tiles when it is built (and 72 of 80 rows:
    four groups, 8 columns left to the vector kernel); the tiles read the same B tiles and scales from
    it as from the bytes transposed at each call, so every output is the same float, fine or coarse."""
    module = native_module()
    _, blocks = _weights(out, width, seed=out)
    assert blocks.amx.shape == (out // 16, width // 32, 320)
    assert torch.equal(blocks.amx, module.q4_amx_layout(blocks.qs, blocks.sz))
    tensors = [(blocks.qs, blocks.sz, blocks.lanes, blocks.amx)]
    if out == 80:
        qs, sz, lanes = (t[:72].contiguous() for t in (blocks.qs, blocks.sz, blocks.lanes))
        tensors.append((qs, sz, lanes, module.q4_amx_layout(qs, sz)))
    for qs, sz, lanes, amx in tensors:
        for rows in (1, 8, 9, 17):
            x = _rows(rows, width, seed=rows)
            for coarse in (False, True):
                laid_out = _on("avx512-vnni", lambda: module.q4_matmul(x, qs, sz, coarse, lanes, amx), amx_rows=1)
                bare = _on("avx512-vnni", lambda: module.q4_matmul(x, qs, sz, coarse, lanes), amx_rows=1)
                assert torch.equal(laid_out, bare), (qs.shape, rows, coarse)
    with pytest.raises(RuntimeError, match="q4_amx_layout"):
        module.q4_matmul(_rows(8, width, 0), blocks.qs, blocks.sz, False, blocks.lanes, blocks.amx[:, :1].contiguous())


@pytest.mark.skipif(not has_q4 or not _amx(), reason="this CPU (or its kernel) has no AMX-INT8 for this process")
def test_a_stacked_parts_amx_layout_is_its_own_rows_of_the_joined_one():
    """A LoRA's A rows stacked under its base (one kernel call): the base's 16-row groups are a slice of
    the joined layout, the same bytes as its own; A's 8 rows end inside a group and get none (the tiles
    then transpose its bytes themselves)."""
    module = native_module()
    base = Int4WeightLinear(Int4Blocks.from_float(torch.randn(48, 576, generator=torch.Generator().manual_seed(1))))
    side = Int4WeightLinear(Int4Blocks.from_float(torch.randn(16, 576, generator=torch.Generator().manual_seed(2))))
    joined = Q4Blocks.stacked([base, side])
    assert joined.amx.shape[0] == 4
    own = Q4Blocks.of(base)
    assert own.amx.data_ptr() == joined.amx.data_ptr()  # a view: the bytes held once
    assert torch.equal(own.amx, module.q4_amx_layout(own.qs, own.sz))
    assert torch.equal(Q4Blocks.of(side).amx, module.q4_amx_layout(Q4Blocks.of(side).qs, Q4Blocks.of(side).sz))
    from model.lowbit.native_kernels import _amx_rows_of
    assert _amx_rows_of(joined.amx, 48, 56).numel() == 0 and _amx_rows_of(joined.amx, 0, 48).shape[0] == 3


@pytest.mark.skipif(not has_q4 or not _amx(), reason="this CPU (or its kernel) has no AMX-INT8 for this process")
@pytest.mark.parametrize("rows", [1, 5, 8, 9, 24])
def test_the_heads_coarse_scan_on_amx_tiles_is_the_lane_kernels_coarse_scan(rows):
    """From 8 rows the two-stage head's 8-bit scan runs on the tiles too: the same high bytes of the
    same codes as the lane kernel's coarse scan, so the same integers (float order apart), and the
    head's ranking and its exactly rescored logits follow. Up to 8 rows (padded to 8) the scan's A
    tile is the rows' hi bytes alone, not the fine scan's 16 stacked rows of hi and lo."""
    source, blocks = _weights(160, 576, seed=7)
    x = _rows(rows, 576, seed=8)
    tiles = _on("avx512-vnni", lambda: blocks(x, coarse=True), amx_rows=1)
    lane = _on("avx512-vnni", lambda: blocks(x, coarse=True))
    assert _relative(tiles, lane) < 1e-5  # ~1e-7 measured; a mixed-up row or column is O(1)
    assert _relative(tiles, _on("avx512-vnni", lambda: blocks(x))) < 0.05  # 8 bits against 16 (~1e-2)


@pytest.mark.parametrize("isa", ["avx512-vnni", "avx2"])
def test_the_heads_coarse_scan_ranks_a_batch_like_the_fine_one(isa):
    if isa not in _isas():
        pytest.skip(f"this CPU has no {isa}")
    source, blocks = _weights(160, 576, seed=5)
    x = _rows(9, 576, seed=6)
    fine = _on(isa, lambda: blocks(x))
    coarse = _on(isa, lambda: blocks(x, coarse=True))
    assert _relative(fine, x.double() @ _exact(source, blocks).T) < 1e-3
    assert _relative(coarse, fine) < 0.05  # 8-bit activations on AVX-512 (~1e-2); AVX2 computes all 16 bits


@pytest.mark.parametrize("isa", ["avx512-vnni", "avx2"])
@pytest.mark.parametrize("rows", [2, 5, 13])
def test_the_two_stage_head_rescores_every_row_of_a_batch_exactly(isa, rows):
    if isa not in _isas():
        pytest.skip(f"this CPU has no {isa}")
    torch.manual_seed(rows)
    linear = torch.nn.Linear(576, 1024, bias=False)
    with torch.no_grad():
        linear.weight.mul_(4.0)
    head = TwoStageHead.from_linear(linear, tied_rows=linear.weight.detach())
    x = torch.randn(rows, 576)
    ours = _on(isa, lambda: head(x))
    ranked = _on(isa, lambda: head.ranking(x))
    top = ranked.topk(head.candidates, dim=-1).indices
    exact = (linear.weight.detach()[top] @ x.unsqueeze(-1)).squeeze(-1)  # (rows, K): the float rows
    assert torch.allclose(ours.gather(1, top), exact, rtol=1e-4, atol=1e-4)
    full = x @ linear.weight.detach().T
    winners = full.argmax(-1)
    inside = (top == winners[:, None]).any(-1)
    assert inside.all()  # the float winner is among each row's 32 candidates here (4x weights: a clear winner)
    assert torch.equal(ours.argmax(-1), winners)  # so the head's argmax IS the float head's, row by row


def test_a_prompt_runs_the_q4_kernels_closer_to_float_than_torchs():
    source = Int4Blocks.from_float(torch.randn(96, 576, generator=torch.Generator().manual_seed(7)) * 0.05)
    module = Int4WeightLinear(source)
    blocks = q4_scan(module)
    assert blocks is not None  # where the q4 kernels run, prompts (any rows) take them too
    x = _rows(37, 576, seed=8).reshape(1, 37, 576)  # (B, T, C): a prefill
    reference = x.double() @ _exact(source, blocks).T
    ours, torchs = module(x), module.torch_forward(x)
    assert ours.shape == (1, 37, 96) and torch.equal(ours[0], blocks(x[0]))
    assert _relative(ours, reference) * 10 < _relative(torchs, reference) < 0.01  # int16 vs bfloat16 activations
    assert torch.equal(module.decode_call()(x[0]), ours[0])  # the lean layer's call is the same kernel
