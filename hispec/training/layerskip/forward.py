"""The forward pass of LayerSkip-style training: the model's own (stock, LoRA-wrapped) decoder
layers with exits and per-sequence layer dropout, shared by training (train) and evaluation
(evaluation).

It deliberately runs transformers' layers, not the lean kernel (hispec.model.kernel): training needs
autograd through LoRA-wrapped projections and gradient checkpointing, which the inference kernel's
fused, prepacked weights do not have."""

from __future__ import annotations

import torch


def _parts(model):
    backbone = model.model
    return backbone.embed_tokens, list(backbone.layers), backbone.rotary_emb, backbone.norm, model.lm_head


def ensure_sdpa(model) -> None:
    """The layer loop passes no mask and relies on SDPA's own causal rule."""
    if getattr(model.config, "_attn_implementation", "sdpa") != "sdpa":
        model.set_attn_implementation("sdpa")


def run_with_exits(model, ids: torch.Tensor, exits: set[int], keep: torch.Tensor | None = None
                   ) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Hidden states after each layer in `exits` and after the last layer (raw residual stream).

    keep: [L, B] booleans; a False skips layer l for sequence b (layer dropout). None runs all.
    """
    embed, layers, rotary, _, _ = _parts(model)
    hidden = embed(ids)
    positions = torch.arange(ids.shape[1], device=ids.device)[None].expand(ids.shape[0], -1)
    position_embeddings = rotary(hidden, positions)
    saved: dict[int, torch.Tensor] = {}
    for l, layer in enumerate(layers):
        k = None if keep is None else keep[l]
        if k is None or bool(k.all()):
            out = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=position_embeddings)
            hidden = out[0] if isinstance(out, tuple) else out
        elif bool(k.any()):
            out = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=position_embeddings)
            out = out[0] if isinstance(out, tuple) else out
            hidden = torch.where(k.to(hidden.device)[:, None, None], out, hidden)
        if l + 1 in exits and l + 1 < len(layers):
            saved[l + 1] = hidden
    return saved, hidden


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    _, _, _, norm, lm_head = _parts(model)
    return lm_head(norm(hidden))
