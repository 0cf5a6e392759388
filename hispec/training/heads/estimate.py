"""Estimate the speed of greedy HiSpec and LayerSkip from exit predictions, without running them.

Greedy speculative decoding commits exactly the target's greedy tokens, so on the target's own
greedy text the draft and verifier exits see exactly the contexts they see while decoding, as long
as every token before is right. Given, for held-out greedy sequences, the top-1 prediction of each
exit at every position (teacher-forced), this module replays the engine's rounds:

- draft k tokens at exit d; the verifier (exit v) keeps the matching prefix and writes
  its own token at the first mismatch; once t tokens are tentative (lengths (k, t)) the target
  commits the matching prefix plus its own token (correction or bonus);
- after the first wrong token the context leaves the greedy path, where the predictions are
  unknown: those tokens are wrong by construction (the target discards them), and the verifier
  accepts a draft there with the overall draft-verifier agreement rate (seeded coin).

Time comes from the engine's cost model (hispec.engine.planning.costs.CostModel: seconds per decoder layer
for a pass of n new tokens, and per exit head, its attention step included, for n rows): measured
on this machine with the trained heads attached (``measured_costs``), or given (another machine's
figures, a test's). The result is an estimate to rank settings, not a measurement: confirm with
`bench --sweep`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hispec.engine.planning.costs import CostModel


@dataclass
class Sequence:
    target: list[int]  # the target's greedy token at each position
    preds: dict[int, list[int]]  # exit layer -> its top-1 at each position (greedy context)


def measured_costs(ee, heads: dict) -> CostModel:
    """This machine's pass costs for `ee` with these exit heads in place (attached for the timing,
    then the model's own heads are put back)."""
    before = (dict(ee.exit_heads), ee.exit_info)
    ee.attach_exit_heads(heads, before[1])
    try:
        costs = CostModel()
        costs.calibrate(ee, tuple(sorted(heads)))
    finally:
        ee.attach_exit_heads(*before)
    return costs


def _pass(costs: CostModel, layers: int, tokens: int) -> float:
    return layers * costs.layer(tokens)


def _hispec_time(seq: Sequence, d: int, v: int, L: int, per_round: int, threshold: int, off_accept: float,
                 costs: CostModel, rng: random.Random) -> tuple[float, int]:
    g, D, V = seq.target, seq.preds[d], seq.preds[v]
    n, c, t = len(g), 1, 0.0  # the first token comes from the prefill, as in the engine
    pending: list[bool] = []  # tentative tokens after position c: on the greedy path?
    while c < n:
        drafts = []  # (position, token on path, context on path)
        for _ in range(per_round):
            p = c + len(pending) + len(drafts)
            if p >= n:
                break
            t += _pass(costs, d, 1) + costs.head(d, 1)
            ctx = all(pending) and all(ok for _, ok, _ in drafts)
            drafts.append((p, ctx and D[p] == g[p], ctx))
        if drafts:
            t += _pass(costs, v - d, len(drafts)) + costs.head(v, len(drafts))
            for p, ok, ctx in drafts:
                if ctx:
                    if D[p] == V[p]:
                        pending.append(ok)
                        continue
                    pending.append(V[p] == g[p])  # the verifier writes its own token
                    break
                if rng.random() < off_accept:
                    pending.append(False)
                    continue
                pending.append(False)
                break
        if len(pending) >= threshold or c + len(pending) >= n or not drafts:
            k = len(pending)
            # the newest tentative token goes through every layer (for the bonus row), then
            # layers [v, L) run on the k tentative tokens and the one before them
            t += _pass(costs, v, 1) + _pass(costs, L - v, k + 1) + costs.head(L, k + 1)
            good = next((i for i, ok in enumerate(pending) if not ok), k)
            c += good + 1  # the matching prefix, then the target's own token
            pending = []
    return t, n - 1


def _layerskip_time(seq: Sequence, e: int, L: int, drafts: int, costs: CostModel) -> tuple[float, int]:
    g, D = seq.target, seq.preds[e]
    n, c, t = len(g), 1, 0.0
    while c < n:
        k = min(drafts, n - c)
        t += k * (_pass(costs, e, 1) + costs.head(e, 1))
        t += _pass(costs, e, 1) + _pass(costs, L - e, k + 1) + costs.head(L, k + 1)
        good = next((i for i in range(k) if D[c + i] != g[c + i]), k)
        c += good + 1
    return t, n - 1


def autoregressive_seconds(L: int, costs: CostModel) -> float:
    """One plain step: layers [0, L) over one token, then the final head."""
    return _pass(costs, L, 1) + costs.head(L, 1)


def estimate(seqs: list[Sequence], L: int, method: str, d: int, v: int | None = None, drafts: int = 2,
             threshold: int = 4, off_accept: float = 0.3, *, costs: CostModel, seed: int = 0) -> float:
    """Estimated speedup over autoregressive decoding (time per token ratio), with these pass costs."""
    rng = random.Random(seed)
    total_t, total_n = 0.0, 0
    for seq in seqs:
        if len(seq.target) < 2:
            continue
        if method == "hispec":
            t, n = _hispec_time(seq, d, v, L, drafts, threshold, off_accept, costs, rng)
        else:
            t, n = _layerskip_time(seq, d, L, drafts, costs)
        total_t, total_n = total_t + t, total_n + n
    if not total_n:
        return 0.0
    return autoregressive_seconds(L, costs) / (total_t / total_n)


def best_settings(seqs: list[Sequence], L: int, layers: list[int], pair_agreement: dict[str, float],
                  costs: CostModel) -> dict:
    """The best hispec (d, v and its lengths (k, t)) and layerskip (exit, k drafts) among the trained
    exits, by estimated speedup; with the estimate of every (d, v) at lengths (2, 4)."""
    pairs = {}
    best_h = None
    for i, d in enumerate(layers):
        for v in layers[i + 1:]:
            off = pair_agreement.get(f"{d}-{v}", 0.3)
            for n_d in (1, 2, 3, 4):
                for n_i in (1, 2, 4, 6, 8):  # threshold 1: the full model checks each tentative token
                    s = estimate(seqs, L, "hispec", d, v, n_d, n_i, off, costs=costs)
                    if (n_d, n_i) == (2, 4):
                        pairs[f"{d}-{v}"] = round(s, 3)
                    if best_h is None or s > best_h[0]:
                        best_h = (s, d, v, n_d, n_i)
    best_l = None
    for e in layers:
        for k in (1, 2, 3, 4, 6, 8):
            s = estimate(seqs, L, "layerskip", e, None, k, costs=costs)
            if best_l is None or s > best_l[0]:
                best_l = (s, e, k)
    out = {"pairs_at_2_4": pairs, "note": "estimated speedup over autoregressive from held-out exit predictions "
                                          "and pass costs (not a measurement)", "costs_ms": costs.figures_ms()}
    if best_h:
        out["hispec"] = {"speedup": round(best_h[0], 3), "draft": best_h[1], "verify": best_h[2],
                         "lengths": [best_h[3], best_h[4]]}
    if best_l:
        out["layerskip"] = {"speedup": round(best_l[0], 3), "exit": best_l[1], "drafts": best_l[2]}
    return out
