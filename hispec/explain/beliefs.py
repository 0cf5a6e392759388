"""What each exit believes: for a finished generation, every exit's top predictions at every
generated position, from one pass of the model over the whole sequence.

The hidden state at the position just before generated token i (the one that predicted it) is
read at every exit depth and put through that exit's heads:

- ``raw``: the model's own final norm + LM head applied at that depth (what a LayerSkip-style
  model is built for, and what an exit without a trained head uses);
- ``trained``: the trained exit head attached at that depth, if any. An attention head runs its
  attention step over the whole sequence (prompt included) from position 0 with its own KV cache,
  as the engine does while generating; a reduced-vocabulary head scores only its subset (its
  logits are -inf elsewhere, so other tokens never appear among its candidates);
- ``format``: the full model in a cheaper number format of the same weights (the run's 4-bit level, e.g.
  'the 4-bit, int8-activation full model'), over its own copy of the model, when the run had one;
- ``full``: the full model, the reference every row is compared with.

The result is a plain, JSON-ready dict (see ``exit_beliefs``); the UI draws it as a layer x token
grid. Nothing here decides anything for the engine: it only looks.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from hispec.engine.levels import level_words
from hispec.model.cache import LayerKVCache
from hispec.errors import ConfigError
from hispec.text import Detokenizer

if TYPE_CHECKING:
    from hispec.model.early_exit import EarlyExitModel

_CHUNK = 128  # positions per logits batch: bounds memory at chunk x vocabulary floats


def default_layers(ee: EarlyExitModel) -> list[int]:
    """The exits shown when none are asked for: those with a trained head, else about every
    quarter of the depth (the full model is always added)."""
    if ee.exit_heads:
        return sorted(int(layer) for layer in ee.exit_heads)
    n = ee.num_layers
    return sorted({max(1, round(n * k / 4)) for k in (1, 2, 3)} - {n} - {0})


def _rows(ee: EarlyExitModel, layers: list[int]) -> list[dict]:
    rows = []
    for layer in layers:
        rows.append({"layer": layer, "kind": "raw", "label": f"exit {layer} · raw"})
        if layer in ee.exit_heads:
            head = ee.exit_heads[layer]
            row = {"layer": layer, "kind": "trained", "label": f"exit {layer} · trained"}
            describe = getattr(head, "describe", None)
            if callable(describe):
                row["head"] = describe()
            if getattr(head, "stateful", False):
                row["note"] = ("attention head: its attention step ran over the whole sequence from position 0, "
                               "as while generating")
            rows.append(row)
    rows.append({"layer": ee.num_layers, "kind": "full", "label": f"full model ({ee.num_layers} layers)"})
    return rows


def _check(ee: EarlyExitModel, prompt_ids, token_ids, layers, top) -> list[int]:
    if not token_ids:
        raise ConfigError("no generated tokens to explain: token_ids is empty (generate something first)")
    if not prompt_ids:
        raise ConfigError("the prompt is empty: the first generated token needs at least one token before it "
                          "(the hidden state that predicted it)")
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ConfigError(f"top must be a whole number of candidates, at least 1 (got {top!r})")
    vocab = ee.embed_tokens.weight.shape[0]
    for name, ids in (("prompt_ids", prompt_ids), ("token_ids", token_ids)):
        bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab]
        if bad:
            raise ConfigError(f"{name} holds {bad[0]!r}, not a token id of this model (0 to {vocab - 1})")
    length = len(prompt_ids) + len(token_ids) - 1
    if length > ee.context_limit:
        raise ConfigError(f"prompt and generated tokens make {length} positions, more than this model's context "
                          f"of {ee.context_limit}")
    if layers is None:
        return default_layers(ee)
    layers = list(layers)
    for layer in layers:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise ConfigError(f"exit layer {layer!r} is not a whole number")
    ee.check_layers(*layers)  # 1 .. L-1 (the full model is always shown): ConfigError otherwise
    return sorted(set(layers))


def _boundary_states(ee: EarlyExitModel, ids: list[int], depths: list[int]) -> dict[int, torch.Tensor]:
    """Hidden states (1, T, H) of the sequence after each of `depths` layers, in one pass."""
    cache = ee.new_cache(capacity=len(ids))
    states = {}
    try:
        hidden = ee.embed(ids)
        start = 0
        for depth in depths:
            hidden = ee.run_layers(hidden, start, depth, cache)
            states[depth] = hidden
            start = depth
    finally:
        release = getattr(cache, "release", None)
        if callable(release):
            release()  # lent static buffers (CUDA graphs) go back
    return states


def _logits_fn(ee: EarlyExitModel, row: dict, hidden: torch.Tensor):
    """A function of a position slice returning float32 logits (n, V) of this row's head."""
    layer, kind = row["layer"], row["kind"]
    if kind != "trained":
        return lambda sl: ee.final_head(hidden[0, sl][None])[0].float()
    head = ee.exit_heads[layer]
    if getattr(head, "stateful", False):
        # The attention step over every position, each seeing the earlier ones (what the engine's
        # head cache holds by the end of a generation); then the head on the attended states.
        attended = head.attend(hidden, LayerKVCache(1, hidden.shape[1]), 0)
        return lambda sl: ee.exit_logits(attended[0, sl][None], layer)[0]
    return lambda sl: ee.exit_logits(hidden[0, sl][None], layer)[0]


@torch.inference_mode()
def exit_beliefs(ee: EarlyExitModel, prompt_ids: list[int], token_ids: list[int], layers: list[int] | None = None,
                 top: int = 3, tokenizer=None, formats: tuple[str, ...] = ()) -> dict:
    """What every exit predicted at every generated position of `token_ids` (after `prompt_ids`).

    `layers`: the early exits to show (each 1 .. L-1); None: every layer with a trained head, or
    about every quarter of the depth without any. The full model is always the last row. An exit
    with a trained head gets two rows, raw then trained; `formats`: cheaper formats of the model (its
    `formats()`) whose full model gets a row of its own, before the full model's. Runs the model once over
    the sequence, and each format's copy once.

    Returns::

        {"num_layers": L, "top": top,
         "layers": [{"layer": 4, "kind": "raw" | "trained" | "format" | "full", "label": "exit 4 · raw",
                     ("head": description, "note": ... for trained heads)}, ...],
         "tokens": [{"index": i, "token_id": t, "text": "...",
                     "cells": [{"top": [[id, text, prob], ...], "match": bool, "p": prob of t}, ...],
                     "certain_at": layer | None, "certain_row": row index | None,
                     "certain_label": label | None}, ...]}

    `cells` has one entry per row of `layers`, in that order; `top` lists are sorted by probability
    (softmax of the float32 logits), never listing a token the head cannot produce. `match`: the row's
    top-1 is the committed token. `certain_at`: the shallowest row (raw before trained at one depth)
    whose top-1 is the committed token; None if none, e.g. a sampled token no row preferred. Text
    is each token's text in its context with a tokenizer (raw model text: escape it to show it),
    else str(id).
    """
    layers = _check(ee, prompt_ids, token_ids, layers, top)
    rows = _rows(ee, layers)
    n = len(token_ids)
    ids = list(prompt_ids) + list(token_ids[:-1])  # the last token predicts nothing shown here
    first = len(prompt_ids) - 1  # position whose state predicted token_ids[0]
    states = _boundary_states(ee, ids, sorted({r["layer"] for r in rows}))
    for fmt in formats:  # each cheaper format's full model, on its own copy: a row before the full model's
        copy = ee.in_format(fmt)  # ConfigError naming the formats offered, for one this model lacks
        rows.insert(-1, {"layer": ee.num_layers, "kind": "format", "format": fmt,
                         "label": level_words(f"full@{fmt}").removeprefix("the ")})
        states[fmt] = _boundary_states(copy, ids, [copy.num_layers])[copy.num_layers]
    targets = torch.tensor(token_ids, dtype=torch.long)
    k = min(top, ee.final_head.lm_head.weight.shape[0])
    found = []  # per row: (probs (n, k), ids (n, k), p of the committed token (n,))
    for row in rows:
        fn = (_logits_fn(ee.in_format(row["format"]), row, states[row["format"]]) if row["kind"] == "format"
              else _logits_fn(ee, row, states[row["layer"]]))
        chunks = []
        for a in range(0, n, _CHUNK):
            b = min(a + _CHUNK, n)
            logits = fn(slice(first + a, first + b)).float()
            logprobs = torch.log_softmax(logits, dim=-1).cpu()
            top_lp, top_ids = logprobs.topk(k, dim=-1)
            p_tok = logprobs.gather(-1, targets[a:b, None])[:, 0].exp()
            chunks.append((top_lp.exp(), top_ids, top_lp, p_tok))
        found.append(tuple(torch.cat([c[j] for c in chunks]) for j in range(4)))

    detok = Detokenizer(tokenizer)
    context = list(prompt_ids) + list(token_ids)

    def text(pos: int, token: int) -> str:
        if tokenizer is None:
            return str(token)
        return detok.piece(context[:pos], token)

    tokens = []
    for i, token in enumerate(token_ids):
        pos = len(prompt_ids) + i
        cells = []
        certain = None
        for r, (probs, top_ids, top_lp, p_tok) in enumerate(found):
            cands = [[int(t), text(pos, int(t)), round(float(p), 6)]
                     for t, p, lp in zip(top_ids[i].tolist(), probs[i].tolist(), top_lp[i].tolist())
                     if not math.isinf(lp)]  # outside a reduced-vocabulary head's subset
            match = bool(cands) and cands[0][0] == token
            if match and certain is None:
                certain = r
            cells.append({"top": cands, "match": match, "p": round(float(p_tok[i]), 6)})
        tokens.append({"index": i, "token_id": int(token), "text": text(pos, int(token)), "cells": cells,
                       "certain_at": None if certain is None else rows[certain]["layer"],
                       "certain_row": certain,
                       "certain_label": None if certain is None else rows[certain]["label"]})
    return {"num_layers": ee.num_layers, "top": top, "layers": rows, "tokens": tokens}
