"""Micro-benchmark of the step costs speculative decoding depends on (`python -m hispec profile`).

All figures come from one process, one context, measured alternately: for 1, 2, 4, 8 and 16 new
tokens after a prompt of `context` tokens,
- the full-model step (embedding, every layer, final head on every new row) on the path the
  engine uses (lean, see hispec/model/lean.py) and on transformers' stock forward (`model(...)` with a
  DynamicCache), the latter being what `generate()` pays per token;
- one layer-range call (the draft stage [0, d)) on the lean path and on the stock layers;
- the exit heads (final head, trained heads) on one row, each timed right after a full-model
  step, as the engine meets them: the step has pushed the head's weights out of the CPU caches
  (measured: a 4,096-token exit head takes 0.2 ms when called again and again, 0.8 ms after a
  full step; the final head 2.2 ms and 2.5 ms). `heads_hot_ms` keeps the repeated-call figures.

From them it derives the acceptance rate a single-exit self-speculation needs to break even
(speedup 1) on each path, under the usual model where each draft token is accepted
independently with probability a.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

from hispec.model.cache import LayerKVCache
from hispec.engine.config import default_exits, preset

COUNTS = (1, 2, 4, 8, 16)
FILLER = ("Speculative decoding drafts a few tokens cheaply and checks them with the full model in one "
          "pass, keeping only what the full model would have written itself. ")


def _median_ms(fn: Callable[[], None], repeats: int, before: Callable[[], None] | None = None) -> float:
    """Median time of `fn`; `before` (untimed) runs ahead of every call."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _context_ids(lm, context: int) -> list[int]:
    ids = lm.tokenizer.encode(FILLER * (context // 8 + 2)) if lm.tokenizer is not None else []
    ids = [i % lm.ee.config.vocab_size for i in ids] or list(range(3, 3 + context))
    while len(ids) < context:
        ids += ids
    return ids[:context]


class _Probe:
    """A prefilled context on our cache and on a transformers DynamicCache, rolled back after
    every timed call so each call sees the same past."""

    def __init__(self, lm, context_ids: list[int]):
        from transformers import DynamicCache

        self.ee, self.model = lm.ee, lm.model
        self.ctx = len(context_ids)
        self.cache = self.ee.new_cache(self.ctx + 32)
        self.hidden = None
        with torch.inference_mode():
            h = self.ee.embed(context_ids)
            self.ee.run_layers(h, 0, self.ee.num_layers, self.cache)
            self.hf_cache = DynamicCache(config=self.model.config)
            ids = torch.tensor([context_ids], device=self.ee.device)
            self.model(input_ids=ids, past_key_values=self.hf_cache, use_cache=True)

    def _rollback(self):
        for layer in range(self.ee.num_layers):
            self.cache.crop(layer, self.ctx)

    def lean_full(self, new: list[int]) -> None:
        ee = self.ee
        h = ee.run_layers(ee.embed(new), 0, ee.num_layers, self.cache)
        ee.exit_logits(h, ee.num_layers)
        self._rollback()

    def range_call(self, new: list[int], end: int) -> None:
        ee = self.ee
        ee.run_layers(ee.embed(new), 0, end, self.cache)
        for layer in range(end):
            self.cache.crop(layer, self.ctx)

    def hf_full(self, new: list[int]) -> None:
        ids = torch.tensor([new], device=self.ee.device)
        self.model(input_ids=ids, past_key_values=self.hf_cache, use_cache=True)
        self.hf_cache.crop(-len(new))  # transformers 5: a negative count of tokens to drop


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def break_even(draft_ms: float, verify_ms: dict[int, float], step_ms: float, k: int) -> float | None:
    """Acceptance a at which self-speculation with k drafts per round matches plain
    decoding: tokens per round (1 - a^(k+1)) / (1 - a) equal round cost / step cost."""
    cost = (k * draft_ms + verify_ms[k]) / step_ms  # a round in units of one plain step
    lo, hi = 0.0, 1.0
    if (k + 1) < cost:
        return None  # even perfect acceptance loses
    for _ in range(60):
        a = (lo + hi) / 2
        tokens = (1 - a ** (k + 1)) / (1 - a)
        lo, hi = (a, hi) if tokens < cost else (lo, a)
    return round((lo + hi) / 2, 4)


def layerskip_round_ms(shallow_ms: float, head_ms: float, full_step_ms: float, final_ms: float,
                       exit_layer: int, num_layers: int, k: int) -> tuple[float, float]:
    """(draft_ms, verify_ms) of one layerskip round at `exit_layer` with k drafts, as the
    engine runs it. Each draft: layers [0, e) on one token (`shallow_ms`) + the exit head.
    Verification: layers [0, e) on the last draft, the only one not yet through them, then layers
    [e, L) over the drafts and the token before them, then the final head. `full_step_ms` is a full
    step over k + 1 tokens (its layers plus one final head); layers [e, L) cost (L - e) / L
    of its layers."""
    layers_ms = max(0.0, full_step_ms - final_ms)
    draft_ms = shallow_ms + head_ms
    verify_ms = shallow_ms + layers_ms * (num_layers - exit_layer) / num_layers + final_ms
    return draft_ms, verify_ms


def profile(lm, context: int = 128, repeats: int = 20, counts=COUNTS, progress=None) -> dict:
    """Step costs in milliseconds (medians) on the lean and stock paths; see the module doc."""
    ee = lm.ee
    L = ee.num_layers
    d = default_exits(L)[0]
    # the single-exit self-speculation the engine would run: its recommended exit and drafts per round
    single = preset("layerskip").resolve_for(ee)
    e, k = single.exit_layer("draft"), single.lengths[0]
    lean_on = ee.lean is not None
    ids = _context_ids(lm, context + max(counts))
    probe = _Probe(lm, ids[:context])
    device = ee.device
    from hispec.evaluation.record import run_record

    out = {**run_record(lm, None, single), "counts": list(counts), "model": lm.name, "num_layers": L,
           "context": context, "repeats": repeats,
           "device": str(device), "dtype": str(ee.dtype).replace("torch.", ""), "threads": torch.get_num_threads(),
           "lean": lean_on, "lean_packed": bool(lean_on and ee.lean.packed), "stock_reason": ee.stock_reason,
           "full_step_ms": {}, "hf_full_step_ms": {}, "stock_layers_full_step_ms": {},
           "draft_range_ms": {}, "stock_draft_range_ms": {}, "draft_range": [0, d], "heads_ms": {}}

    def timed(fn, before=None):
        def run():
            fn()
            _sync(device)
        for _ in range(3):  # warm-up: allocator, packing caches, first-call work
            run()
        return _median_ms(run, repeats, before)

    for n in counts:
        new = ids[context : context + n]
        if progress:
            progress(f"{n} new token(s)")
        # Alternate paths inside each count so drift in machine speed hits both alike.
        out["hf_full_step_ms"][n] = timed(lambda: probe.hf_full(new))
        if lean_on:
            out["full_step_ms"][n] = timed(lambda: probe.lean_full(new))
            out["draft_range_ms"][n] = timed(lambda: probe.range_call(new, d))
        saved, ee.lean, ee.final_head.lean = ee.lean, None, None
        try:
            out["stock_layers_full_step_ms"][n] = timed(lambda: probe.lean_full(new))
            out["stock_draft_range_ms"][n] = timed(lambda: probe.range_call(new, d))
        finally:
            ee.lean, ee.final_head.lean = saved, saved
        if not lean_on:  # the engine runs the stock layers: that is its path
            out["full_step_ms"][n] = out["stock_layers_full_step_ms"][n]
            out["draft_range_ms"][n] = out["stock_draft_range_ms"][n]

    hidden = torch.randn(1, 1, ee.config.hidden_size, dtype=ee.dtype, device=device)
    step_first = ids[context : context + 1]

    def full_step():  # untimed, before each head call: what the engine runs between head calls
        probe.lean_full(step_first)
        _sync(device)

    out["heads_hot_ms"] = {"final": timed(lambda: ee.exit_logits(hidden, L))}
    out["heads_ms"]["final"] = timed(lambda: ee.exit_logits(hidden, L), full_step)
    for layer in sorted(ee.exit_heads):
        head = ee.exit_heads[layer]
        if getattr(head, "stateful", False):  # attention head: its attention step over the context, then logits
            cache = LayerKVCache(1, context + 8)
            with torch.inference_mode():
                head.attend(torch.randn(1, context, ee.config.hidden_size, device=device), cache, 0)

            def step(head=head, cache=cache, layer=layer):
                with torch.inference_mode():
                    ee.exit_logits(head.attend(hidden, cache, 0), layer)
                cache.crop(0, context)
            fn = step
        else:
            fn = lambda layer=layer: ee.exit_logits(hidden, layer)  # noqa: E731
        out["heads_hot_ms"][f"exit {layer}"] = timed(fn)
        out["heads_ms"][f"exit {layer}"] = timed(fn, full_step)

    # Single-exit self-speculation at exit e with k drafts, approximated from measured parts.
    final = out["heads_ms"]["final"]
    head_e = out["heads_ms"].get(f"exit {e}", final)
    near = min(out["full_step_ms"], key=lambda n: abs(n - (k + 1)))  # the measured count closest to k + 1
    for tag, full in (("lean", "full_step_ms"), ("stock", "hf_full_step_ms")):
        step = out[full]
        shallow = out["draft_range_ms" if tag == "lean" else "stock_draft_range_ms"][1] * e / d
        draft_ms, verify_ms = layerskip_round_ms(shallow, head_e, step[near], final, e, L, k)
        out.setdefault("break_even_acceptance", {})[tag] = break_even(draft_ms, {k: verify_ms}, step[1], k)
    out["break_even_model"] = (f"layerskip at exit {e} with {k} drafts per round, each draft accepted independently; "
                               "draft and verification costs built from the measured steps and heads "
                               "(heads timed after a full step), each path against its own one-token step")
    out["lean_8_vs_stock_1"] = (round(out["full_step_ms"][8] / out["hf_full_step_ms"][1], 3)
                                if 8 in out["full_step_ms"] and 1 in out["hf_full_step_ms"] else None)
    return out


def format_table(r: dict) -> str:
    lines = [f"model {r['model']} · {r['num_layers']} layers · {r['device']} {r['dtype']} · {r['threads']} threads "
             f"· context {r['context']} · median of {r['repeats']}",
             f"engine path: {'lean' + (' (oneDNN-packed weights)' if r['lean_packed'] else '') if r['lean'] else 'stock'}"
             + (f" (stock because {r['stock_reason']})" if r["stock_reason"] else ""), "",
             f"{'new tokens':>10} {'full step':>11} {'hf forward':>11} {'stock layers':>13} "
             f"{'draft [0,' + str(r['draft_range'][1]) + ')':>14} {'stock draft':>12}"]
    for n in r["hf_full_step_ms"]:
        lines.append(f"{n:>10} {r['full_step_ms'][n]:>9.1f}ms {r['hf_full_step_ms'][n]:>9.1f}ms "
                     f"{r['stock_layers_full_step_ms'][n]:>11.1f}ms {r['draft_range_ms'][n]:>12.2f}ms "
                     f"{r['stock_draft_range_ms'][n]:>10.2f}ms")
    lines.append("")
    lines.append("exit heads (1 row, after a full step): " + ", ".join(f"{k} {v:.2f} ms" for k, v in r["heads_ms"].items()))
    if r.get("heads_hot_ms"):
        lines.append("  called again and again: " + ", ".join(f"{k} {v:.2f} ms" for k, v in r["heads_hot_ms"].items()))
    if r.get("lean_8_vs_stock_1"):
        lines.append(f"8-token step on the engine's path / stock 1-token step: {r['lean_8_vs_stock_1']:.2f}x")
    be = r["break_even_acceptance"]
    lines.append("break-even acceptance (" + r["break_even_model"] + "): "
                 + ", ".join(f"{k} {v:.0%}" if v is not None else f"{k} unreachable" for k, v in be.items()))
    return "\n".join(lines)
