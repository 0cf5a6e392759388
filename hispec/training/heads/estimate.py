"""Estimate the speed of greedy HiSpec and LayerSkip from exit predictions, without running them.

Greedy speculative decoding commits exactly the target's greedy tokens, so on the target's own
greedy text the draft and verifier exits see exactly the contexts they see while decoding, as long
as every token before is right. Given, for held-out greedy sequences, the top-1 prediction of each
exit at every position (teacher-forced), this module replays the engine's rounds:

- draft `draft_len` tokens at exit d; the verifier (exit v) keeps the matching prefix and writes
  its own token at the first mismatch; once `verify_threshold` tokens are tentative the target
  commits the matching prefix plus its own token (correction or bonus);
- after the first wrong token the context leaves the greedy path, where the predictions are
  unknown: those tokens are wrong by construction (the target discards them), and the verifier
  accepts a draft there with the overall draft-verifier agreement rate (seeded coin).

Time comes from a step-cost table (milliseconds per decoder layer for a pass of n tokens, the
full LM head, the reduced-vocabulary head, a fixed cost per pass). The defaults are the engine's
lean path on this project's CPU, 2 threads, fp32, the default model, timed call by call inside
real autoregressive/layerskip/hispec runs on held-out prompts (not in a loop of repeated calls:
a full-model pass pushes a head's weights out of the CPU caches, so an exit head costs 0.75 ms
there against 0.2 ms when called again and again); pass your own for other machines. The result
is an estimate to rank settings, not a measurement: confirm with `bench --sweep`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class StepCosts:
    layer_1: float = 0.48  # ms per decoder layer, 1 new token
    layer_4: float = 0.50  # 2-4 new tokens
    layer_8: float = 0.62  # 5+ new tokens
    head_full_1: float = 2.4  # full LM head, 1 row (after a full-model pass, as in autoregressive)
    head_full_n: float = 1.8  # full LM head, several rows (after the verification pass)
    head_exit: float = 0.75  # an exit head on the reduced vocabulary (any rows)
    head_attention: float = 0.36  # an attention head's attention step (own KV cache), per call
    per_pass: float = 0.1  # fixed cost of one stage pass of the engine
    per_token: float = 0.25  # per committed token: selection, events, text (autoregressive pays it too)

    def layers(self, count: int, tokens: int) -> float:
        per = self.layer_1 if tokens <= 1 else self.layer_4 if tokens <= 4 else self.layer_8
        return count * per + self.per_pass

    def head(self, rows: int) -> float:
        return self.head_full_1 if rows <= 1 else self.head_full_n


@dataclass
class Sequence:
    target: list[int]  # the target's greedy token at each position
    preds: dict[int, list[int]]  # exit layer -> its top-1 at each position (greedy context)


def _hispec_time(seq: Sequence, d: int, v: int, L: int, draft_len: int, threshold: int, off_accept: float,
                 costs: StepCosts, exit_head: float, rng: random.Random) -> tuple[float, int]:
    g, D, V = seq.target, seq.preds[d], seq.preds[v]
    n, c, t = len(g), 1, 0.0  # the first token comes from the prefill, as in the engine
    pending: list[bool] = []  # tentative tokens after position c: on the greedy path?
    while c < n:
        drafts = []  # (position, token on path, context on path)
        for _ in range(draft_len):
            p = c + len(pending) + len(drafts)
            if p >= n:
                break
            t += costs.layers(d, 1) + exit_head
            ctx = all(pending) and all(ok for _, ok, _ in drafts)
            drafts.append((p, ctx and D[p] == g[p], ctx))
        if drafts:
            t += costs.layers(v - d, len(drafts)) + exit_head
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
            t += costs.layers(d, 1) + costs.layers(v - d, 1) + costs.layers(L - v, k + 1) + costs.head(k + 1)
            good = next((i for i, ok in enumerate(pending) if not ok), k)
            c += good + 1  # the matching prefix, then the target's own token
            pending = []
    return t + (n - 1) * costs.per_token, n - 1


def _layerskip_time(seq: Sequence, e: int, L: int, draft_len: int, costs: StepCosts, exit_head: float) -> tuple[float, int]:
    g, D = seq.target, seq.preds[e]
    n, c, t = len(g), 1, 0.0
    while c < n:
        k = min(draft_len, n - c)
        t += k * (costs.layers(e, 1) + exit_head)
        t += costs.layers(e, 1) + costs.layers(L - e, k + 1) + costs.head(k + 1)
        good = next((i for i in range(k) if D[c + i] != g[c + i]), k)
        c += good + 1
    return t + (n - 1) * costs.per_token, n - 1


def autoregressive_ms(L: int, costs: StepCosts) -> float:
    return costs.layers(L, 1) + costs.head(1) + costs.per_token


def estimate(seqs: list[Sequence], L: int, method: str, d: int, v: int | None = None, draft_len: int = 2,
             threshold: int = 4, off_accept: float = 0.3, costs: StepCosts | None = None,
             subset_heads: bool = True, seed: int = 0, attention_heads: bool = False) -> float:
    """Estimated speedup over autoregressive decoding (time per token ratio)."""
    costs = costs or StepCosts()
    exit_head = (costs.head_exit if subset_heads else costs.head_full_1) + (costs.head_attention if attention_heads
                                                                           else 0.0)
    rng = random.Random(seed)
    total_t, total_n = 0.0, 0
    for seq in seqs:
        if len(seq.target) < 2:
            continue
        if method == "hispec":
            t, n = _hispec_time(seq, d, v, L, draft_len, threshold, off_accept, costs, exit_head, rng)
        else:
            t, n = _layerskip_time(seq, d, L, draft_len, costs, exit_head)
        total_t, total_n = total_t + t, total_n + n
    if not total_n:
        return 0.0
    return autoregressive_ms(L, costs) / (total_t / total_n)


def best_settings(seqs: list[Sequence], L: int, layers: list[int], pair_agreement: dict[str, float],
                  costs: StepCosts | None = None, subset_heads: bool = True, attention_heads: bool = False) -> dict:
    """The best hispec (d, v, draft_len, verify_threshold) and layerskip (exit, draft_len) among
    the trained exits, by estimated speedup; with the estimate of every (d, v) at 2/4."""
    pairs = {}
    best_h = None
    for i, d in enumerate(layers):
        for v in layers[i + 1:]:
            off = pair_agreement.get(f"{d}-{v}", 0.3)
            for n_d in (1, 2, 3, 4):
                for n_i in (1, 2, 4, 6, 8):  # threshold 1: the full model checks each tentative token
                    s = estimate(seqs, L, "hispec", d, v, n_d, n_i, off, costs, subset_heads,
                                 attention_heads=attention_heads)
                    if (n_d, n_i) == (2, 4):
                        pairs[f"{d}-{v}"] = round(s, 3)
                    if best_h is None or s > best_h[0]:
                        best_h = (s, d, v, n_d, n_i)
    best_l = None
    for e in layers:
        for k in (1, 2, 3, 4, 6, 8):
            s = estimate(seqs, L, "layerskip", e, None, k, costs=costs, subset_heads=subset_heads,
                         attention_heads=attention_heads)
            if best_l is None or s > best_l[0]:
                best_l = (s, e, k)
    out = {"pairs_at_2_4": pairs, "note": "estimated speedup over autoregressive from held-out exit predictions "
                                          "and step costs (not a measurement)", "costs_ms": vars(costs or StepCosts())}
    if best_h:
        out["hispec"] = {"speedup": round(best_h[0], 3), "draft": best_h[1], "verify": best_h[2],
                         "draft_len": best_h[3], "verify_threshold": best_h[4]}
    if best_l:
        out["layerskip"] = {"speedup": round(best_l[0], 3), "exit": best_l[1], "draft_len": best_l[2]}
    return out
