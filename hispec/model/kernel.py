"""The one decoder-layer kernel: a Llama-family layer's arithmetic on (batch, tokens, hidden).

Written once, used by every fast path:

- the engine's lean path (``lean.LeanPath``: batch 1, the engine's KV cache, or static buffers
  that a CUDA graph replays);
- batched teacher generation for training data (``training.heads.teacher``: left-padded rows);
- the attention step of attention exit heads (``heads.ExitAttention``: ``self_attention``
  only, on the head's own float32 weights).

Each caller says where keys and values go through ``kv(k, v) -> (keys, values)``: append to a cache,
write at device positions, or into a batch buffer; the kernel attends over what it returns.

The operations and their order are the model's own (transformers' Llama/Qwen layers): RMSNorm in
float32 then cast, rotary embedding, scaled-dot-product attention, SiLU-gated MLP. q/k/v and
gate/up run as one fused product each; on CPU the products can be prepacked for oneDNN, which
gives each row the same bits whatever the number of rows.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

# Packed weights are a second copy of the model's projections; skip packing above this size.
PACK_LIMIT_BYTES = int(os.environ.get("HISPEC_PACK_LIMIT_MB", "4096")) * 2**20

KVWriter = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def can_pack() -> bool:
    """Whether oneDNN weight prepacking is available (CPU builds of torch)."""
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


def fused(linears: list[nn.Linear], pack: bool) -> Projection:
    """One projection computing several linears at once (outputs concatenated).

    Unpacked (GPU, large models), the modules' own weights become views into the fused tensor,
    so fusing costs no memory and transformers' stock layers keep working on the same storage.
    Linears on a file's 4-bit blocks (``q4.Q4Linear``) fuse their own way: their blocks, stacked.
    """
    if hasattr(linears[0], "fuse"):
        return linears[0].fuse(linears)
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


def _share(linears: list[nn.Linear], fused_tensor: torch.Tensor, name: str) -> None:
    start = 0
    for m in linears:
        param = getattr(m, name)
        param.data = fused_tensor[start : start + param.shape[0]]
        start += param.shape[0]


def rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """The model's RMSNorm: normalise in float32, cast back, then scale (transformers' order)."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)
    y = x.float()
    y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)
    return norm.weight * y.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of x (..., head_dim) with the cos/sin rows of its positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RotaryTable:
    """cos/sin rows of every position up to a size, from the model's own rotary module, built once
    (doubling when a longer position is asked for). Built outside inference mode, so that training
    (exit heads) can use the rows too."""

    def __init__(self, rotary_emb: nn.Module, dtype: torch.dtype):
        self.rotary_emb, self.dtype = rotary_emb, dtype
        self.cos = self.sin = None

    def ensure(self, size: int, device) -> None:
        device = torch.device(device)
        if (self.cos is not None and self.cos.shape[0] >= size and self.cos.device.type == device.type
                and device.index in (None, self.cos.device.index)):
            return
        size = max(256, size, 0 if self.cos is None else 2 * self.cos.shape[0])
        positions = torch.arange(size, device=device)[None]
        with torch.inference_mode(False), torch.no_grad():
            cos, sin = self.rotary_emb(torch.empty(0, dtype=self.dtype, device=device), positions)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)

    def rows(self, past: int, q_len: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows for positions [past, past + q_len), shaped (q_len, 1, head_dim)."""
        self.ensure(past + q_len, device)
        return self.cos[past : past + q_len, None], self.sin[past : past + q_len, None]


def causal_mask(past: int, q_len: int, device) -> tuple[torch.Tensor | None, bool]:
    """(mask, is_causal) for q_len new tokens after `past` cached ones: new tokens see the whole past
    and the new ones up to themselves. One token needs no mask; a first pass uses SDPA's own rule."""
    if q_len == 1:
        return None, False
    if past == 0:
        return None, True
    rows = torch.arange(q_len, device=device)[:, None] + past
    return torch.arange(past + q_len, device=device)[None, :] <= rows, False


class LayerWeights:
    """One decoder layer's weights in the shapes the kernel uses (fused, optionally prepacked)."""

    def __init__(self, layer: nn.Module, pack: bool, fuse: Callable[[list[nn.Module], bool], Projection] = None):
        """`fuse`: how linears become one projection (default ``fused``; a float32 model on its file's
        blocks passes ``q4.wide_fuse``)."""
        fuse = fuse or fused
        attn, mlp = layer.self_attn, layer.mlp
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv = fuse([attn.q_proj, attn.k_proj, attn.v_proj], pack)
        self.o = fuse([attn.o_proj], pack)
        self.gate_up = fuse([mlp.gate_proj, mlp.up_proj], pack)
        self.down = fuse([mlp.down_proj], pack)
        self.act = mlp.act_fn
        self.q_norm = getattr(attn, "q_norm", None)  # Qwen3: RMSNorm over each head's features
        self.k_norm = getattr(attn, "k_norm", None)
        self.scaling = attn.scaling
        self.head_dim = attn.head_dim
        self.n_heads = attn.q_proj.out_features // attn.head_dim
        self.n_kv = attn.k_proj.out_features // attn.head_dim
        self.intermediate = mlp.gate_proj.out_features


def self_attention(qkv: torch.Tensor, n_heads: int, n_kv: int, cos, sin, kv: KVWriter, mask, causal: bool,
                   scaling: float, q_norm: nn.Module | None = None, k_norm: nn.Module | None = None) -> torch.Tensor:
    """Attention from the fused q/k/v product (B, q, (H + 2K) * D) to (B, q, H * D), before o_proj."""
    B, q_len = qkv.shape[:2]
    H, K = n_heads, n_kv
    qkv = qkv.view(B, q_len, H + 2 * K, -1)
    if q_norm is not None:
        q = rotate(rms_norm(qkv[:, :, :H], q_norm), cos, sin)
        k = rotate(rms_norm(qkv[:, :, H : H + K], k_norm), cos, sin)
    else:  # one rotary pass over queries and keys together (elementwise: the same bits)
        qk = rotate(qkv[:, :, : H + K], cos, sin)
        q, k = qk[:, :, :H], qk[:, :, H:]
    keys, values = kv(k.transpose(1, 2), qkv[:, :, H + K :].transpose(1, 2))
    out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, is_causal=causal,
                                         scale=scaling, enable_gqa=H != K)
    return out.transpose(1, 2).reshape(B, q_len, -1)


def decoder_layer(w: LayerWeights, hidden: torch.Tensor, cos, sin, kv: KVWriter, mask=None,
                  causal: bool = False) -> torch.Tensor:
    """One decoder layer over hidden (B, q, hidden); keys/values go where `kv` puts them."""
    attn = self_attention(w.qkv(rms_norm(hidden, w.input_norm)), w.n_heads, w.n_kv, cos, sin, kv, mask, causal,
                          w.scaling, w.q_norm, w.k_norm)
    hidden = hidden + w.o(attn)
    gate, up = w.gate_up(rms_norm(hidden, w.post_norm)).split(w.intermediate, dim=-1)
    return hidden + w.down(w.act(gate) * up)
