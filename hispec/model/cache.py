"""Per-layer KV cache whose layers are cut back independently.

Each layer owns a preallocated key/value buffer and a length. Writing appends in place,
rollback just lowers the length (as in gpt-fast), so discarding speculative tokens costs
nothing. Different layers may hold different numbers of positions: the draft layers know
the most tokens, the deepest layers only the committed ones.

The object is handed to transformers' decoder layers as their cache; they only call
``update(key_states, value_states, layer_idx, ...)``.
"""

from __future__ import annotations

import torch


class LayerKVCache:
    def __init__(self, num_layers: int, capacity: int = 256):
        self.num_layers = num_layers
        self.capacity = capacity
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.lengths = [0] * num_layers
        # Set while the buffers are lent by a graphs.StaticKV (CUDA graphs replay on them);
        # cleared when a layer outgrows them.
        self.storage = None

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        n, q = self.lengths[layer_idx], key_states.shape[-2]
        if self.keys[layer_idx] is None or n + q > self.keys[layer_idx].shape[-2]:
            self._grow(layer_idx, key_states, value_states, n + q)
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys[..., n : n + q, :] = key_states
        values[..., n : n + q, :] = value_states
        self.lengths[layer_idx] = n + q
        return keys[..., : n + q, :], values[..., : n + q, :]

    def _grow(self, layer_idx, key_states, value_states, needed):
        self.storage = None  # this layer leaves the lent buffers: no more graph replays on this cache
        capacity = max(self.capacity, needed)
        while capacity < needed:
            capacity *= 2
        self.capacity = max(self.capacity, capacity)
        n = self.lengths[layer_idx]
        if n and self.keys[layer_idx] is None:
            raise RuntimeError(f"layer {layer_idx} holds {n} positions but no buffer: this cache was released")
        fresh = []
        for old, new in ((self.keys[layer_idx], key_states), (self.values[layer_idx], value_states)):
            shape = (*new.shape[:-2], capacity, new.shape[-1])
            buf = torch.empty(shape, dtype=new.dtype, device=new.device)
            if old is not None and n:
                buf[..., :n, :] = old[..., :n, :]
            fresh.append(buf)
        self.keys[layer_idx], self.values[layer_idx] = fresh

    def release(self) -> None:
        """Give lent buffers back (the generation is over); lengths stay readable, contents do not."""
        if self.storage is not None:
            self.storage.give_back(self)
            self.storage = None
            self.keys = [None] * self.num_layers
            self.values = [None] * self.num_layers

    def crop(self, layer_idx: int, length: int) -> None:
        """Keep positions [0, length) of one layer (a no-op if it holds fewer)."""
        if length < 0:
            raise ValueError("cache length cannot be negative")
        self.lengths[layer_idx] = min(self.lengths[layer_idx], length)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
