"""One CUDA graph per layer set: the static decode step (model/skipdecode/static_decoder.py)
captured with ``torch.cuda.graph`` on first use and replayed for every later step of that layer
set, across steps and requests (docs/DESIGN.md, "The static KV cache and one CUDA graph per layer
set"). A SkipDecode run meets at most max_layers - min_layers + 1 layer sets (n_k only falls), so
a run captures at most that many graphs; they are kept in an LRU bounded by count and bytes.

    GraphLRU        the bookkeeping alone (no CUDA): least recently used first out, by count and bytes
    CudaGraphStep   the step runner: buffers per (model, batch bucket, capacity), leased per run (a batch
                    padded up to its bucket: 1, 2, 4 ... 64); a graph per (buffers, weights, bridge,
                    layer set), captured lazily, capture time kept
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence, cast

import torch

from model.common.progress import say
from model.skipdecode.decoder import SkipDecoder
from model.skipdecode.static_decoder import BATCH_BUCKETS, StepBuffers, batch_bucket, static_step

DEFAULT_MAX_GRAPHS = 64
DEFAULT_MAX_BYTES = 2 << 30  # 2 GiB of graph-held memory (outputs and workspaces), an H100 has 80
CAPACITY_MULTIPLE = 256  # capacities round up to this, so requests of similar length share graphs
MAX_FREE_BUFFERS = 8  # free buffers kept for later runs (each with its graphs); older free ones are dropped


class GraphLRU:
    """Values with a size in bytes, at most ``max_count`` of them and ``max_bytes`` together;
    ``put`` evicts the least recently used (``get`` counts as a use) and names what it evicted.
    A value bigger than ``max_bytes`` alone is still kept (the newest is never evicted)."""

    def __init__(self, max_count: int, max_bytes: int) -> None:
        if max_count < 1 or max_bytes < 1:
            raise ValueError(f"a graph cache needs room for one graph (count {max_count}, bytes {max_bytes})")
        self.max_count, self.max_bytes = max_count, max_bytes
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self._items.values())

    def get(self, key: Hashable) -> Any | None:
        item = self._items.get(key)
        if item is None:
            return None
        self._items.move_to_end(key)
        return item[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> list[Hashable]:
        self._items[key] = (value, int(nbytes))
        self._items.move_to_end(key)
        evicted: list[Hashable] = []
        while len(self._items) > 1 and (len(self._items) > self.max_count or self.nbytes > self.max_bytes):
            oldest = next(iter(self._items))
            del self._items[oldest]
            evicted.append(oldest)
        self.evictions += len(evicted)
        return evicted

    def keys(self) -> list[Hashable]:
        """Least recently used first."""
        return list(self._items)

    def drop(self, keep: Callable[[Hashable], bool]) -> None:
        """Forget every value whose key ``keep`` refuses (not counted as evictions)."""
        for key in [key for key in self._items if not keep(key)]:
            del self._items[key]


def rounded_capacity(capacity: int, max_context: int, multiple: int = CAPACITY_MULTIPLE) -> int:
    """``capacity`` rounded up to ``multiple`` (never past the model's context, never below the
    capacity asked): runs of similar length then share buffers and graphs."""
    rounded = -(-capacity // multiple) * multiple
    return max(capacity, min(rounded, max_context))


@dataclass
class CapturedStep:
    graph: Any  # torch.cuda.CUDAGraph
    logits: torch.Tensor  # (B, V): the graph's output, overwritten by every replay
    nbytes: int  # device memory the capture kept (outputs, workspaces), at least the logits
    seconds: float  # warm-up + capture


@dataclass
class CaptureReport:
    """What capturing has cost so far: a page says "preparing the GPU: n graphs, s seconds"."""

    graphs: int  # captured since the runner started (evicted ones included)
    seconds: float  # capturing them, compiles included (a compiled layer's first call is in its first capture)
    kept: int  # graphs held now
    kept_bytes: int
    evicted: int
    compiled: int = 0  # compiled layer functions (kind x batch bucket), where the step compiles its layers
    compile_seconds: float = 0.0


class CudaGraphStep:
    """A StepRunner that replays one CUDA graph per layer set (``torch.cuda.graph`` directly: see
    docs/DESIGN.md for why not ``torch.compile``). Buffers are kept per (model, batch, capacity)
    and leased to one run at a time (a race runs two streams on one model: each gets its own);
    a graph belongs to its buffers, so it serves every later run that leases them."""

    def __init__(self, max_graphs: int = DEFAULT_MAX_GRAPHS, max_bytes: int = DEFAULT_MAX_BYTES,
                 capacity_multiple: int = CAPACITY_MULTIPLE, step: Callable[..., torch.Tensor] = static_step,
                 batch_buckets: Sequence[int] | None = BATCH_BUCKETS) -> None:
        # what a graph captures: static_step, or the compiled layers' step (model/skipdecode/compiled_layers.py)
        self.step = step
        self.batch_buckets = batch_buckets  # a batch runs in buffers (and graphs) of its bucket
        self.graphs = GraphLRU(max_graphs, max_bytes)
        self.capacity_multiple = capacity_multiple
        self._buffers: list[tuple[weakref.ref, StepBuffers]] = []
        self._pool: Any = None  # one memory pool shared by every graph (they never run at once)
        self.captured = 0
        self.capture_seconds = 0.0
        self.failed: set[Hashable] = set()  # keys whose capture failed: they run eagerly

    def capacity_for(self, capacity: int, max_context: int) -> int:
        return rounded_capacity(capacity, max_context, self.capacity_multiple)

    def lease(self, decoder: SkipDecoder, batch: int, capacity: int, device: torch.device) -> StepBuffers:
        """Free buffers of this model, batch and capacity (their graphs come with them), or new ones."""
        self._trim()
        bucket = batch_bucket(batch, self.batch_buckets)
        for model, buffers in self._buffers:
            if (model() is decoder.model and buffers.free and buffers.batch == bucket
                    and buffers.capacity == capacity and buffers.position.device == device):
                buffers.reset()
                buffers.hold_rows(batch)
                return buffers
        buffers = StepBuffers(decoder.num_layers, bucket, capacity, device)
        buffers.hold_rows(batch)
        self._buffers.append((weakref.ref(decoder.model), buffers))
        return buffers

    def _trim(self) -> None:
        """Drop the buffers of models that are gone and the oldest free ones past MAX_FREE_BUFFERS, with
        their graphs (a graph replays into its buffers' memory: it goes with them)."""
        alive = [(model, buffers) for model, buffers in self._buffers if model() is not None]
        free = [buffers for _, buffers in alive if buffers.free]
        dropped = {id(buffers) for buffers in free[:max(0, len(free) - MAX_FREE_BUFFERS)]}
        self._buffers = [(model, buffers) for model, buffers in alive if id(buffers) not in dropped]
        kept = {id(buffers) for _, buffers in self._buffers}
        self.graphs.drop(lambda key: id(cast(tuple, key)[0]) in kept)  # a key: (buffers, weights, bridge, layers)
        self.failed = {key for key in self.failed if id(cast(tuple, key)[0]) in kept}

    def run(self, decoder: SkipDecoder, buffers: StepBuffers, layers: tuple[int, ...]) -> torch.Tensor:
        """The step by graph replay (captured first where this layer set has none yet); a copy of
        the logits, since the next replay overwrites the graph's output."""
        weights, _ = decoder._weights_for(layers)
        # The objects themselves, not their ids: a graph holds their memory's addresses, so the key
        # keeps them alive as long as the graph (an id could be reused by a new model).
        key = (buffers, weights.model, decoder.bridge, layers)
        if key in self.failed:
            return self.step(decoder, buffers, layers)
        captured = self.graphs.get(key)
        if captured is None:
            try:
                captured = self._capture(decoder, buffers, layers)
            except RuntimeError as error:  # a step torch cannot capture: this layer set runs eagerly
                self.failed.add(key)
                say(f"CUDA graph capture failed for a {len(layers)}-layer step ({error}); it runs eagerly")
                return self.step(decoder, buffers, layers)
            self.graphs.put(key, captured, captured.nbytes)
        captured.graph.replay()
        return captured.logits.clone()

    def report(self) -> CaptureReport:
        compiles = getattr(self.step, "report", None)  # the compiled layers' step says what it compiled
        compiled = compiles() if callable(compiles) else None
        return CaptureReport(self.captured, self.capture_seconds, len(self.graphs), self.graphs.nbytes,
                             self.graphs.evictions, compiled.compiled if compiled else 0,
                             compiled.seconds if compiled else 0.0)

    def _capture(self, decoder: SkipDecoder, buffers: StepBuffers, layers: tuple[int, ...]) -> CapturedStep:
        """Warm up on a side stream (lazy initialisations happen outside the graph; the warm-up
        writes the very column the replay then writes again, with the same values), then capture."""
        start = time.perf_counter()
        device = buffers.position.device
        before = torch.cuda.memory_allocated(device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            self.step(decoder, buffers, layers)
        torch.cuda.current_stream(device).wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a server's other threads (an abandoned request finishing its layer) may use the GPU meanwhile
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            logits = self.step(decoder, buffers, layers)
        torch.cuda.synchronize(device)
        nbytes = max(torch.cuda.memory_allocated(device) - before, logits.numel() * logits.element_size())
        seconds = time.perf_counter() - start
        self.captured += 1
        self.capture_seconds += seconds
        return CapturedStep(graph, logits, nbytes, seconds)
