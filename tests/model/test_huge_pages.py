"""The q4 kernels' weight copies on huge pages (model/common/huge_pages.py): the same bytes, aligned,
packed into shared chunks that the OS was asked to back with 2 MiB pages, and left alone where that is
switched off."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

from model.common import huge_pages
from model.common.huge_pages import HUGE_PAGE, HugePageArena, huge_page_buffer, huge_pages_enabled
from model.lowbit.native_kernels import Q4Blocks, native_module
from tests.support import tiny_model

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")
needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE") or not THP.exists()
    or "[never]" in THP.read_text(), reason="no transparent huge pages on this OS")


def _advised(tensor: torch.Tensor) -> bool:
    """The mapping that holds ``tensor`` was advised MADV_HUGEPAGE (/proc/self/smaps: "hg" among its
    VmFlags; whatever the system's THP mode, only advised mappings carry it)."""
    address, current, advised = tensor.data_ptr(), None, {}
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if not fields:
            continue
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            current = (start, end)
        elif fields[0] == "VmFlags:" and current is not None:
            advised[current] = "hg" in fields[1:]
    return any(start <= address < end and flag for (start, end), flag in advised.items())


@needs_thp
def test_a_buffer_starts_on_a_huge_page_and_is_advised():
    space = huge_page_buffer(3 << 20)
    assert space is not None and space.numel() == 3 << 20 and space.dtype == torch.uint8
    assert space.data_ptr() % HUGE_PAGE == 0
    assert _advised(space)


@needs_thp
def test_the_arena_keeps_the_bytes_and_packs_small_tensors_together():
    arena = HugePageArena(chunk_bytes=4 << 20)
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randint(0, 255, (37, 19), dtype=torch.uint8, generator=generator),
               torch.randn(5, 7, 2, generator=generator).to(torch.bfloat16),
               torch.randn(33, generator=generator)]
    placed = [arena.place(t) for t in tensors]
    for before, after in zip(tensors, placed):
        assert torch.equal(before, after) and after.dtype == before.dtype and after.shape == before.shape
        assert after.data_ptr() % 64 == 0 and after.data_ptr() != before.data_ptr() and _advised(after)
    # one chunk: each next to the last, 64-byte aligned
    assert placed[1].data_ptr() - placed[0].data_ptr() == 704 and placed[2].data_ptr() - placed[1].data_ptr() == 192
    large = arena.place(torch.ones(3 << 20, dtype=torch.uint8))  # past half a chunk: its own region
    assert large.data_ptr() % HUGE_PAGE == 0 and bool(large.all())


def test_without_memory_to_map_a_tensor_stays_where_it_is(monkeypatch, environment_settings):
    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    environment_settings(SKIPDECODE_HUGE_PAGES="")
    monkeypatch.setattr(mmap, "mmap", refuse)
    assert huge_page_buffer(1 << 20) is None
    plain = torch.ones(100)
    assert HugePageArena().place(plain) is plain


def test_switched_off_or_not_placeable_a_tensor_stays_where_it_is(environment_settings):
    arena = HugePageArena()
    for odd in (torch.empty(0), torch.ones(4, 6).t()):  # empty; not contiguous
        assert arena.place(odd) is odd
    environment_settings(SKIPDECODE_HUGE_PAGES="0")
    assert not huge_pages_enabled() and huge_page_buffer(1 << 20) is None
    plain = torch.ones(100)
    assert arena.place(plain) is plain


@needs_thp
@pytest.mark.skipif(native_module() is None, reason="no q4 kernels here")
def test_the_native_steps_q4_copies_live_on_huge_pages_with_the_same_bytes(environment_settings):
    from model.lowbit.native_step import projection_spec
    from model.lowbit.quantization import quantize_weights

    environment_settings(SKIPDECODE_HUGE_PAGES="", SKIPDECODE_INT4_KERNEL="")
    model = tiny_model("llama", hidden=256, heads=8, kv_heads=2, vocab=112)
    quantize_weights(model, "int4")
    down = model.model.layers[0].mlp.down_proj
    blocks = Q4Blocks.of(down)
    assert blocks is not None and not blocks.placed and not _advised(blocks.qs)  # a one-call user's blocks stay put
    before = [t.clone() for t in blocks.tensors() + blocks.layouts()]
    spec = projection_spec(down)  # what the native step is built with
    assert spec is not None and blocks.placed
    for tensor, old in zip(spec[1], before):
        assert torch.equal(tensor, old)
        if tensor.numel():
            assert _advised(tensor) and tensor.data_ptr() % 64 == 0
    qs = blocks.qs
    assert blocks.place().qs is qs  # once


@needs_thp
def test_a_cpu_kv_cache_lives_on_huge_pages_and_keeps_what_is_written(environment_settings):
    from model.skipdecode.kv_cache import PrefixKVCache

    environment_settings(SKIPDECODE_HUGE_PAGES="")
    cache = PrefixKVCache(num_layers=3, capacity=9)
    states = [torch.randn(2, 4, 5, 8) for _ in range(6)]  # (B, H_kv, T, D)
    for layer in range(3):
        keys, values = cache.update(states[2 * layer], states[2 * layer + 1], layer)
        assert torch.equal(keys, states[2 * layer]) and torch.equal(values, states[2 * layer + 1])
    for layer in range(3):
        assert _advised(cache._keys[layer]) and _advised(cache._values[layer])
        assert cache._keys[layer].shape == (2, 4, 9, 8) and cache._keys[layer].dtype == torch.float32
    # buffers do not overlap: every layer still holds what it was given
    assert all(torch.equal(cache._keys[layer][:, :, :5], states[2 * layer]) for layer in range(3))
    environment_settings(SKIPDECODE_HUGE_PAGES="0")
    plain = PrefixKVCache(num_layers=1, capacity=9)
    plain.update(states[0], states[1], 0)
    assert not _advised(plain._keys[0])


def test_the_freed_heap_is_handed_back_where_glibc_can(monkeypatch):
    calls = []

    class Libc:
        def malloc_trim(self, pad):
            calls.append(pad)
            return 1

    monkeypatch.setattr(huge_pages.ctypes, "CDLL", lambda name: Libc())
    huge_pages.release_freed_heap()
    assert calls == [0]

    class Other:  # a C library without malloc_trim (macOS, musl builds without it)
        pass

    monkeypatch.setattr(huge_pages.ctypes, "CDLL", lambda name: Other())
    huge_pages.release_freed_heap()  # nothing to call, nothing raised
    assert calls == [0]
