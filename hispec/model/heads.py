"""Trained exit heads: a small module per exit layer in front of the model's own LM head.

An exit head at layer ``e`` maps the raw hidden state after ``e`` decoder layers to logits:

    z = RMSNorm_e(h)                    # its own norm weight, initialised from the final norm
    y = z + B(A(z)) + b   (low rank)    or   z + W z + b   (full rank)   # zero-initialised
    logits = lm_head(y)                 # the model's shared LM head, never changed

An *attention* head first lets each position look back at the earlier positions' states at
the same exit, through one attention block with its own KV cache (an adapter in the spirit of
Kangaroo's; initialised from the attention of the model's next layer, e + 1):

    h' = h + o(Attention(q, k, v of RMSNorm(h)))        # causal, rotary like the model's
    logits = the linear head above, on h'

Its cache grows and is cut back with the exit's layers (see StageStack): the stack runs the
attention step on every position as it reaches the exit, so `forward`/`features` take the
attended states, and `attend` is the step itself.

Untrained (W = 0, b = 0) it is exactly the raw exit (final norm + LM head). With a reduced
vocabulary the head scores only K token ids through a precomputed, contiguous slice of the LM
head weight, and returns full-vocabulary logits that are -inf outside the subset, so the
engine's token selectors (greedy and speculative sampling) work unchanged. The target model
always uses its full vocabulary, so exactness is unaffected.

Heads of one model are saved in a folder: ``heads.safetensors`` (the trainable tensors and the
vocabulary subset) and ``manifest.json`` (the base model's identity, layers, head type,
vocabulary, training settings and evaluation figures). Loading checks the identity and refuses
heads made for another model.
"""

from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from hispec.errors import ModelLoadError
from hispec.model.kernel import RotaryTable, causal_mask, self_attention
from hispec.paths import ASSETS, cache_root

FORMAT = "hispec-exit-heads"
VERSION = 1
MANIFEST = "manifest.json"
WEIGHTS = "heads.safetensors"
DEFAULT_MODEL_KEY = "smollm2-135m-instruct"
ASSETS_EXITS = ASSETS / "exits"
SAVE_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class ExitAttention(nn.Module):
    """One causal self-attention block over an exit's hidden states (float32, own KV cache).
    `source`: a decoder layer of the model whose norm and attention weights it starts from
    (Qwen3's per-head q/k norms are not copied: a starting point only, training adapts)."""

    def __init__(self, model, source: nn.Module):
        super().__init__()
        attn = source.self_attn
        self.head_dim = attn.head_dim
        self.n_heads = attn.q_proj.out_features // attn.head_dim
        self.n_kv = attn.k_proj.out_features // attn.head_dim
        self.scaling = float(attn.scaling)
        norm = source.input_layernorm
        self.eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)) or 1e-6)
        own = lambda t: nn.Parameter(t.detach().clone().float())  # noqa: E731
        self.norm_weight = own(norm.weight)
        self.qkv = own(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        self.qkv_bias = None
        if attn.q_proj.bias is not None:  # Qwen2 has q/k/v biases
            self.qkv_bias = own(torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]))
        self.o = own(attn.o_proj.weight)
        # cos/sin from the model's rotary module, float32 (a plain object: not trained, not saved)
        self.rotary = RotaryTable(model.model.rotary_emb, torch.float32)

    def forward(self, hidden: torch.Tensor, cache=None, slot: int = 0) -> torch.Tensor:
        """hidden (B, T, H) float32 -> hidden + attention. Without a cache: T positions from 0
        (training; right padding is harmless under the causal mask). With a cache (B = 1): the
        T positions that follow the `slot`'s cached ones, which are appended."""
        T = hidden.shape[1]
        past = cache.lengths[slot] if cache is not None else 0
        qkv = nn.functional.linear(_rms(hidden, self.norm_weight, self.eps), self.qkv, self.qkv_bias)
        cos, sin = self.rotary.rows(past, T, hidden.device)
        mask, causal = causal_mask(past, T, hidden.device)
        kv = (lambda k, v: cache.update(k, v, slot)) if cache is not None else (lambda k, v: (k, v))
        out = self_attention(qkv, self.n_heads, self.n_kv, cos, sin, kv, mask, causal, self.scaling)
        return hidden + nn.functional.linear(out, self.o)


class ExitHead(nn.Module):
    """Norm + residual linear map (full or low rank) + the model's LM head, optionally on a
    vocabulary subset, optionally after an attention step (`attention`, see ExitAttention).
    Residual-initialised: an untrained linear head equals the raw exit."""

    def __init__(self, final_norm: nn.Module, lm_head: nn.Module, rank: int = 0,
                 vocab_ids: torch.Tensor | None = None, attention: ExitAttention | None = None):
        super().__init__()
        self.attention = attention
        weight = final_norm.weight.detach()
        hidden = weight.shape[0]
        self.hidden_size = hidden
        self.rank = int(rank)
        self.eps = float(getattr(final_norm, "variance_epsilon", getattr(final_norm, "eps", 1e-6)) or 1e-6)
        self.norm_weight = nn.Parameter(weight.clone().float())
        if self.rank:
            self.down = nn.Parameter(torch.randn(self.rank, hidden) / math.sqrt(hidden))
            self.up = nn.Parameter(torch.zeros(hidden, self.rank))
        else:
            self.proj = nn.Parameter(torch.zeros(hidden, hidden))
        self.bias = nn.Parameter(torch.zeros(hidden))
        # The shared LM head: never a parameter of this module (never trained, never saved).
        object.__setattr__(self, "_lm_head", lm_head)
        self.vocab_size = lm_head.weight.shape[0]
        self.vocab_ids: torch.Tensor | None = None
        self._sub_weight = self._sub_bias = None
        self.set_vocab(vocab_ids)

    # ---- vocabulary ---------------------------------------------------------------------
    def set_vocab(self, vocab_ids: torch.Tensor | None, sub_weight: torch.Tensor | None = None) -> None:
        """Score only these token ids (None: the full vocabulary). `sub_weight` may pass a slice
        already made (heads of one model share it)."""
        if vocab_ids is None:
            self.vocab_ids = self._sub_weight = self._sub_bias = None
            return
        ids = torch.as_tensor(vocab_ids, dtype=torch.long).to(self._lm_head.weight.device)
        self.vocab_ids = ids
        if sub_weight is None:
            matrix = getattr(self._lm_head, "matrix", None)  # a 4-bit LM head (model/formats/q4.py): its own rows, 4-bit
            sub_weight = matrix.take_rows(ids) if matrix is not None else self._lm_head.weight.detach()[ids].contiguous()
        self._sub_weight = sub_weight
        bias = getattr(self._lm_head, "bias", None)
        self._sub_bias = None if bias is None else bias.detach()[ids].contiguous()

    # ---- forward ------------------------------------------------------------------------
    @property
    def stateful(self) -> bool:
        """True for attention heads: each position's attention step needs the earlier ones."""
        return self.attention is not None

    def attend(self, hidden: torch.Tensor, cache=None, slot: int = 0) -> torch.Tensor:
        """The attention step (identity for a linear head): exit states -> the head's input."""
        x = hidden.to(self.norm_weight.device, torch.float32)  # the head is tiny: float32 always
        return x if self.attention is None else self.attention(x, cache, slot)

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head's input: norm, then the residual map (after `attend`, for attention heads)."""
        x = hidden.to(self.norm_weight.device, torch.float32)
        z = _rms(x, self.norm_weight, self.eps)
        delta = (z @ self.down.T) @ self.up.T if self.rank else z @ self.proj.T
        return z + delta + self.bias

    def subset_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over `vocab_ids` only (K columns, in the order of vocab_ids)."""
        if not isinstance(self._sub_weight, torch.Tensor):  # the file's 4-bit rows: the 4-bit kernel's product
            out = self._sub_weight.matmul(self.features(hidden).contiguous())
            return out if self._sub_bias is None else out + self._sub_bias
        y = self.features(hidden).to(self._sub_weight.dtype)
        return nn.functional.linear(y, self._sub_weight, self._sub_bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.vocab_ids is None:
            y = self.features(hidden).to(self._lm_head.weight.dtype)
            return self._lm_head(y)
        sub = self.subset_logits(hidden)
        out = sub.new_full(sub.shape[:-1] + (self.vocab_size,), -math.inf)
        return out.index_copy_(-1, self.vocab_ids, sub)

    def describe(self) -> str:
        kind = f"rank-{self.rank} linear" if self.rank else "full linear"
        vocab = f"{len(self.vocab_ids)} tokens" if self.vocab_ids is not None else "full vocabulary"
        attention = "attention (own KV cache) + " if self.attention is not None else ""
        return f"{attention}norm + {kind} residual map, {vocab}"


HEAD_TYPES = ("linear", "attention")


def make_heads(ee, layers, rank: int = 0, vocab_ids: torch.Tensor | None = None,
               head_type: str = "linear") -> dict[int, ExitHead]:
    """Fresh heads for `layers` of an EarlyExitModel, sharing one vocabulary slice. Linear heads
    start as the raw exit; attention heads start from the attention of layer e + 1."""
    if head_type not in HEAD_TYPES:
        raise ValueError(f"unknown exit head type '{head_type}'; choose {', '.join(HEAD_TYPES)}")
    norm, lm_head = ee.final_head.norm, ee.final_head.lm_head
    heads = {}
    shared = None
    for layer in layers:
        attention = ExitAttention(ee.model, ee.layers[layer]) if head_type == "attention" else None
        if attention is not None:
            attention.to(lm_head.weight.device)
        head = ExitHead(norm, lm_head, rank=rank, attention=attention)
        if vocab_ids is not None:
            head.set_vocab(vocab_ids, shared)
            shared = head._sub_weight
        heads[int(layer)] = head
    return heads


# ---- model identity ------------------------------------------------------------------------
def _sample(tensor: torch.Tensor, n: int = 8) -> list[float]:
    flat = tensor.detach().reshape(-1)
    step = max(1, flat.numel() // n)
    return [round(float(v), 6) for v in flat[::step][:n].float().cpu()]


def model_identity(model, name: str = "") -> dict:
    """What heads are made for: sizes plus a fingerprint of a few weights (dtype-tolerant)."""
    config = model.config
    backbone = model.model
    fingerprint = {
        "embed_tokens": _sample(backbone.embed_tokens.weight[1]),
        "layer0.q_proj": _sample(backbone.layers[0].self_attn.q_proj.weight[0]),
        "last_layer.down_proj": _sample(backbone.layers[-1].mlp.down_proj.weight[-1]),
        "norm": _sample(backbone.norm.weight),
        "lm_head": _sample(model.lm_head.weight[-1]),
    }
    return {"name": name, "model_type": getattr(config, "model_type", "?"),
            "num_layers": int(config.num_hidden_layers), "hidden_size": int(config.hidden_size),
            "vocab_size": int(model.lm_head.weight.shape[0]), "fingerprint": fingerprint}


def check_identity(saved: dict, model, where: str) -> None:
    """Raise ModelLoadError when heads saved for `saved` do not fit `model`."""
    mine = model_identity(model)
    made_for = f"'{saved.get('name') or '?'}' ({saved.get('model_type', '?')}, {saved.get('num_layers')} layers, " \
               f"hidden {saved.get('hidden_size')}, vocab {saved.get('vocab_size')})"
    this = (f"this model ({mine['model_type']}, {mine['num_layers']} layers, hidden {mine['hidden_size']}, "
            f"vocab {mine['vocab_size']})")
    for key in ("model_type", "num_layers", "hidden_size", "vocab_size"):
        if saved.get(key) != mine[key]:
            raise ModelLoadError(f"the exit heads in {where} were made for another model, {made_for}, not for "
                                 f"{this}: {key} differs. Train heads for this model with 'python -m hispec "
                                 f"train-exits', or load without them (--exits none)")
    for key, values in (saved.get("fingerprint") or {}).items():
        ours = torch.tensor(mine["fingerprint"].get(key, []), dtype=torch.float32)
        theirs = torch.tensor(values, dtype=torch.float32)
        if ours.shape != theirs.shape or not torch.allclose(ours, theirs, rtol=2e-2, atol=2e-3):
            raise ModelLoadError(f"the exit heads in {where} were made for another model, {made_for}: same shape as "
                                 f"{this} but different weights ({key}). Train heads for this model with "
                                 f"'python -m hispec train-exits', or load without them (--exits none)")


# ---- save / load -----------------------------------------------------------------------------
def save_heads(folder, heads: dict[int, ExitHead], manifest: dict, dtype: str = "float16") -> Path:
    """Write heads.safetensors and manifest.json into `folder` (created if needed)."""
    from safetensors.torch import save_file

    if dtype not in SAVE_DTYPES:
        raise ValueError(f"unknown save dtype '{dtype}'; choose {', '.join(SAVE_DTYPES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {}
    vocab = None
    for layer, head in sorted(heads.items()):
        for pname, param in head.named_parameters():
            tensors[f"layer{layer}.{pname}"] = param.detach().to("cpu", SAVE_DTYPES[dtype]).contiguous()
        if head.vocab_ids is not None:
            vocab = head.vocab_ids
    if vocab is not None:
        tensors["vocab_ids"] = vocab.detach().to("cpu", torch.int32).contiguous()
    first = next(iter(heads.values()))
    vocab_info = dict(manifest.get("vocab") or {})
    vocab_info["size"] = None if vocab is None else int(len(vocab))
    head_info = dict(manifest.get("head") or {}, type="attention" if first.stateful else "linear",
                     rank=first.rank, dtype=dtype,
                     description=first.describe())
    manifest = dict(manifest, format=FORMAT, version=VERSION, layers=sorted(int(k) for k in heads),
                    head=head_info, vocab=vocab_info)
    save_file(tensors, str(folder / WEIGHTS))
    (folder / WEIGHTS).chmod(0o644)  # shipped assets: readable by everyone
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return folder


def read_manifest(folder) -> dict:
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise ModelLoadError(f"no exit heads in {folder}: {MANIFEST} is missing (make them with "
                             f"'python -m hispec train-exits')")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{path} is not a readable exit-head manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ModelLoadError(f"{path} is not a HiSpec exit-head manifest (format '{FORMAT}' expected)")
    if manifest.get("version") != VERSION:
        raise ModelLoadError(f"{path} has exit-head format version {manifest.get('version')}; "
                             f"this HiSpec reads version {VERSION}")
    return manifest


def load_heads(folder, ee) -> tuple[dict[int, ExitHead], dict]:
    """Heads saved in `folder`, checked against the EarlyExitModel's model, on its device and dtype."""
    from safetensors.torch import load_file

    folder = Path(folder)
    manifest = read_manifest(folder)
    check_identity(manifest.get("model") or {}, ee.model, str(folder))
    try:
        tensors = load_file(str(folder / WEIGHTS))
    except Exception as exc:  # missing or corrupt file
        raise ModelLoadError(f"cannot read {folder / WEIGHTS}: {exc}") from None
    layers = [int(x) for x in manifest.get("layers", [])]
    for layer in layers:
        if not 0 < layer < ee.num_layers:
            raise ModelLoadError(f"{folder}: exit layer {layer} is impossible for a {ee.num_layers}-layer model")
    vocab = tensors.get("vocab_ids")
    vocab = None if vocab is None else vocab.long()
    head_type = (manifest.get("head") or {}).get("type", "linear")
    if head_type not in HEAD_TYPES:
        raise ModelLoadError(f"{folder}: unknown exit head type '{head_type}' (this HiSpec reads "
                             f"{', '.join(HEAD_TYPES)})")
    heads = make_heads(ee, layers, rank=int(manifest["head"].get("rank") or 0), vocab_ids=vocab,
                       head_type=head_type)
    for layer, head in heads.items():
        state = {name[len(f"layer{layer}."):]: t for name, t in tensors.items() if name.startswith(f"layer{layer}.")}
        try:
            head.load_state_dict({k: v.float() for k, v in state.items()})
        except RuntimeError as exc:
            raise ModelLoadError(f"{folder}: the weights of the layer-{layer} head do not fit: {exc}") from None
        # Next to the LM head (with a device map the last layers may live elsewhere).
        head.to(device=ee.final_head.lm_head.weight.device).eval().requires_grad_(False)
    return heads, manifest


def attach(ee, heads: dict[int, ExitHead], manifest: dict | None) -> None:
    """Make the EarlyExitModel use these heads (replacing any attached before)."""
    if hasattr(ee, "attach_exit_heads"):
        ee.attach_exit_heads(heads, manifest)
    else:  # pragma: no cover - older EarlyExitModel
        ee.exit_heads = dict(heads)
        ee.exit_info = manifest


# ---- where heads are found -----------------------------------------------------------------------
def model_key(name: str, source: str | None = None) -> str:
    """A folder name for a model's heads: the default model, a hub id, or a local folder."""
    if name == "default":
        return DEFAULT_MODEL_KEY
    path = Path(source or name).expanduser()
    if path.is_dir():
        import hashlib

        digest = hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:8]
        return "dir--" + re.sub(r"[^A-Za-z0-9._-]+", "-", path.resolve().name) + "-" + digest
    return "hf--" + re.sub(r"[^A-Za-z0-9._-]+", "--", name)


def user_exits_folder(name: str, source: str | None = None) -> Path:
    """Where `train-exits` saves heads by default (and the engine looks first)."""

    return cache_root() / "exits" / model_key(name, source)


def candidate_folders(name: str, source: str | None = None) -> list[Path]:
    """Where heads for a model are looked for, first match wins: the user's cache (heads
    trained with train-exits), then the heads shipped in assets/exits/."""
    return [user_exits_folder(name, source), ASSETS_EXITS / model_key(name, source)]


def find_and_attach(ee, name: str, source: str | None = None, exits: str | None = None,
                    progress: Callable[[str], None] | None = None) -> dict | None:
    """Attach exit heads to a freshly loaded model. `exits`: None = look in the usual places,
    'none' = raw exits, else a folder holding manifest.json. Returns the manifest (or None)."""
    if exits is not None and str(exits).strip().lower() in ("none", "raw", "off"):
        return None
    if exits is not None:
        folder = Path(exits).expanduser()
        if not (folder / MANIFEST).is_file():
            raise ModelLoadError(f"--exits {exits}: no exit heads there ({MANIFEST} is missing); give a folder made "
                                 f"by 'python -m hispec train-exits', or 'none' for the raw exits")
    else:
        folder = next((f for f in candidate_folders(name, source) if (f / MANIFEST).is_file()), None)
        if folder is None:
            return None
    t0 = time.perf_counter()
    heads, manifest = load_heads(folder, ee)
    manifest = dict(manifest, path=str(folder))
    attach(ee, heads, manifest)
    if progress:
        progress(f"Trained exit heads at layers {', '.join(map(str, sorted(heads)))} from {folder} "
                 f"({time.perf_counter() - t0:.1f} s)")
    return manifest


def preferred_layers(ee) -> tuple[int, int] | None:
    """The (draft, verify) exits recommended by the attached heads' manifest, if any."""
    info = getattr(ee, "exit_info", None) or {}
    pair = info.get("default_layers") or {}
    d, v = pair.get("draft"), pair.get("verify")
    if isinstance(d, int) and isinstance(v, int) and 0 < d < v < ee.num_layers:
        return d, v
    return None
