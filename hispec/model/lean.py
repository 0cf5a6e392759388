"""The lean forward path: decoder-layer ranges without transformers' per-layer machinery.

The engine's hot loop runs a few layers over 1-16 new tokens at a time. transformers' stock
layer forward spends most of that time outside the matrix products (kwargs plumbing, mask
and rotary work per call, separate q/k/v and gate/up products). This module runs layer ranges
through the one decoder-layer kernel (``kernel.decoder_layer``) on the model's own weights:

- q/k/v and gate/up projections fused into one product each;
- on CPU, weights prepacked once for oneDNN (``mkldnn``), which runs small-batch products
  about 2x faster than the stock kernel and gives each row the same bits whatever the
  number of rows (so a verification pass agrees bit for bit with one-token steps);
- rotary cos/sin read from a table built once (same formula as the model's rotary module),
  one mask per call shared by every layer of the range;
- keys and values written in place into the engine's preallocated ``LayerKVCache``.

It covers the layouts in ``SUPPORTED_ARCHITECTURES`` (Llama, Mistral, Qwen2 with q/k/v bias,
Qwen3 with per-head q/k norms). Anything else the lean path cannot reproduce exactly
(accelerate offload hooks, forward hooks on the layers, dynamic rope scaling, quantised weights)
keeps the stock path; hooks added after the engine wraps the model are not called on the lean path:
``LeanPath.support(model)`` says why.
"""

from __future__ import annotations

import torch
from torch import nn

from hispec.model.cache import LayerKVCache
from hispec.model.kernel import (
    PACK_LIMIT_BYTES,
    LayerWeights,
    RotaryTable,
    can_pack,
    causal_mask,
    decoder_layer,
    fused,
    rms_norm,
)


class LeanPath:
    """Fast execution of layer ranges of one model, sharing its weights' values."""

    def __init__(self, ee, pack: bool | None = None):
        device = ee.device
        # a float32 model on its file's blocks (EarlyExitModel.use_blocks): the products widen the blocks to
        # the model's float32 weights in registers (q4.WideProjection), no oneDNN packing
        blocks = getattr(ee, "blocks", None)
        if pack is None:
            size = sum(p.numel() * p.element_size() for layer in ee.layers for p in layer.parameters())
            pack = device.type == "cpu" and ee.dtype == torch.float32 and can_pack() and size <= PACK_LIMIT_BYTES
            pack = pack and getattr(ee.model, "hispec_weights", "fp32") != "q4"  # 4-bit blocks: their own kernel
            pack = pack and blocks is None
        self.packed = pack
        fuse = None
        if blocks is not None:
            from hispec.model.formats.q4 import wide_fuse

            fuse = wide_fuse(blocks)
        self.layers = [LayerWeights(layer, pack, fuse) for layer in ee.layers]
        self.rotary = RotaryTable(ee.rotary_emb, ee.dtype)
        self.dtype, self.device = ee.dtype, device
        lm_head = ee.final_head.lm_head
        self.lm_head = (fuse or fused)([lm_head], pack) if isinstance(lm_head, nn.Linear) else lm_head
        # 4-bit layers, and float32 layers on their blocks: one native call per layer range (q4_layer.py)
        # unless HISPEC_Q4_NATIVE=0 or the layout is not covered; None runs kernel.decoder_layer (the
        # reference route).
        self.native = None
        if getattr(ee.model, "hispec_weights", "fp32") == "q4" or blocks is not None:
            from hispec.model.formats import q4_layer

            if q4_layer.enabled_by_env() and q4_layer.support(self) is None:
                self.native = q4_layer.NativeLayers(self, mode="wide" if blocks is not None else "q4")

    @staticmethod
    def support(model: nn.Module) -> str | None:
        """None if the lean path reproduces this model's layers; otherwise the reason it cannot."""
        if any(hasattr(m, "_hf_hook") for m in model.modules()):
            return "layers are dispatched by accelerate hooks (device_map/offload)"
        if any(m._forward_hooks or m._forward_pre_hooks for m in model.model.layers.modules()):
            return "its layers have forward hooks, which the lean path would not call"
        rope_type = getattr(model.model.rotary_emb, "rope_type", "default")
        if "dynamic" in str(rope_type) or "longrope" in str(rope_type):
            return f"rope type '{rope_type}' changes with the sequence length"
        for p in model.model.layers.parameters():
            if not p.is_floating_point() or p.device.type == "meta":
                return "weights are quantised or not materialised"
        layer = model.model.layers[0]
        if getattr(model.config, "hidden_act", "silu") not in ("silu", "gelu", "gelu_pytorch_tanh", "relu"):
            return f"activation '{model.config.hidden_act}' is not covered"
        if getattr(layer.mlp, "down_proj", None) is None or getattr(layer.self_attn, "q_proj", None) is None:
            return "layer layout differs from Llama's"
        return None

    @torch.inference_mode()
    def run_layers(self, hidden: torch.Tensor, start: int, end: int, cache: LayerKVCache) -> torch.Tensor:
        """Run layers [start, end) on `hidden` (1, q, hidden), appending to each layer's cache."""
        if self.native is not None:
            return self.native.run_layers(hidden, start, end, cache)
        past, q_len = cache.lengths[start], hidden.shape[1]
        cos, sin = self.rotary.rows(past, q_len, hidden.device)
        mask, causal = causal_mask(past, q_len, hidden.device)
        for idx in range(start, end):
            if cache.lengths[idx] != past:  # the stack's invariant: one frontier per segment
                raise RuntimeError(f"layer {idx} cache holds {cache.lengths[idx]} positions, expected {past}")
            hidden = decoder_layer(self.layers[idx], hidden, cos, sin, _appender(cache, idx), mask, causal)
        return hidden

    def rotary_table(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin tables, covering at least positions [0, size)."""
        self.rotary.ensure(size, self.device)
        return self.rotary.cos, self.rotary.sin

    def run_layers_static(self, hidden: torch.Tensor, start: int, end: int, kv, base: torch.Tensor) -> torch.Tensor:
        """run_layers with shapes that do not depend on the position (what a CUDA graph can replay).

        The new tokens sit at positions base + [0, q), `base` a one-element device tensor. Keys and
        values are written there with index_copy_, and attention reads each layer's whole buffer
        under a mask that hides every slot beyond a token's own position (slots never written hold
        finite values). `kv` holds the buffers (``graphs.StaticKV``); the caller advances the cache's lengths.
        """
        q_len, capacity = hidden.shape[1], kv.keys[start].shape[-2]
        positions = base + torch.arange(q_len, device=hidden.device)
        table = self.rotary
        cos, sin = table.cos.index_select(0, positions)[:, None], table.sin.index_select(0, positions)[:, None]
        mask = torch.arange(capacity, device=hidden.device)[None, :] <= positions[:, None]
        for idx in range(start, end):
            hidden = decoder_layer(self.layers[idx], hidden, cos, sin, _writer_at(kv, idx, positions), mask)
        return hidden

    def logits(self, hidden: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """The final head (norm + LM head) with the prepacked LM head."""
        return self.lm_head(rms_norm(hidden, norm))


def _appender(cache: LayerKVCache, idx: int):
    """Keys and values appended to layer idx of the engine's cache; attend over all it holds."""
    return lambda k, v: cache.update(k, v, idx)


def _writer_at(kv, idx: int, positions: torch.Tensor):
    """Static shapes: write at device positions, attend over the whole (masked) buffer."""
    def write(k, v):
        keys, values = kv.keys[idx], kv.values[idx]
        keys.index_copy_(2, positions, k)
        values.index_copy_(2, positions, v)
        return keys, values
    return write
