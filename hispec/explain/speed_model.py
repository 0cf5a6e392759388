"""Why this speed: the cost model's prediction for a run's settings, as a function of acceptance.

A speculative round pays when the tokens it commits per second beat a plain step's. With the
per-pass costs measured on this machine (``engine.planning.costs.CostModel``) and a per-token acceptance
per level pair, the expected tokens per second of a fixed round is the adaptive policy's own
formula (``engine.planning.round.Round.rate``, in every lane and shape of round); divided by a plain step's, it is
the predicted speedup. ``break_even`` is the acceptance at which that ratio reaches 1.

Acceptance here is per token and in order (a geometric run); real runs are burstier, so the
prediction is a model, shown next to the measured speedup, never instead of it.
"""

from __future__ import annotations

from typing import Mapping

from hispec.engine.planning.costs import CostModel
from hispec.engine.levels import LOOKUP, Level
from hispec.engine.planning.round import Round, plain_rate
from hispec.runs.record import pair_words

Lanes = Mapping[str | None, CostModel]  # each number format's costs (None: the exact format)
Pair = tuple[Level, Level]


def slider_acceptance(a_low: float | None, a_full: float | None):
    """(holder, judge) -> acceptance for the sliders: `a_full` for a pair into the full model, `a_low` for a
    pair below it (a copy or a draft judged by a middle level)."""
    return lambda low, high: a_full if high.kind == "full" and high.precision is None else a_low


class SliderModel:
    """The sliders' estimates for one plan of the run (a Round, in any lane): the adaptive policy's formula
    (engine.planning.round.Round.rate) over the costs the run kept for every lane."""

    def __init__(self, lanes: Lanes, num_layers: int):
        self.lanes, self.L = lanes, num_layers

    def speedup(self, r: Round, a_low: float | None, a_full: float) -> float | None:
        """Predicted tokens/s relative to plain steps; None where no formula covers the round."""
        if r.plain:
            return 1.0
        return r.speedup(self.lanes, slider_acceptance(a_full if a_low is None else a_low, a_full))

    def curve(self, r: Round, a_low: float | None = None, points: int = 21) -> list[tuple[float, float]]:
        """(acceptance into the full model, predicted speedup) over 0..1; a_low None: the pair below agrees as
        often (one acceptance for both)."""
        xs = [i / (points - 1) for i in range(points)]
        out = [(a, self.speedup(r, a if a_low is None else a_low, a)) for a in xs]
        return [(a, y) for a, y in out if y is not None]

    def break_even(self, r: Round, a_low: float | None = None) -> float | None:
        """The lowest acceptance into the full model at which the prediction reaches plain speed (the pair
        below held at `a_low`); None if even 1 does not, or no formula covers the round."""
        if self.speedup(r, a_low, 1.0) is None:
            return None
        return _lowest(lambda a: self.speedup(r, a if a_low is None else a_low, a))


def _lowest(speedup) -> float | None:
    """The lowest acceptance in [0, 1] at which `speedup(a)` reaches 1 (it rises with a); None if a = 1
    does not."""
    if speedup(1.0) < 1.0:
        return None
    if speedup(0.0) >= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(40):  # bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid) < 1.0 else (lo, mid)
    return hi


# ---- a run plan by plan (explain.plans), measured and predicted ------------------------------
def swept_pair(r: Round) -> tuple[Level, Level] | None:
    """The pair whose acceptance a plan's break-even is stated in: for the hierarchy (a level drafting for
    a level that judges it), the pair into the full model, as the paper's curves have it; for every other
    plan the proposer's own pair (lookup -> its judge, a drafter -> the full model). None: a plain step."""
    pairs = r.kind.pairs(r.top)
    if not pairs:
        return None
    return pairs[-1] if r.judges and r.proposer.kind != LOOKUP else pairs[0]


def measured_acceptance(acceptance: dict, swept: tuple[Level, Level] | None = None, at: float | None = None):
    """(holder, judge) -> the plan's measured acceptance; the `swept` pair at `at` instead. A pair the plan
    did not measure takes the swept pair's value (the sliders' 'one acceptance for both'), else None."""
    def accept(low: Level, high: Level):
        if swept is not None and (low, high) == swept:
            return at
        value = acceptance.get((low, high))
        return at if value is None and at is not None else value
    return accept


def break_even(r: Round, lanes: Lanes, acceptance: dict) -> float | None:
    """The acceptance of `swept_pair(r)` at which the plan's estimate reaches a plain step's, the plan's
    other pairs held at what it measured; None when even acceptance 1 does not, or no formula covers it."""
    swept = swept_pair(r)
    if swept is None or r.speedup(lanes, measured_acceptance(acceptance, swept, 1.0)) is None:
        return None
    return _lowest(lambda a: r.speedup(lanes, measured_acceptance(acceptance, swept, a)))


def plan_acceptance(acceptance: dict[Pair, float | None]) -> tuple[float | None, float | None]:
    """(below, into the full model) of one plan's per-token acceptance: the lowest pair judged by a middle
    level, and the pair that reached the full model (the sliders' two values)."""
    below = [v for (low, high), v in acceptance.items() if high.name != "target" and v is not None]
    to_full = [v for (low, high), v in acceptance.items() if high.name == "target" and v is not None]
    return (below[0] if below else None), (to_full[0] if to_full else None)


def explain_plans(rows, costs: CostModel | Lanes, num_layers: int,
                  plain_tokens_per_s: float | None = None) -> list[dict]:
    """Each plan that ran (explain.plans.PlanRow) with the cost model's figures at its measured
    acceptance: predicted speedup over a plain step, its break-even acceptance (and the pair it is stated
    in), and the predicted tokens/s once the model's plain step is calibrated to the measured plain runs
    (`plain_tokens_per_s`; None: the cost model's own plain step). `costs`: the exact model's, or one per
    lane the run used ({None: exact, 'q4': ...}); a plan with a level in a lane without costs has no
    estimate. JSON-ready dicts, every pair named by its levels in words: the page and /generate's answer show
    the same."""
    lanes = costs if isinstance(costs, Mapping) else {None: costs}
    plain = plain_rate(lanes[None], num_layers) if None in lanes else None  # no costs kept: measured only
    scale = (plain_tokens_per_s / plain) if plain_tokens_per_s and plain else 1.0
    out = []
    for row in rows:
        r = row.round
        a_dv, a_vt = plan_acceptance(row.acceptance)
        swept = swept_pair(r)
        item = {"words": r.kind.words, "round": r.words, "plain": r.plain,
                "drafts_on": r.kind.drafts_on,
                "hierarchy": bool(r.judges) and r.proposer.kind != LOOKUP, "rounds": row.rounds, "new_tokens": row.new_tokens, "share": row.share,
                "measured_tokens_per_s": row.tokens_per_s, "a_dv": a_dv, "a_vt": a_vt,
                # every pair the plan measured, bottom first, by its levels in words
                "acceptance": {pair_words(pair): rate for pair, rate in row.acceptance.items()},
                "count": row.count, "verify_at": row.verify_at, "then": row.then,
                "measured_vs_plain": (row.tokens_per_s / plain_tokens_per_s if row.tokens_per_s and plain_tokens_per_s
                                      else None),
                "expected_gain": row.expected_gain, "predicted": None, "break_even": None,
                "break_even_pair": None if swept is None else pair_words(swept),
                "predicted_tokens_per_s": None}
        if plain is None:
            pass
        elif r.plain:
            item.update(predicted=1.0, predicted_tokens_per_s=plain * scale)
        else:
            predicted = r.speedup(lanes, measured_acceptance(row.acceptance))
            if predicted is not None:
                item.update(predicted=predicted, break_even=break_even(r, lanes, row.acceptance),
                            predicted_tokens_per_s=predicted * plain * scale)
        out.append(item)
    return out


def run_prediction(plans: list[dict]) -> float | None:
    """The whole run's predicted speedup over plain decoding: each plan's committed tokens at its
    predicted rate against the same tokens at plain speed (decoding only, the prefill apart)."""
    tokens = sum(p["new_tokens"] for p in plans)
    if not tokens or any(p["predicted"] is None for p in plans if p["new_tokens"]):
        return None
    plain_s = tokens  # in units of a plain step
    predicted_s = sum(p["new_tokens"] / p["predicted"] for p in plans if p["new_tokens"])
    return plain_s / predicted_s if predicted_s > 0 else None


def acceptance_interval(a: float | None, judged: int, z: float = 1.645) -> tuple[float, float] | None:
    """A 90% interval of a per-token acceptance measured on `judged` tokens (Wilson's)."""
    if a is None or judged <= 0:
        return None
    denom = 1 + z * z / judged
    centre = (a + z * z / (2 * judged)) / denom
    half = z * ((a * (1 - a) / judged + z * z / (4 * judged * judged)) ** 0.5) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
