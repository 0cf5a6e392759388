"""The lean forward path: decoder-layer ranges without transformers' per-layer machinery.

The engine's hot loop runs a few layers over 1-16 new tokens at a time. transformers' stock
layer forward spends most of that time outside the matrix products (kwargs plumbing, mask
and rotary work per call, separate q/k/v and gate/up products). This module runs the same
arithmetic of a Llama-family decoder layer directly on the model's own weights:

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

import os

import torch
import torch.nn.functional as F
from torch import nn

from .cache import LayerKVCache

# Packed weights are a second copy of the model's projections; skip packing above this size.
PACK_LIMIT_BYTES = int(os.environ.get("HISPEC_PACK_LIMIT_MB", "4096")) * 2**20


def _can_pack() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


class Projection:
    """y = x @ W.T (+ b), with W prepacked for oneDNN on CPU when `pack`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, pack: bool):
        self.bias = None if bias is None else bias.detach()
        self.out_features = weight.shape[0]
        self.packed = pack
        if pack:
            self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())
        else:
            self.weight = weight.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def _fused(linears: list[nn.Linear], pack: bool) -> Projection:
    """One projection computing several linears at once (outputs concatenated).

    Unpacked (GPU, large models), the modules' own weights become views into the fused tensor,
    so fusing costs no memory and transformers' stock layers keep working on the same storage.
    """
    weight = linears[0].weight.detach()
    if len(linears) > 1:
        weight = torch.cat([m.weight.detach() for m in linears])
        if not pack:
            _share(linears, weight, "weight")
    if all(m.bias is None for m in linears):
        bias = None
    else:
        bias = torch.cat([m.bias.detach() if m.bias is not None else torch.zeros(m.out_features, dtype=weight.dtype,
                                                                                  device=weight.device)
                          for m in linears])
        if not pack and all(m.bias is not None for m in linears):
            _share(linears, bias, "bias")
    return Projection(weight, bias, pack)


def _share(linears: list[nn.Linear], fused: torch.Tensor, name: str) -> None:
    start = 0
    for m in linears:
        param = getattr(m, name)
        param.data = fused[start : start + param.shape[0]]
        start += param.shape[0]


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    # The model's RMSNorm: normalise in float32, cast back, then scale (same order as transformers).
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * y.to(x.dtype)


class _Layer:
    """One decoder layer's weights in the shapes the lean path uses."""

    def __init__(self, layer: nn.Module, pack: bool):
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv = _fused([attn.q_proj, attn.k_proj, attn.v_proj], pack)
        self.o = _fused([attn.o_proj], pack)
        self.gate_up = _fused([mlp.gate_proj, mlp.up_proj], pack)
        self.down = _fused([mlp.down_proj], pack)
        self.act = mlp.act_fn
        self.q_norm = getattr(attn, "q_norm", None)  # Qwen3: RMSNorm over each head's features
        self.k_norm = getattr(attn, "k_norm", None)
        self.scaling = attn.scaling
        self.head_dim = attn.head_dim
        self.n_heads = attn.q_proj.out_features // attn.head_dim
        self.n_kv = attn.k_proj.out_features // attn.head_dim
        self.intermediate = mlp.gate_proj.out_features


class LeanPath:
    """Fast execution of layer ranges of one model, sharing its weights' values."""

    def __init__(self, ee, pack: bool | None = None):
        device = ee.device
        if pack is None:
            size = sum(p.numel() * p.element_size() for layer in ee.layers for p in layer.parameters())
            pack = device.type == "cpu" and ee.dtype == torch.float32 and _can_pack() and size <= PACK_LIMIT_BYTES
        self.packed = pack
        self.layers = [_Layer(layer, pack) for layer in ee.layers]
        self.rotary_emb = ee.rotary_emb
        self.dtype, self.device = ee.dtype, device
        self._cos = self._sin = None
        lm_head = ee.final_head.lm_head
        self.lm_head = _fused([lm_head], pack) if isinstance(lm_head, nn.Linear) else lm_head

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

    def _rotary(self, past: int, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin rows for positions [past, past + q_len), shaped (1, q_len, 1, head_dim)."""
        need = past + q_len
        if self._cos is None or self._cos.shape[0] < need:
            size = max(256, need, 2 * (0 if self._cos is None else self._cos.shape[0]))
            positions = torch.arange(size, device=self.device)[None]
            dummy = torch.empty(0, dtype=self.dtype, device=self.device)
            cos, sin = self.rotary_emb(dummy, positions)  # the model's own formula, once
            self._cos, self._sin = cos[0], sin[0]
        return self._cos[past:need, None], self._sin[past:need, None]

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def run_layers(self, hidden: torch.Tensor, start: int, end: int, cache: LayerKVCache) -> torch.Tensor:
        """Run layers [start, end) on `hidden` (1, q, hidden), appending to each layer's cache."""
        past, q_len = cache.lengths[start], hidden.shape[1]
        cos, sin = self._rotary(past, q_len)
        mask, causal = None, False
        if q_len > 1 and past == 0:
            causal = True
        elif q_len > 1:  # new tokens see the whole past and the new ones up to themselves
            rows = torch.arange(q_len, device=hidden.device)[:, None] + past
            mask = torch.arange(past + q_len, device=hidden.device)[None, :] <= rows
        for idx in range(start, end):
            if cache.lengths[idx] != past:  # the stack's invariant: one frontier per segment
                raise RuntimeError(f"layer {idx} cache holds {cache.lengths[idx]} positions, expected {past}")
            hidden = self._layer(self.layers[idx], idx, hidden, cos, sin, mask, causal, cache)
        return hidden

    def rotary_table(self, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The cos/sin tables, covering at least positions [0, size)."""
        self._rotary(0, size)
        return self._cos, self._sin

    def run_layers_static(self, hidden: torch.Tensor, start: int, end: int, kv, base: torch.Tensor) -> torch.Tensor:
        """run_layers with shapes that do not depend on the position (what a CUDA graph can replay).

        The new tokens sit at positions base + [0, q), `base` a one-element device tensor. Keys and
        values are written there with index_copy_, and attention reads each layer's whole buffer
        under a mask that hides every slot beyond a token's own position (slots never written hold
        finite values). `kv` holds the buffers (``graphs.StaticKV``); the caller advances the cache's lengths.
        """
        q_len, capacity = hidden.shape[1], kv.keys[start].shape[-2]
        positions = base + torch.arange(q_len, device=hidden.device)
        cos, sin = self._cos.index_select(0, positions)[:, None], self._sin.index_select(0, positions)[:, None]
        mask = torch.arange(capacity, device=hidden.device)[None, :] <= positions[:, None]
        for idx in range(start, end):
            hidden = self._layer(self.layers[idx], idx, hidden, cos, sin, mask, False, kv, positions)
        return hidden

    def _layer(self, w: _Layer, idx: int, hidden, cos, sin, mask, causal, cache, positions=None) -> torch.Tensor:
        q_len, D, H, K = hidden.shape[1], w.head_dim, w.n_heads, w.n_kv
        qkv = w.qkv(_rms_norm(hidden, w.input_norm)).view(1, q_len, H + 2 * K, D)
        if w.q_norm is not None:
            q = _rms_norm(qkv[:, :, :H], w.q_norm)
            k = _rms_norm(qkv[:, :, H : H + K], w.k_norm)
            q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        else:  # one rotary pass over queries and keys together
            qk = self._rotate(qkv[:, :, : H + K], cos, sin)
            q, k = qk[:, :, :H], qk[:, :, H:]
        v = qkv[:, :, H + K :]
        if positions is None:
            keys, values = cache.update(k.transpose(1, 2), v.transpose(1, 2), idx)
        else:  # static shapes: write at device positions, attend over the whole (masked) buffer
            keys, values = cache.keys[idx], cache.values[idx]
            keys.index_copy_(2, positions, k.transpose(1, 2))
            values.index_copy_(2, positions, v.transpose(1, 2))
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, is_causal=causal,
                                              scale=w.scaling, enable_gqa=H != K)
        hidden = hidden + w.o(attn.transpose(1, 2).reshape(1, q_len, H * D))
        gate, up = w.gate_up(_rms_norm(hidden, w.post_norm)).split(w.intermediate, dim=-1)
        return hidden + w.down(w.act(gate) * up)

    def logits(self, hidden: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """The final head (norm + LM head) with the prepacked LM head."""
        return self.lm_head(_rms_norm(hidden, norm))
