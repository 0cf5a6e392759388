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
    sliders       one plan of the run (the one that committed the most tokens, or the one picked),
                  in whatever lanes it ran, at the sliders' acceptance (the pair below the full
                  model, the pair into it): the estimate, its curve, its break-even, and a what-if
                  run's measured (synthetic) result when one ran at these sliders

The cost model's plain step is calibrated to the measured plain runs: its predicted tokens/s are in
this machine's units at the time of the run.
"""

from __future__ import annotations

import statistics

from hispec.engine.planning.round import Round, plain_rate
from hispec.explain.plans import PlanRow, plan_rows
from hispec.explain.speed_model import (
    Lanes,
    SliderModel,
    acceptance_interval,
    explain_plans,
    measured_acceptance,
    plan_acceptance,
    run_prediction,
)
from hispec.explain.what_if import gap, replay_of
from hispec.runs.record import RunRecord, pair_words, words

DEFINITION = ("Acceptance, everywhere on this page: of the tokens a level proposes, the share the level above keeps, "
              "counted in order up to the first rejection of each block (what follows a rejection is thrown away "
              "unjudged).")


def slider_plan(rows: list[PlanRow], pick: str | None = None) -> PlanRow | None:
    """The plan the sliders vary: the one named `pick` (its words), else the one that committed the most tokens;
    None when every round was a plain step."""
    candidates = [row for row in rows if not row.round.plain]
    chosen = [row for row in candidates if row.round.kind.words == pick]
    # most tokens first; at a tie, the plan with more pairs to vary
    return (chosen or sorted(candidates, key=lambda row: (-row.new_tokens, -len(row.pairs))) or [None])[0]


def _interval_prediction(row, lanes: Lanes) -> tuple[float, float] | None:
    """The estimate's range over each measured pair's 90% interval (every pair at its low end, then at its
    high end); None for a plain step or a plan without an estimate."""
    r = row.round
    if r.plain:
        return None
    ends = []
    for side in (0, 1):
        bounds = {}
        for pair in r.kind.pairs(r.top):
            interval = acceptance_interval(row.acceptance.get(pair), row.judged.get(pair, 0))
            bounds[pair] = None if interval is None else interval[side]
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


def explained_costs(record: RunRecord, exits: tuple[int, ...] = ()) -> tuple[Lanes | None, str | None]:
    """The costs to explain a run with, every lane, and whose: the run's own ('run'), or those its first
    explanation fetched ('first', kept in the record by RunRecord.with_costs); (None, None) when it has none
    that cover `exits`."""
    exact = record.costs.get(None)
    if exact is None or not exact.covers(tuple(exits)):
        return None, None
    return record.costs, record.costs_whose


def _measured(record: RunRecord) -> dict | None:
    measured = None if record.vs_plain is None else dict(record.vs_plain)
    if measured is not None and not measured.get("runs"):  # asked for, every pair cut short: nothing measured
        measured = dict(measured, median=None)
    return measured


def _plain_decode(measured: dict | None) -> float | None:
    """Plain decoding's tokens/s after the first token, measured by the run's pairs (median)."""
    return statistics.median(measured["plain_decode_tokens_per_s"]) if measured and measured["median"] else None


def _plans(record: RunRecord, rows: list[PlanRow], lanes: Lanes, measured: dict | None) -> list[dict]:
    """The run plan by plan (explain_plans) with each estimate's range, on these lane costs."""
    plans = explain_plans(rows, lanes, record.num_layers, _plain_decode(measured))
    for plan, row in zip(plans, rows):
        plan["range"] = _interval_prediction(row, lanes) if None in lanes else None
    return plans


def plan_table(record: RunRecord) -> list[dict]:
    """The plan table the page shows, as data (/generate's answer: `plans`): each plan that ran, its words,
    rounds, tokens, measured tokens/s (and ratio to plain decoding, when pairs measured it), its estimate
    with range, break-even and the gain expected when chosen, on the costs the run kept (every lane). A
    run that kept none (fixed rounds on a model never timed) has measurements only."""
    lanes = record.costs if record.costs_whose == "run" else {}
    return _plans(record, plan_rows(record), lanes, _measured(record))


def speed_story(record: RunRecord, lanes: Lanes, sliders: tuple[float, float], what_if: dict | None = None,
                frozen: str | None = None, pick: str | None = None) -> dict:
    """Every figure of "Why this speed" for a finished run, at the sliders' acceptance (the pair below the
    full model, the pair into it) for the plan they vary (`pick`, by its words; else the plan that committed
    the most tokens). `lanes`: the pass costs of every lane it is explained with; `frozen`: whose ('run': the
    run's own, 'first': fetched by its first explanation; see explained_costs), None: the model's now."""
    stats, L = record.stats, record.num_layers
    measured = _measured(record)
    rows = plan_rows(record)
    plans = _plans(record, rows, lanes, measured)
    predicted = run_prediction(plans)
    low = run_prediction([dict(p, predicted=p["range"][0]) if p.get("range") else p for p in plans])
    high = run_prediction([dict(p, predicted=p["range"][1]) if p.get("range") else p for p in plans])
    story = {"definition": DEFINITION, "method": record.method, "policy": record.policy, "adapts": record.adapts,
             "levels": record.levels, "measured": measured, "plans": plans, "predicted": predicted,
             "predicted_range": (low, high) if low is not None and high is not None else None,
             "plain": {"measured_decode_tokens_per_s": _plain_decode(measured),
                       "model_tokens_per_s": plain_rate(lanes[None], L)},
             "differences": [], "slider_plan": None, "costs_frozen": frozen, "pairs_asked": record.pairs_asked,
             "run_acceptance": {p.words: p.rate for p in record.pairs},
             "recorded_where": record.recorded_where, "sharing": sharing_words(record)}
    if (measured and measured["median"] and predicted is not None
            and not measured["low"] <= predicted <= measured["high"]):
        story["differences"] = _differences(measured, predicted, stats)
    row = slider_plan(rows, pick)
    if row is not None:
        model = SliderModel(lanes, L)
        at = _at_sliders(model, row.round, sliders, what_if)
        if at is not None:
            story["slider_plan"] = _slider_words(row.round)
            story["sliders"] = at
            story.update(_chart(model, row, sliders, plans, measured, predicted, at))
    return story


def sharing_words(record: RunRecord) -> str | None:
    """How sharing the machine changed this run's figures, in words; None for a run that had the machine alone
    (no other visitor's pass in its calls, no other visitor's tokens while it ran) or that was not served."""
    tally, pace = record.shared, record.machine
    shared = tally is not None and tally.shared_calls > 0
    if not shared and not (pace is not None and pace.others):
        return None
    parts = []
    if pace is not None and pace.others and pace.own_tokens_per_s is not None:
        parts.append(f"from its first update to its end, it wrote {pace.own_tokens_per_s:.1f} tokens/s and the machine "
                     f"{pace.tokens_per_s:.1f} for every visitor's generations together (up to {pace.visitors} at once)")
    if shared:
        parts.append(f"{tally.shared_calls} of its {tally.calls} calls carried other visitors' passes too "
                     f"({tally.others_rows} of their rows beside its {tally.own_rows})")
    said = "This run shared the machine: " + "; ".join(parts) + (
        ". Its own tokens/s is its share, slower than alone, while the machine serves more in all; its tokens are "
        "the ones it writes alone (a row's result never depends on the rows beside it).")
    pairs = (record.vs_plain or {}).get("shared_calls")
    if pairs:
        said += (f" Its timing pairs against plain decoding ran beside other visitors too ({pairs} of their calls "
                 "shared): both sides of each pair timed under the same sharing, so their ratio moves less than either "
                 "speed, but it is not the ratio alone.")
    elif pairs == 0:
        said += " Its timing pairs against plain decoding ran with no other visitor's pass in their calls."
    return said


def slider_choices(record: RunRecord | None) -> tuple[list[str], str | None]:
    """The plans the sliders can vary (every plan of the run but a plain step, by its words as the plan table
    names them, most time first) and the one they vary unless another is picked (the most tokens)."""
    if record is None:
        return [], None
    rows = plan_rows(record)
    row = slider_plan(rows)
    return [r.kind.words for r in rows if not r.round.plain], None if row is None else row.kind.words


def slider_replay(record: RunRecord, pick: str | None = None):
    """The what-if of the plan the sliders vary (explain.what_if.replay_of): its pairs are the sliders' own."""
    row = slider_plan(plan_rows(record), pick) if record is not None else None
    return replay_of(record, None if row is None else row.round)


def slider_values(record: RunRecord, pick: str | None = None) -> tuple[float | None, float | None, dict]:
    """The sliders' start for a finished run: the measured acceptance of the plan they vary, below the full
    model and into it, and their names (the plan's own pairs, in words)."""
    row = slider_plan(plan_rows(record), pick)
    if row is None:
        return None, None, {}
    a_low, a_full = plan_acceptance(row.acceptance)
    return a_low, a_full, _slider_words(row.round)


def _slider_words(r: Round) -> dict:
    """The plan the sliders vary, in words, and the pairs each slider sets."""
    pairs = r.kind.pairs(r.top)
    into_full = [p for p in pairs if p[1] == r.top]
    below = [p for p in pairs if p[1] != r.top]
    return {"words": r.kind.words, "round": r.words, "full_pair": pair_words(into_full[0]) if into_full else None,
            "low_pair": pair_words(below[0]) if below else None}


def _at_sliders(model: SliderModel, r: Round, sliders, what_if: dict | None) -> dict | None:
    a_low, a_full = sliders
    predicted = model.speedup(r, a_low, a_full)
    if predicted is None:  # no formula covers this plan: no slider estimate (its row says so)
        return None
    has_low = any(high != r.top for _, high in r.kind.pairs(r.top))
    out = {"a_dv": a_low, "a_vt": a_full, "predicted": predicted,
           "break_even": model.break_even(r, a_low if has_low else None), "what_if": None, "what_if_gap": None,
           "has_low": has_low}
    if what_if and tuple(what_if.get("rates") or ()) == (round(a_low, 2), round(a_full, 2)):
        out["what_if"] = what_if
        out["what_if_gap"] = gap(what_if, out["predicted"])
    return out


def _chart(model: SliderModel, row: PlanRow, sliders, plans, measured, predicted, at) -> dict:
    """The curves and points of the chart: the plan over acceptance into the full model, this run, the sliders."""
    a_low, a_full = sliders
    r = row.round
    names = _slider_words(r)
    curves = {}
    if at["has_low"]:
        curves[f"{names['words']}, {names['low_pair']} {a_low:.0%}"] = model.curve(r, a_low)
        curves[f"{names['words']}, both pairs alike"] = model.curve(r)
        judge = r.judges[-1]  # the level just below the full model, drafting alone
        alone = Round(judge, r.top, max(r.verify_at, 1), (), 1)
        curve = model.curve(alone)
        if curve:
            curves[f"{words(judge)} drafting alone, {alone.count} a round"] = curve
    else:
        curves[f"{names['words']}, {r.count} a round"] = model.curve(r)
    curves = {name: curve for name, curve in curves.items() if curve}
    points = {}
    a_run = plan_acceptance(row.acceptance)[1]
    if a_run is not None:
        if predicted is not None:
            points["this run: estimate"] = (a_run, predicted)
        if measured and measured["median"]:
            points["this run: measured"] = (a_run, measured["median"])
    points["sliders: estimate"] = (a_full, at["predicted"])
    if at["what_if"] and at["what_if"].get("median"):
        points["sliders: what-if, measured (synthetic)"] = (a_full, at["what_if"]["median"])
    return {"curves": curves, "points": points, "axis": f"acceptance {names['full_pair']}, per token"}
