"""CUDA graphs for the decode loop's layer passes (opt-in: ``EarlyExitModel.set_graphs``).

On a GPU, a pass of a few tokens through a few layers is bound by kernel launches and Python,
not by arithmetic: one token through the 16 layers of the Llama3.2-1B shape took 8.8 ms on an
H200 (``assets/gpu/gpu_check_h200.json``), where reading its weights takes well under 1 ms. A
CUDA graph replays all of a pass's kernels with one launch. Graphs need fixed shapes and fixed
addresses, so:

- keys and values live in a ``StaticKV``: one zero-filled buffer per layer at a fixed capacity,
  lent to one generation's cache at a time (``new_cache``), so that graphs outlive a generation.
  The graphs belong to their buffers (``StaticKV.graphs``): a pass only ever replays a graph
  captured on the buffers its own cache holds, whichever thread made or replaced them;
- a pass is captured once per (first layer, end layer, number of new tokens), the first time it
  is met, from ``LeanPath.run_layers_static``: the positions come from a device tensor filled
  before each replay and attention reads the whole buffer under a mask;
- prefills and passes over more than ``max_tokens`` tokens run eagerly, as without graphs.

A replay adds no host-device synchronisation: the position is written with a fill kernel and the
output is copied out on the device.

Backends: "cuda" captures real graphs; "emulate" replays by calling the same static function
(CPU tests: same buffers, same arithmetic, same bookkeeping, no CUDA).
"""

from __future__ import annotations

import threading
import weakref

import torch

from hispec.model.cache import LayerKVCache
from hispec.errors import ConfigError

BACKENDS = ("cuda", "emulate")


class StaticKV:
    """Per-layer key/value buffers at a fixed capacity, lent to one cache at a time."""

    def __init__(self, lean, capacity: int):
        def buffer(w):
            return torch.zeros((1, w.n_kv, capacity, w.head_dim), dtype=lean.dtype, device=lean.device)

        # Zero-filled: slots not yet written are read under a mask, and must not hold NaNs.
        self.keys = [buffer(w) for w in lean.layers]
        self.values = [buffer(w) for w in lean.layers]
        self.capacity = capacity
        # Graphs captured on these buffers, by (first layer, end layer, new tokens); only the
        # cache holding the buffers replays them, so one generation at a time touches them.
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self._owner: weakref.ref | None = None
        self._lock = threading.Lock()  # generations on other threads may ask at the same moment

    def in_use(self) -> bool:
        return self._owner is not None and self._owner() is not None

    def lend(self) -> LayerKVCache | None:
        """A cache on these buffers, or None while another cache holds them."""
        with self._lock:
            if self.in_use():
                return None
            cache = LayerKVCache(len(self.keys), self.capacity)
            cache.keys, cache.values = list(self.keys), list(self.values)
            cache.storage = self
            self._owner = weakref.ref(cache)
            return cache

    def give_back(self, cache: LayerKVCache) -> None:
        with self._lock:
            if self._owner is not None and self._owner() is cache:
                self._owner = None


class _Graph:
    """One captured pass: static input, position and output tensors around a replayable call."""

    def __init__(self, hidden: torch.Tensor):
        self.inp = torch.empty_like(hidden)
        self.base = torch.zeros(1, dtype=torch.long, device=hidden.device)
        self.out: torch.Tensor | None = None
        self.graph = None  # torch.cuda.CUDAGraph once captured (cuda backend)
        self.fn = None
        self.tables = None


class LayerGraphs:
    """Captures and replays the lean path's layer passes for one model."""

    def __init__(self, ee, backend: str = "cuda", max_tokens: int = 16):
        if backend not in BACKENDS:
            raise ConfigError(f"unknown graph backend '{backend}'; allowed: {', '.join(BACKENDS)}")
        if ee.lean is None:
            raise ConfigError(f"CUDA graphs need the lean path, which cannot run this model: {ee.stock_reason}")
        if backend == "cuda" and ee.device.type != "cuda":
            raise ConfigError(f"CUDA graphs need the model on a CUDA device; it is on {ee.device}")
        self.ee, self.lean, self.backend, self.max_tokens = ee, ee.lean, backend, max_tokens
        self.storage: StaticKV | None = None
        self._lock = threading.Lock()  # generations on several threads ask for buffers at once
        self.pool = torch.cuda.graph_pool_handle() if backend == "cuda" else None
        self.captures = 0
        self.replays = 0
        self.disabled: str | None = None  # why capture failed; every pass then runs eagerly

    def new_cache(self, capacity: int) -> LayerKVCache | None:
        """A cache on the static buffers (None if another generation holds them: it runs eagerly)."""
        with self._lock:
            if self.storage is None or capacity > self.storage.capacity:
                if self.storage is not None and self.storage.in_use():
                    return None
                size = 256
                while size < capacity:
                    size *= 2
                # New buffers, new addresses: the old buffers go, and their graphs with them.
                self.storage = None
                self.lean.rotary_table(size)  # positions up to the capacity, before any capture
                self.storage = StaticKV(self.lean, size)
            return self.storage.lend()

    @property
    def graphs(self) -> dict[tuple[int, int, int], _Graph]:
        """The graphs captured on the current buffers."""
        return {} if self.storage is None else self.storage.graphs

    @torch.inference_mode()
    def run(self, hidden: torch.Tensor, start: int, end: int, cache: LayerKVCache) -> torch.Tensor | None:
        """Layers [start, end) by graph replay, or None where this pass runs eagerly."""
        q_len, past = hidden.shape[1], cache.lengths[start]
        storage = cache.storage  # lent to this cache alone: its graphs are this generation's
        if self.disabled or storage is None or past == 0 \
                or q_len > self.max_tokens or past + q_len > storage.capacity:
            return None
        for idx in range(start, end):
            if cache.lengths[idx] != past:  # the stack's invariant: one frontier per segment
                raise RuntimeError(f"layer {idx} cache holds {cache.lengths[idx]} positions, expected {past}")
        key = (start, end, q_len)
        graph = storage.graphs.get(key)
        if graph is None:
            graph = storage.graphs[key] = _Graph(hidden)
        graph.base.fill_(past)  # a fill kernel: no synchronisation
        graph.inp.copy_(hidden)
        if graph.fn is None:
            try:
                self._capture(graph, start, end, storage)
            except RuntimeError as exc:  # an op that cannot be captured: run eagerly from now on
                # The warm-up may have written this pass's keys and values; the eager pass
                # rewrites the same positions (the lengths have not moved).
                self.disabled = f"capture of layers [{start}, {end}) x {q_len} failed: {exc}"
                storage.graphs.clear()
                return None
        if graph.graph is not None:
            graph.graph.replay()
        else:
            graph.out = graph.fn()
        self.replays += 1
        for idx in range(start, end):
            cache.lengths[idx] = past + q_len
        return graph.out.clone()  # the static output is overwritten by the next replay

    def _capture(self, graph: _Graph, start: int, end: int, storage: StaticKV) -> None:
        graph.tables = (self.lean.rotary.cos, self.lean.rotary.sin)  # kept alive: a captured graph reads their addresses

        def fn():
            return self.lean.run_layers_static(graph.inp, start, end, storage, graph.base)

        graph.fn = fn
        self.captures += 1
        if self.backend != "cuda":
            return
        # Warm up on a side stream (allocator, library workspaces), then capture. The warm-up
        # writes the same keys and values at the same positions as the replay that follows.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream().wait_stream(stream)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph, pool=self.pool):
            graph.out = fn()
        graph.graph = cuda_graph
