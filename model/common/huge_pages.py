"""What a decode step streams (the q4 kernels' weight copies, a CPU KV cache) on 2 MiB pages where Linux
gives them.

Why: a decode step reads every weight once, and with 4 KiB pages each 4 KiB is a TLB entry; in a
virtual machine a TLB miss walks two page tables (the guest's and the host's). On the 2-core Xeon VM this
project is built on, a large read ran 1.25x faster on 2 MiB pages, and the int4 default model's batch-1
step 1.04x-1.07x (docs/RESULTS.md, round seven). torch's own
allocator asks for huge pages only for single allocations of 2 MiB and more (and only under
THP_MEM_ALLOC_ENABLE, read before its first allocation), while a layer's copies are 0.1-1 MiB each; so
they are packed here into shared chunks of anonymous memory marked MADV_HUGEPAGE (Linux's transparent
huge pages in "madvise" mode, the common default, then back them with 2 MiB pages when it can).

The bytes are the same; only where they live changes. Elsewhere (no MADV_HUGEPAGE, or
SKIPDECODE_HUGE_PAGES=0) a tensor stays where it is.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import threading

import torch

from model.common.settings import settings

HUGE_PAGE = 2 << 20
CHUNK_BYTES = 32 << 20  # a chunk's unused tail is the most this wastes at once
ALIGN = 64  # the kernels' aligned loads


def huge_pages_enabled() -> bool:
    """This OS can be asked for transparent huge pages and SKIPDECODE_HUGE_PAGES is not 0."""
    return hasattr(mmap, "MADV_HUGEPAGE") and settings().huge_pages


def huge_page_buffer(nbytes: int) -> torch.Tensor | None:
    """A uint8 tensor of ``nbytes`` starting on a 2 MiB boundary, in anonymous memory advised for huge
    pages before any of it is touched (pages are granted when first written); None where unavailable."""
    if not huge_pages_enabled():
        return None
    size = nbytes + HUGE_PAGE  # room to start on a boundary
    try:
        region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    except (OSError, ValueError):  # no address space or memory for it: torch's own allocation instead
        return None
    try:
        region.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages
        region.close()
        return None
    whole = torch.frombuffer(region, dtype=torch.uint8)  # keeps the mapping alive as long as any view
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + nbytes]


class HugePageArena:
    """Copies of tensors packed into shared huge-page chunks (64-byte aligned). A chunk is freed when no
    tensor placed in it is left."""

    def __init__(self, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.chunk_bytes = chunk_bytes
        self._chunk: torch.Tensor | None = None
        self._used = 0
        self._lock = threading.Lock()

    def place(self, tensor: torch.Tensor) -> torch.Tensor:
        """A contiguous copy of ``tensor`` in the arena, or ``tensor`` itself (empty, not on the CPU, not
        contiguous, or no huge pages here)."""
        if tensor.numel() == 0 or tensor.device.type != "cpu" or not tensor.is_contiguous():
            return tensor
        nbytes = tensor.numel() * tensor.element_size()
        space = self._take(nbytes)
        if space is None:
            return tensor
        placed = space.view(tensor.dtype).view(tensor.shape)
        placed.copy_(tensor)
        return placed

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor in the arena, or None (no huge pages here)."""
        nbytes = math.prod(shape) * dtype.itemsize
        space = self._take(nbytes) if nbytes else None
        return None if space is None else space.view(dtype).view(shape)

    def _take(self, nbytes: int) -> torch.Tensor | None:
        padded = -(-nbytes // ALIGN) * ALIGN
        if padded > self.chunk_bytes // 2:  # a large tensor gets its own region
            return huge_page_buffer(nbytes)
        with self._lock:
            if self._chunk is None or self._used + padded > self._chunk.numel():
                self._chunk, self._used = huge_page_buffer(self.chunk_bytes), 0
                if self._chunk is None:
                    return None
            space = self._chunk[self._used:self._used + nbytes]
            self._used += padded
            return space


_weights = HugePageArena()


def on_huge_pages(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied into the process's weight arena (HugePageArena.place)."""
    return _weights.place(tensor)


def release_freed_heap() -> None:
    """Give the C heap's free pages back to the OS (glibc's malloc_trim): the 4 KiB copies that placements
    replaced stay resident otherwise (44 MB for the default model in int4). Elsewhere nothing."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return
    trim(0)
