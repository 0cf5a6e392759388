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

from dataclasses import dataclass
from typing import Mapping

from hispec.engine.config import recorded_lengths
from hispec.engine.planning.costs import CostModel
from hispec.engine.levels import LOOKUP, Level, build_levels, levels_by_role, parse_levels
from hispec.engine.planning.round import Round, plain_rate
from hispec.runs.metrics import pair_name

Lanes = Mapping[str | None, CostModel]  # each number format's costs (None: the exact format)


@dataclass(frozen=True)
class RoundShape:
    """What a fixed round of exits does (the sliders' curves are for it): the levels below the full model
    (a level list of engine.levels, e.g. ("lookup", 2, 4)) and its lengths. Its `kind`: "hierarchy" (two
    exits: the lower drafts, the upper judges first), "exit" (one exit drafts), "lookup" (lookup drafts),
    or "plain"."""

    levels: tuple = ()
    count: int = 1  # tokens drafted per round
    verify_at: int = 1  # tentative tokens that call the full model

    @classmethod
    def from_settings(cls, settings: dict) -> RoundShape:
        """From a run's settings (DoneEvent.settings / a resolved DecodeConfig as a dict)."""
        return cls(tuple(parse_levels(settings.get("levels") or ())), *recorded_lengths(settings))

    @property
    def exits(self) -> tuple[int, ...]:
        return tuple(x for x in self.levels if isinstance(x, int))

    @property
    def kind(self) -> str:
        exits = self.exits
        if len(exits) >= 2:
            return "hierarchy"
        if len(exits) == 1 and LOOKUP not in self.levels:
            return "exit"
        return "lookup" if LOOKUP in self.levels and not exits else "plain"

    def as_round(self, num_layers: int) -> Round:
        """The engine's round of this shape (the exits that draft and judge; lookup only when it drafts)."""
        kept = self.exits[-2:] if self.exits else ((LOOKUP,) if self.kind == "lookup" else ())
        levels = build_levels(kept, num_layers)
        top = levels[-1]
        if len(levels) == 1:
            return Round.plain_step(top)
        judges = levels[1:-1]
        return Round(levels[0], top, self.count, judges, self.verify_at if judges else 1)


def pair_acceptance(a_dv: float | None, a_vt: float | None):
    """(holder, judge) -> acceptance: `a_vt` for the pair into the full model, `a_dv` for a pair below it."""
    return lambda low, high: a_vt if high.name == "target" else a_dv


class SpeedModel:
    """The sliders' estimates for a fixed shape of exact exits: the adaptive policy's formula
    (engine.planning.round.Round.rate) over the exact model's costs."""

    def __init__(self, costs: CostModel, num_layers: int):
        self.costs, self.L = costs, num_layers

    def speedup(self, r: RoundShape, a_dv: float, a_vt: float) -> float:
        """Predicted tokens/s relative to plain steps; a_dv: draft->verify, a_vt: the exit just
        below the full model -> full model (layerskip: its exit -> full model)."""
        value = r.as_round(self.L).speedup({None: self.costs}, pair_acceptance(a_dv, a_vt))
        return 1.0 if value is None else value

    def curve(self, r: RoundShape, a_dv: float | None = None, points: int = 21) -> list[tuple[float, float]]:
        """(acceptance, predicted speedup) over acceptance 0..1 of the exit below the full model;
        a_dv None: the draft exit agrees with the verifier as often (one acceptance for both)."""
        xs = [i / (points - 1) for i in range(points)]
        return [(a, self.speedup(r, a if a_dv is None else a_dv, a)) for a in xs]

    def break_even(self, r: RoundShape, a_dv: float | None = None) -> float | None:
        """The lowest acceptance (as in `curve`) at which the prediction reaches plain speed; None if
        even acceptance 1 does not (the round costs more than it can commit)."""
        return _lowest(lambda a: self.speedup(r, a if a_dv is None else a_dv, a))


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


def measured_pairs(acceptance: dict, kind: str) -> tuple[float | None, float | None]:
    """(a_dv, a_vt) measured in a run of a shape of this `kind` (RoundShape.kind), from its stats'
    acceptance (None where not measured)."""
    if kind == "exit":
        return None, acceptance.get("draft->target")
    if kind == "hierarchy":
        return acceptance.get("draft->verify"), acceptance.get("verify->target")
    return None, None


# ---- a run plan by plan (explain.plans), measured and predicted ------------------------------
def pair_key(low: Level, high: Level) -> str:
    """The stats' key of a level pair: 'lookup->verify', 'verify->target'."""
    return f"{low.name}->{high.name}"


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
        value = acceptance.get(pair_key(low, high))
        return at if value is None and at is not None else value
    return accept


def break_even(r: Round, lanes: Lanes, acceptance: dict) -> float | None:
    """The acceptance of `swept_pair(r)` at which the plan's estimate reaches a plain step's, the plan's
    other pairs held at what it measured; None when even acceptance 1 does not, or no formula covers it."""
    swept = swept_pair(r)
    if swept is None or r.speedup(lanes, measured_acceptance(acceptance, swept, 1.0)) is None:
        return None
    return _lowest(lambda a: r.speedup(lanes, measured_acceptance(acceptance, swept, a)))


def plan_acceptance(acceptance: dict) -> tuple[float | None, float | None]:
    """(a_dv, a_vt) of one plan's per-token acceptance: draft -> verify, and the level just below
    the full model -> full model (whichever level that is in this plan)."""
    to_full = [v for key, v in acceptance.items() if key.endswith("->target") and v is not None]
    return acceptance.get("draft->verify"), (to_full[0] if to_full else None)


def explain_plans(rows, costs: CostModel | Lanes, num_layers: int, plain_tokens_per_s: float | None = None,
                  levels: tuple = ()) -> list[dict]:
    """Each plan that ran (explain.plans.PlanRow) with the cost model's figures at its measured
    acceptance: predicted speedup over a plain step, its break-even acceptance (and the pair it is stated
    in), and the predicted tokens/s once the model's plain step is calibrated to the measured plain runs
    (`plain_tokens_per_s`; None: the cost model's own plain step). `costs`: the exact model's, or one per
    lane the run used ({None: exact, 'q4': ...}); a plan with a level in a lane without costs has no
    estimate. `levels`: the run's level list as written (names the pairs). JSON-ready dicts: the page and
    /generate's answer show the same."""
    lanes = costs if isinstance(costs, Mapping) else {None: costs}
    plain = plain_rate(lanes[None], num_layers) if None in lanes else None  # no costs kept: measured only
    scale = (plain_tokens_per_s / plain) if plain_tokens_per_s and plain else 1.0
    roles = levels_by_role(tuple(levels)) if levels else None
    out = []
    for row in rows:
        r = row.round
        a_dv, a_vt = plan_acceptance(row.acceptance)
        swept = swept_pair(r)
        item = {"kind": row.key, "words": r.kind.words, "round": r.words, "hierarchy": bool(r.judges) and
                r.proposer.kind != LOOKUP, "rounds": row.rounds, "new_tokens": row.new_tokens, "share": row.share,
                "measured_tokens_per_s": row.tokens_per_s, "a_dv": a_dv, "a_vt": a_vt,
                "acceptance": dict(row.acceptance),  # every pair the plan measured, by role
                "count": row.count, "verify_at": row.verify_at, "then": row.then,
                "measured_vs_plain": (row.tokens_per_s / plain_tokens_per_s if row.tokens_per_s and plain_tokens_per_s
                                      else None),
                "expected_gain": row.expected_gain, "predicted": None, "break_even": None,
                "break_even_pair": None if swept is None else pair_name(pair_key(*swept), roles),
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
