"""Run any layer range of a decoder-only transformers model on hidden states.

``EarlyExitModel`` wraps a loaded causal LM without changing it: it reuses the model's own
embedding, decoder layers, rotary embedding, final norm and LM head, so every method that runs
on it shares the target model's exact arithmetic. An *exit* at layer ``e`` means: hidden state
after ``e`` layers -> exit head -> logits. The default exit head is the final norm + LM head
(what LayerSkip-trained models are built for); trained heads can be attached per layer.
"""

from __future__ import annotations

import inspect
import os
from typing import Callable

import torch
from torch import nn

from hispec.model.cache import LayerKVCache
from hispec.errors import ConfigError, ModelLoadError
from hispec.model.lean import LeanPath
from hispec.model.shared import BOARD

# Architectures whose decoder layers follow the Llama layout (pre-norm, rotary, KV cache
# updated through ``cache.update``) and which the engine has been tested on.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
ON_FLOAT_WEIGHTS = "its products run on its float weights"  # f32_route_reason off the blocks


class FinalHead(nn.Module):
    """The model's own final norm followed by its LM head."""

    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm, self.lm_head = norm, lm_head
        self.lean: LeanPath | None = None  # set when the engine runs the lean path

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lean is not None:
            if BOARD.is_member:  # a shared pass's rows: one product over every member's rows (shared.py)
                return BOARD.run(("head", id(self.lean)), hidden, self._logits_many,
                                 hidden.numel() // hidden.shape[-1], lane_pass=False)
            return self.lean.logits(hidden, self.norm)
        return self.lm_head(self.norm(hidden))

    def _logits_many(self, items: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(items) == 1:
            return [self.lean.logits(items[0], self.norm)]
        rows = torch.cat([h.reshape(-1, h.shape[-1]) for h in items])
        out = self.lean.logits(rows, self.norm)
        sizes = [h.numel() // h.shape[-1] for h in items]
        return [part.reshape(*h.shape[:-1], -1) for h, part in zip(items, out.split(sizes))]


class EarlyExitModel:
    """A causal LM seen as a stack of layers with an exit head at any depth."""

    def __init__(self, model: nn.Module, lean: bool | None = None):
        config = model.config
        model_type = getattr(config, "model_type", "?")
        if model_type not in SUPPORTED_ARCHITECTURES:
            raise ModelLoadError(
                f"architecture '{model_type}' is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        if getattr(config, "_attn_implementation", "sdpa") not in ("sdpa", "eager"):
            model.set_attn_implementation("sdpa")
        self.model = model.eval()
        self.config = config
        backbone = model.model
        self.embed_tokens = backbone.embed_tokens
        self.layers = list(backbone.layers)
        self.rotary_emb = backbone.rotary_emb
        self.num_layers = len(self.layers)
        self.final_head = FinalHead(backbone.norm, model.lm_head)
        # Trained exit heads by layer; layers without one use the final head.
        self.exit_heads: dict[int, nn.Module] = {}
        self.context_limit = self._context_limit(config)
        params = inspect.signature(self.layers[0].forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._eager = config._attn_implementation == "eager"
        # the file's blocks this float32 model's weights were dequantised from (use_blocks): by module id
        self.blocks: dict | None = None
        self.block_matrices: dict | None = None
        self.f32_route_reason: str | None = ON_FLOAT_WEIGHTS  # why its products are not on blocks (None: they are)
        # The lean path (hispec/model/lean.py) runs layer ranges; the stock path calls transformers'
        # layers. lean=None: lean unless HISPEC_LEAN=0 or the model needs the stock path.
        self.lean: LeanPath | None = None
        self.graphs = None  # hispec/graphs.LayerGraphs once set_graphs() turns CUDA graphs on
        self.stock_reason = LeanPath.support(model)
        if lean is None:
            lean = os.environ.get("HISPEC_LEAN", "1") != "0"
        if lean and self.stock_reason is None:
            self.set_lean(True)

    def set_lean(self, on: bool) -> None:
        """Switch between the lean path and transformers' stock layers (same cache, same results)."""
        if on and self.stock_reason is not None:
            raise ConfigError(f"the lean path cannot run this model: {self.stock_reason}")
        self.lean = LeanPath(self) if on else None
        self.final_head.lean = self.lean
        self.graphs = None  # captured on the old path's weights

    def use_blocks(self, matrices: dict | None) -> None:
        """Run this float32 model's products on the file's blocks its weights were dequantised from
        (`matrices` by transformers name, ``q4.read_gguf``; checked against the weights by ``q4.blocks_of``),
        widened in registers to the same float32 values; None goes back to the float weights. The lean
        path is rebuilt (the stock path and transformers' ``generate()`` keep the float weights)."""
        from hispec.model.formats.q4 import blocks_of

        self.blocks = None if matrices is None else blocks_of(self.model, matrices)
        self.block_matrices = matrices
        self.f32_route_reason = None if matrices is not None else ON_FLOAT_WEIGHTS
        if self.lean is not None:
            self.set_lean(True)

    def set_graphs(self, backend: str | None = "cuda", max_tokens: int = 16) -> None:
        """Replay layer passes of up to `max_tokens` new tokens from CUDA graphs (None: off).

        "emulate" runs the same static-shape passes without CUDA (tests). Needs the lean path.
        """
        from hispec.model.graphs import LayerGraphs

        self.graphs = None if backend is None else LayerGraphs(self, backend, max_tokens)

    @staticmethod
    def _context_limit(config) -> int:
        limit = int(getattr(config, "max_position_embeddings", 2048))
        # Full causal masks only: cap sliding-window models at their window.
        window = getattr(config, "sliding_window", None)
        layer_types = getattr(config, "layer_types", None) or []
        if window and (config.model_type == "mistral" or "sliding_attention" in layer_types):
            limit = min(limit, int(window))
        return limit

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def new_cache(self, capacity: int = 256) -> LayerKVCache:
        """A cache for one sequence; with graphs on, on the graphs' static buffers when they are free."""
        if self.graphs is not None:
            cache = self.graphs.new_cache(capacity)
            if cache is not None:
                return cache
        return LayerKVCache(self.num_layers, capacity)

    @staticmethod
    def new_head_cache(slots: int, capacity: int = 256) -> LayerKVCache:
        """A plain cache with `slots` independent slots, for attention exit heads (slot = the caller's
        index of the exit); never on the graphs' static buffers."""
        return LayerKVCache(slots, capacity)

    def embed(self, token_ids: list[int]) -> torch.Tensor:
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        return self.embed_tokens(ids)

    def _mask(self, q_len: int, past: int, device) -> torch.Tensor | None:
        """Causal mask for q_len new tokens after `past` cached ones.

        None where the attention kernel's own rule is right: a single new token sees
        everything, and a fresh prefill is plain causal (what transformers itself does).
        """
        if q_len == 1 or (past == 0 and not self._eager):
            return None
        rows = torch.arange(q_len, device=device)[:, None] + past
        allowed = torch.arange(past + q_len, device=device)[None, :] <= rows
        if not self._eager:
            return allowed[None, None]
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=device)
        return mask.masked_fill(~allowed, torch.finfo(self.dtype).min)[None, None]

    def last_pass_beside(self) -> tuple[int, int]:
        """Other visitors' passes and rows in the call that carried this thread's last pass (the stage stack's)."""
        return BOARD.last_beside() if BOARD.is_member else (0, 0)

    def sharing_with(self) -> int:
        """How many other visitors' generations share this thread's passes of this model now (model.shared's
        board); 0 outside the board, and where its passes run alone (no native route)."""
        return BOARD.others() if self.lean is not None and self.lean.native is not None else 0

    @torch.inference_mode()
    def run_layers(self, hidden: torch.Tensor, start: int, end: int, cache: LayerKVCache) -> torch.Tensor:
        """Run layers [start, end) on `hidden` (new positions following each layer's cache)."""
        if start >= end:
            return hidden
        if self.graphs is not None:
            out = self.graphs.run(hidden, start, end, cache)
            if out is not None:
                return out
        if self.lean is not None:
            native = self.lean.native
            if native is not None and BOARD.is_member:  # several generations' rows in one call (shared.py)
                return BOARD.run(("layers", id(native), start, end), (hidden, cache),
                                 lambda parts: native.run_shared(parts, start, end), hidden.shape[1])
            return self.lean.run_layers(hidden, start, end, cache)
        past = cache.lengths[start]
        q_len = hidden.shape[1]
        positions = torch.arange(past, past + q_len, device=hidden.device)[None]
        position_embeddings = self.rotary_emb(hidden, positions)
        mask = self._mask(q_len, past, hidden.device)
        for layer_idx in range(start, end):
            if cache.lengths[layer_idx] != past:  # the stack's invariant: one frontier per segment
                raise RuntimeError(f"layer {layer_idx} cache holds {cache.lengths[layer_idx]} positions, expected {past}")
            out = self.layers[layer_idx](
                hidden,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                position_embeddings=position_embeddings,
                **{self._cache_kw: cache},
            )
            hidden = out[0] if isinstance(out, tuple) else out
        return hidden

    def head(self, layer: int) -> nn.Module:
        """Exit head at `layer` (number of decoder layers run); the final head at full depth."""
        if layer == self.num_layers:
            return self.final_head
        return self.exit_heads.get(layer, self.final_head)

    @torch.inference_mode()
    def exit_logits(self, hidden: torch.Tensor, layer: int) -> torch.Tensor:
        return self.head(layer)(hidden).float()

    def check_layers(self, *layers: int) -> None:
        for layer in layers:
            if not 0 < layer < self.num_layers:
                raise ConfigError(
                    f"exit layer {layer} is impossible: this model has {self.num_layers} layers, "
                    f"so an early exit must be between 1 and {self.num_layers - 1}"
                )

    # Trained exit heads (hispec/model/heads.py): the manifest of the heads attached, if any.
    exit_info: dict | None = None

    # ---- the same weights in cheaper number formats (levels of a precision: engine.levels) ----------
    def add_format(self, name: str, build: Callable[[], EarlyExitModel], why_not: str | None = None) -> None:
        """Offer a copy of this model in another number format, built on first use by `build()`
        (hispec/model/loading.py offers the default model's own 4-bit blocks as 'q4'); `why_not`: the
        reason it cannot be offered here instead (then `in_format` refuses with it)."""
        self._formats = {**getattr(self, "_formats", {}), name: (build, why_not)}

    @property
    def arithmetic(self) -> str | None:
        """This model's own 4-bit arithmetic: 'a8' (the GGUF's blocks with int8 activations: the native
        route's act8 mode), 'q4' (the blocks over float32 activations), None for float weights."""
        if getattr(self.model, "hispec_weights", "fp32") != "q4":
            return None
        native = getattr(self.lean, "native", None) if self.lean is not None else None
        return "a8" if getattr(native, "act8", False) else "q4"

    def formats(self) -> tuple[str, ...]:
        """The number formats this model can run its levels in, besides its own."""
        return tuple(k for k, (_, why) in getattr(self, "_formats", {}).items() if why is None)

    def in_format(self, name: str) -> EarlyExitModel:
        """This model's copy in format `name` (built once, then kept), with the same exit heads."""
        twins = self.__dict__.setdefault("_twins", {})
        if name in twins:
            return twins[name]
        build, why_not = getattr(self, "_formats", {}).get(name, (None, None))
        if build is None or why_not is not None:
            reason = why_not or (f"formats offered: {', '.join(self.formats())}" if self.formats()
                                 else "it offers no other format")
            raise ConfigError(f"this model cannot run a level in {name}: {reason}")
        twin = build()
        if twin.num_layers != self.num_layers or twin.config.vocab_size != self.config.vocab_size:
            raise ModelLoadError(f"the {name} copy has another shape than the model ({twin.num_layers} layers)")
        twin.attach_exit_heads(self.exit_heads, self.exit_info)
        twins[name] = twin
        return twin

    def attach_exit_heads(self, heads: dict[int, nn.Module], info: dict | None = None) -> None:
        """Use these trained exit heads by layer (replacing any attached before); `info` describes them."""
        self.check_layers(*heads)
        self.exit_heads = dict(heads)
        self.exit_info = info
