"""Why this speed: a run's measured speed against plain decoding, and the cost model's account of
it plan by plan, in numbers a reader can check against each other.

    measured      the ratio of pairs of runs (this method, plain decoding) on the same prompt and
                  length, timed alike (evaluation.compare.vs_plain): the fact
    plans         each plan that ran (explain.plans): rounds, tokens, share of the time, its
                  acceptance, its measured speed, the cost model's prediction at that acceptance
                  (an estimate, with the range the acceptance's 90% interval gives) and its own
                  break-even acceptance
    predicted     the whole run's estimate from its plans, beside the measured ratio; where the
                  two differ by more than the measured range, by how much and the usual reasons
                  (the prompt's prefill, the engine's bookkeeping outside layer passes, noise)
    sliders       the run's fixed shape at the sliders' acceptance: the estimate, and a what-if
                  run's measured (synthetic) result when one ran at these sliders

The cost model's plain step is calibrated to the measured plain runs: its predicted tokens/s are in
this machine's units at the time of the run.
"""

from __future__ import annotations

import statistics

from hispec.engine.planning.costs import CostModel
from hispec.engine.events import event_from_dict
from hispec.engine.planning.policy import adapts
from hispec.engine.planning.round import plain_rate
from hispec.explain.plans import plan_rows
from hispec.explain.speed_model import (
    Lanes,
    RoundShape,
    SpeedModel,
    acceptance_interval,
    explain_plans,
    measured_acceptance,
    pair_key,
    run_prediction,
)
from hispec.explain.what_if import gap

DEFINITION = ("Acceptance, everywhere on this page: of the tokens a level proposes, the share the level above keeps, "
              "counted in order up to the first rejection of each block (what follows a rejection is thrown away "
              "unjudged).")


def shape_of(settings: dict) -> RoundShape | None:
    """The fixed round of exits a run's levels describe (the sliders' curves are for it); None: no exit
    drafts in it (plain, lookup alone, lookup judged by one exit), or a level in a cheaper format (the
    sliders' curves are the exact format's)."""
    if any("@" in str(x) for x in settings.get("levels") or ()):
        return None
    shape = RoundShape.from_settings(settings)
    return shape if shape.kind in ("exit", "hierarchy") else None


def _interval_prediction(row, lanes: Lanes) -> tuple[float, float] | None:
    """The estimate's range over each measured pair's 90% interval (every pair at its low end, then at its
    high end); None for a plain step or a plan without an estimate."""
    r = row.round
    if r.plain:
        return None
    ends = []
    for side in (0, 1):
        bounds = {}
        for low, high in r.kind.pairs(r.top):
            key = pair_key(low, high)
            interval = acceptance_interval(row.acceptance.get(key), row.judged.get(key, 0))
            bounds[key] = None if interval is None else interval[side]
        ends.append(r.speedup(lanes, measured_acceptance(bounds)))
    if None in ends:
        return None
    return min(ends), max(ends)


def _differences(measured: dict, predicted: float, stats: dict) -> list[tuple[str, str]]:
    """Why a measured ratio and an estimate differ: the parts of a run the cost model leaves out."""
    gap = predicted / measured["median"] - 1 if measured["median"] else 0.0
    out = [("by", f"the estimate is {abs(gap):.0%} {'above' if gap > 0 else 'below'} the measured ratio")]
    wall = stats.get("wall_s") or 0.0
    if wall and stats.get("prefill_s"):
        out.append(("prefill", f"the prompt's prefill and first round took {stats['prefill_s'] / wall:.0%} of this "
                               "run; the measured ratio includes it (in both runs), the estimate counts decoding only"))
    if stats.get("layers_share") is not None:
        out.append(("bookkeeping", f"{1 - stats['layers_share']:.0%} of the run was outside layer passes (heads, "
                                   "token choice, the engine's own work): the estimate counts passes and heads only"))
    low, high = measured.get("spread") or (measured["low"], measured["high"])
    if measured["runs"] > 1:
        out.append(("noise", f"the measured pairs ranged over {low:.2f}–{high:.2f}×; identical runs on a busy "
                             f"machine differ by more, so the range stated is at least ±{measured.get('floor', 0):.0%}"))
    else:
        out.append(("noise", "one pair of runs is noisy: more pairs give a range"))
    return out


def _kept_costs_ms(run: dict) -> dict:
    """The pass costs a run kept at its end, as figures (its DoneEvent's costs_ms; {} when it kept none)."""
    done = next((e for e in reversed(run.get("events") or []) if e.get("type") == "done"), None)
    return (done or {}).get("costs_ms") or {}


def frozen_lanes(run: dict) -> dict[str, CostModel]:
    """The pass costs of each cheaper-format lane a run kept at its end (DoneEvent.costs_ms['lanes']): what
    its policy planned its 4-bit rounds with, by format ({} when it kept none)."""
    lanes = _kept_costs_ms(run).get("lanes") or {}
    return {fmt: CostModel.from_figures_ms(figures) for fmt, figures in lanes.items()}


def frozen_costs(run: dict, exits: tuple[int, ...] = ()) -> CostModel | None:
    """The pass costs a run kept at its end (DoneEvent.costs_ms: what its policy planned with), if they
    cover `exits`; None when it kept none (a fixed run on a model never timed) or they do not."""
    figures = _kept_costs_ms(run)
    if not figures:
        return None
    costs = CostModel.from_figures_ms(figures)
    return costs if costs.covers(tuple(exits)) else None


def explained_costs(run: dict, exits: tuple[int, ...] = ()) -> tuple[CostModel | None, str | None]:
    """The costs to explain a run with, and whose: ('run') its own (frozen_costs), else ('first') those
    its first explanation used, kept with it by keep_costs (a fixed run on a model never timed keeps
    none of its own); (None, None) when neither covers `exits`."""
    own = frozen_costs(run, exits)
    if own is not None:
        return own, "run"
    if run.get("costs_ms"):
        first = CostModel.from_figures_ms(run["costs_ms"])
        if first.covers(tuple(exits)):
            return first, "first"
    return None, None


def keep_costs(run: dict, costs: CostModel) -> None:
    """Keep with the run the costs its first explanation used: a later run or what-if, which refine the
    model's cost model, then cannot rewrite this run's explanation."""
    run["costs_ms"] = costs.figures_ms()


def _measured(run: dict) -> dict | None:
    measured = run.get("vs_plain")
    if measured is not None and not measured.get("runs"):  # asked for, every pair cut short: nothing measured
        measured = dict(measured, median=None)
    return measured


def _plain_decode(measured: dict | None) -> float | None:
    """Plain decoding's tokens/s after the first token, measured by the run's pairs (median)."""
    return statistics.median(measured["plain_decode_tokens_per_s"]) if measured and measured["median"] else None


def _plans(run: dict, lanes: dict, measured: dict | None) -> list[dict]:
    """The run plan by plan (explain_plans) with each estimate's range, on these lane costs."""
    settings = run["settings"]
    rows = plan_rows([event_from_dict(d) for d in run.get("events") or []], settings)
    plain_decode = _plain_decode(measured)
    plans = explain_plans(rows, lanes, settings.get("num_layers"), plain_decode, tuple(settings.get("levels") or ()))
    for plan, row in zip(plans, rows):
        plan["range"] = _interval_prediction(row, lanes) if None in lanes else None
    return plans


def plan_table(run: dict) -> list[dict]:
    """The plan table the page shows, as data (/generate's answer: `plans`): each plan that ran, its words,
    rounds, tokens, measured tokens/s (and ratio to plain decoding, when pairs measured it), its estimate
    with range, break-even and the gain expected when chosen, on the costs the run kept (every lane). A
    run that kept none (fixed rounds on a model never timed) has measurements only."""
    exact = frozen_costs(run)
    lanes = {} if exact is None else {None: exact, **frozen_lanes(run)}
    return _plans(run, lanes, _measured(run))


def speed_story(run: dict, costs: CostModel, sliders: tuple[float, float], what_if: dict | None = None,
                frozen: str | None = None) -> dict:
    """Every figure of "Why this speed" for a finished run (the page's kept run: stats, settings,
    events, vs_plain), at the sliders' acceptance (draft -> verify, -> full model). `frozen`: whose
    `costs` are ('run': the run's own, 'first': kept by its first explanation; see explained_costs);
    None: the model's cost model as it stands now."""
    settings, stats = run["settings"], run["stats"]
    L = settings.get("num_layers")
    measured = _measured(run)
    plans = _plans(run, {None: costs, **frozen_lanes(run)}, measured)
    model = SpeedModel(costs, L)
    predicted = run_prediction(plans)
    low = run_prediction([dict(p, predicted=p["range"][0]) if p.get("range") else p for p in plans])
    high = run_prediction([dict(p, predicted=p["range"][1]) if p.get("range") else p for p in plans])
    policy = settings.get("policy")
    story = {"definition": DEFINITION, "method": settings.get("method"), "policy": policy,
             "adapts": policy is not None and adapts(policy),
             "levels": tuple(settings.get("levels") or ()),
             "measured": measured, "plans": plans, "predicted": predicted,
             "predicted_range": (low, high) if low is not None and high is not None else None,
             "plain": {"measured_decode_tokens_per_s": _plain_decode(measured), "model_tokens_per_s": plain_rate(costs, L)},
             "differences": [], "shape": None, "costs_frozen": frozen}
    if (measured and measured["median"] and predicted is not None
            and not measured["low"] <= predicted <= measured["high"]):
        story["differences"] = _differences(measured, predicted, stats)
    shape = shape_of(settings)
    if shape is not None:
        story["shape"] = shape
        story["sliders"] = _at_sliders(model, shape, sliders, what_if)
        story.update(_chart(model, shape, sliders, plans, measured, predicted, story["sliders"]))
    return story


def _at_sliders(model: SpeedModel, shape: RoundShape, sliders, what_if: dict | None) -> dict:
    a_dv, a_vt = sliders
    out = {"a_dv": a_dv, "a_vt": a_vt, "predicted": model.speedup(shape, a_dv, a_vt),
           "break_even": model.break_even(shape, a_dv if shape.kind == "hierarchy" else None), "what_if": None,
           "what_if_gap": None}
    if what_if and tuple(what_if.get("rates") or ()) == (round(a_dv, 2), round(a_vt, 2)):
        out["what_if"] = what_if
        out["what_if_gap"] = gap(what_if, out["predicted"])
    return out


def _chart(model: SpeedModel, shape: RoundShape, sliders, plans, measured, predicted, at) -> dict:
    """The curves and points of the chart: the run's shape over acceptance, this run, the sliders."""
    a_dv, a_vt = sliders
    curves = {}
    upper = shape.exits[-1]
    if shape.kind == "hierarchy":
        curves[f"HiSpec, draft→verify {a_dv:.0%}"] = model.curve(shape, a_dv)
        curves["HiSpec, draft→verify = verify→full"] = model.curve(shape)
        single = RoundShape((upper,), count=shape.verify_at)  # its verifier drafting alone
        curves[f"LayerSkip at exit {upper}, {shape.verify_at} drafts"] = model.curve(single)
    else:
        curves[f"LayerSkip at exit {upper}, {shape.count} drafts"] = model.curve(shape)
    points = {}
    a_run = plans[0]["a_vt"] if plans else None  # the plan that took the most time
    if a_run is not None:
        if predicted is not None:
            points["this run: estimate"] = (a_run, predicted)
        if measured and measured["median"]:
            points["this run: measured"] = (a_run, measured["median"])
    points["sliders: estimate"] = (a_vt, at["predicted"])
    if at["what_if"] and at["what_if"].get("median"):
        points["sliders: what-if, measured (synthetic)"] = (a_vt, at["what_if"]["median"])
    axis = ("acceptance verify → full model, per token" if shape.kind == "hierarchy"
            else "acceptance exit → full model, per token")
    return {"curves": curves, "points": points, "axis": axis}
