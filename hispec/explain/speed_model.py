"""Why this speed: the cost model's prediction for a run's settings, as a function of acceptance.

A speculative round pays when the tokens it commits per second beat a plain step's. With the
per-pass costs measured on this machine (``engine.costs.CostModel``) and a per-token acceptance
per level pair, the expected tokens per second of a fixed round is the adaptive policy's own
formula (``engine.policy``: plain_rate, exit_rate, hierarchy_rate); divided by a plain step's, it is
the predicted speedup. ``break_even`` is the acceptance at which that ratio reaches 1.

Acceptance here is per token and in order (a geometric run); real runs are burstier, so the
prediction is a model, shown next to the measured speedup, never instead of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from hispec.engine.config import recorded_lengths
from hispec.engine.costs import CostModel
from hispec.engine.levels import LOOKUP, parse_levels
from hispec.engine.policy import exit_rate, hierarchy_rate, lookup_rate, plain_rate

# stats' acceptance keys (holder->judge) of the pairs each shape's prediction needs
PAIRS = {"exit": ("draft->target",), "hierarchy": ("draft->verify", "verify->target")}


@dataclass(frozen=True)
class RoundShape:
    """What a fixed round does: the levels below the full model (a level list of engine.levels, e.g.
    ("lookup", 2, 4)) and its lengths. Its `kind`: "hierarchy" (two exits: the lower drafts, the
    upper judges first), "exit" (one exit drafts), "lookup" (lookup drafts), or "plain"."""

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


class SpeedModel:
    def __init__(self, costs: CostModel, num_layers: int):
        self.costs, self.L = costs, num_layers

    def speedup(self, r: RoundShape, a_dv: float, a_vt: float) -> float:
        """Predicted tokens/s relative to plain steps; a_dv: draft->verify, a_vt: the exit just
        below the full model -> full model (layerskip: its exit -> full model)."""
        c, L, exits = self.costs, self.L, r.exits
        if r.kind == "exit":
            rate = exit_rate(c, L, exits[0], r.count, a_vt)
        elif r.kind == "hierarchy":
            rate = hierarchy_rate(c, L, exits[-2], exits[-1], r.count, r.verify_at, a_dv, a_vt)
        elif r.kind == "lookup":
            rate = lookup_rate(c, L, r.count, a_vt)
        else:
            return 1.0
        return rate / plain_rate(c, L)

    def curve(self, r: RoundShape, a_dv: float | None = None, points: int = 21) -> list[tuple[float, float]]:
        """(acceptance, predicted speedup) over acceptance 0..1 of the exit below the full model;
        a_dv None: the draft exit agrees with the verifier as often (one acceptance for both)."""
        xs = [i / (points - 1) for i in range(points)]
        return [(a, self.speedup(r, a if a_dv is None else a_dv, a)) for a in xs]

    def break_even(self, r: RoundShape, a_dv: float | None = None) -> float | None:
        """The lowest acceptance (as in `curve`) at which the prediction reaches plain speed; None if
        even acceptance 1 does not (the round costs more than it can commit)."""
        f = (lambda a: self.speedup(r, a if a_dv is None else a_dv, a) - 1.0)
        if f(1.0) < 0:
            return None
        lo, hi = 0.0, 1.0
        if f(lo) >= 0:
            return 0.0
        for _ in range(40):  # the prediction rises with acceptance: bisection
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
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
def plan_shape(kind: str, count: int, verify_at: int) -> RoundShape | None:
    """The fixed round a plan kind of explain.plans stands for; None for a plan with a level in a cheaper
    format ('full@q4', 'lookup -> full@q4'): this model has the exact format's costs only, so such a plan is
    measured, not estimated."""
    if "@" in kind:
        return None
    words = kind.split()
    if kind == "lookup":
        return RoundShape((LOOKUP,), count)
    if "->" in kind:  # "exit 2 -> exit 4"
        return RoundShape((int(words[1]), int(words[4])), count, verify_at)
    if words and words[0] == "exit":
        return RoundShape((int(words[1]),), count)
    return RoundShape()


def plan_acceptance(acceptance: dict) -> tuple[float | None, float | None]:
    """(a_dv, a_vt) of one plan's per-token acceptance: draft -> verify, and the level just below
    the full model -> full model (whichever level that is in this plan)."""
    to_full = [v for k, v in acceptance.items() if k.endswith("->target") and v is not None]
    return acceptance.get("draft->verify"), (to_full[0] if to_full else None)


def explain_plans(rows, costs: CostModel, num_layers: int, plain_tokens_per_s: float | None = None) -> list[dict]:
    """Each plan that ran (explain.plans.PlanRow) with the cost model's figures at its measured
    acceptance: predicted speedup over a plain step, its break-even acceptance, and the predicted
    tokens/s once the model's plain step is calibrated to the measured plain runs
    (`plain_tokens_per_s`; None: the cost model's own plain step)."""
    model = SpeedModel(costs, num_layers)
    scale = (plain_tokens_per_s / plain_rate(costs, num_layers)) if plain_tokens_per_s else 1.0
    out = []
    for row in rows:
        r = plan_shape(row.kind, row.count, row.verify_at)
        a_dv, a_vt = plan_acceptance(row.acceptance)
        item = {"kind": row.kind, "rounds": row.rounds, "new_tokens": row.new_tokens, "share": row.share,
                "measured_tokens_per_s": row.tokens_per_s, "a_dv": a_dv, "a_vt": a_vt,
                "acceptance": dict(row.acceptance),  # every pair the plan measured, by role
                "count": row.count, "verify_at": row.verify_at, "predicted": None, "break_even": None,
                "predicted_tokens_per_s": None}
        if r is None:
            pass  # a level in a cheaper format: measured only (plan_shape)
        elif r.kind == "plain":
            item.update(predicted=1.0, predicted_tokens_per_s=plain_rate(costs, num_layers) * scale)
        elif a_vt is not None:
            predicted = model.speedup(r, a_dv if a_dv is not None else a_vt, a_vt)
            item.update(predicted=predicted, break_even=model.break_even(r, a_dv),
                        predicted_tokens_per_s=predicted * plain_rate(costs, num_layers) * scale)
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
