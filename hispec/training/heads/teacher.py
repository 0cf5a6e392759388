"""Batched greedy generation on the lean path, for teacher data (train-exits).

transformers' batched `generate()` reaches only about 75 tokens/s on the 2-core CPU at batch
16-48 for the 135M default model: most of its step is spent outside the matrix products.
The lean path's prepacked products cost about the same for 1 and 32 rows, so decoding many
prompts at once in it is several times faster. This is used only to make training data: the
engine's own decoding (and its exactness) never goes through here.

Prompts are left-padded. Each row has its own positions (rotary) and a mask that hides its pads;
a pad query sees only itself, so no row of the attention is empty (an all-masked row would give
NaN, and NaN values times a zero weight are still NaN).
"""

from __future__ import annotations

from typing import Iterable

import torch

from hispec.model.kernel import decoder_layer
from hispec.model.lean import LeanPath


def _batch_writer(keys: torch.Tensor, values: torch.Tensor, past: int):
    """Write the rows' keys/values at [past, past + q); attend over [0, past + q)."""
    def write(k, v):
        q_len = k.shape[2]
        keys[:, :, past : past + q_len] = k
        values[:, :, past : past + q_len] = v
        return keys[:, :, : past + q_len], values[:, :, : past + q_len]
    return write


@torch.inference_mode()
def greedy(ee, prompts: list[list[int]], max_new_tokens: int, eos_ids: Iterable[int] = (),
           pad_id: int = 0, lean: LeanPath | None = None) -> list[list[int]]:
    """Greedy continuations of a batch of prompts (token ids), each cut after its first eos.
    `lean`: the lean path to run (default: the engine's, or one built here)."""
    lean = lean or ee.lean or LeanPath(ee)
    eos = torch.tensor(sorted({int(t) for t in eos_ids}), dtype=torch.long, device=ee.device)
    B, width = len(prompts), max(len(p) for p in prompts)
    total = width + max_new_tokens
    pads = torch.tensor([width - len(p) for p in prompts], device=ee.device)
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], device=ee.device)
    lean.rotary.ensure(total, ee.device)  # the table, long enough for every position
    slots = torch.arange(total, device=ee.device)
    caches = [(torch.empty(B, w.n_kv, total, w.head_dim, dtype=ee.dtype, device=ee.device),
               torch.empty(B, w.n_kv, total, w.head_dim, dtype=ee.dtype, device=ee.device)) for w in lean.layers]
    out = torch.full((B, max_new_tokens), pad_id, dtype=torch.long, device=ee.device)
    rows = torch.arange(B, device=ee.device)  # which prompts are still being decoded
    past, new = 0, ids
    for step in range(max_new_tokens):
        q_len = new.shape[1]
        query = slots[past : past + q_len]
        positions = (query[None] - pads[:, None]).clamp(min=0)  # (B, q): each row counts from its own start
        cos, sin = lean.rotary.cos[positions][:, :, None], lean.rotary.sin[positions][:, :, None]
        key = slots[: past + q_len]
        visible = (key[None, None] <= query[None, :, None]) & (key[None, None] >= pads[:, None, None])
        mask = (visible | (key[None, None] == query[None, :, None]))[:, None]  # (B, 1, q, keys)
        hidden = ee.embed_tokens(new)
        for w, (keys, values) in zip(lean.layers, caches):
            hidden = decoder_layer(w, hidden, cos, sin, _batch_writer(keys, values, past), mask)
        token = lean.logits(hidden[:, -1:], ee.final_head.norm)[:, 0].argmax(-1)
        out[rows, step] = token
        past += q_len
        active = ~torch.isin(token, eos)
        if not bool(active.all()):  # drop finished rows: their caches are no longer needed
            if not bool(active.any()):
                break
            rows, pads, token = rows[active], pads[active], token[active]
            caches = [(k[active], v[active]) for k, v in caches]
        new = token[:, None]
    result, stop = [], set(eos.tolist())
    for row in out.tolist():
        cut = next((k + 1 for k, t in enumerate(row) if t in stop), max_new_tokens)
        result.append(row[:cut])
    return result
