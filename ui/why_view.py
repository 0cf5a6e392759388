"""'Why this speed' as HTML: the run's measured speed, its plans, and the estimates beside them
(hispec.explain.why.speed_story), every modelled figure labelled as an estimate."""

from __future__ import annotations

import html

from hispec.evaluation import pairs
from hispec.runs.record import words as level_name
from hispec.engine.planning.round import DRAFTS_ON_MEANS
from ui.render import SYNTHETIC

OFF_BY = 0.25  # the cost model's plain step further than this from the measured one is flagged
# what the run's estimate row says instead of a figure when the plain step is flagged (issue 58)
TOO_BUSY = "too busy to estimate: the pass costs were timed at another speed than this run's"


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def _x(value, spread=None) -> str:
    if value is None:
        return "–"
    text = f"{value:.2f}×"
    if spread:
        text += f" ({spread[0]:.2f}–{spread[1]:.2f}×)"
    return text


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def _plan_acceptance(acceptance: dict) -> str:
    """Each level pair measured, bottom first, by its levels in words ({"lookup → 4-bit full model": 0.8})."""
    return ", ".join(f"{pair} {_pct(rate)}" for pair, rate in acceptance.items() if rate is not None) or "–"


def _break_even(p: dict) -> str:
    """'23% lookup → 4-bit full model': the acceptance of the plan's swept pair at which it pays, its other
    pairs held at what it measured; 'never' when even 100% does not; '–' for a plain step or no estimate."""
    if p["break_even_pair"] is None or p["predicted"] is None:
        return "–"
    if p["break_even"] is None:
        return f"never ({p['break_even_pair']})"
    if p["break_even"] == 0:  # e.g. a copy judged by the 4-bit model: its own token and drafts carry the round
        return f"any {p['break_even_pair']} (pays even at 0%)"
    return f"{_pct(p['break_even'])} {p['break_even_pair']}"


def plans_table(story: dict, ids: tuple[str, str] = ("hs-why-plans", "hs-plan-key")) -> str:
    """The plan table (story["plans"]: explain.why.plan_table's rows); `ids`: the table's and its key's."""
    rows = []
    for p in story["plans"]:
        measured = p["measured_tokens_per_s"]
        estimate = p["predicted_tokens_per_s"]
        model_rate = "–" if estimate is None else f"{estimate:.1f} <span class='hs-hint'>estimate</span>"
        rows.append(
            f"<tr><td>{html.escape(p['words'])}</td><td>{p['rounds']}</td><td>{p['new_tokens']}</td>"
            f"<td>{_pct(p['share'])}</td><td>{html.escape(_plan_acceptance(p['acceptance']))}</td>"
            f"<td>{'–' if measured is None else f'{measured:.1f}'}</td><td>{model_rate}</td>"
            f"<td>{_x(p['predicted'], p.get('range'))}</td><td>{_x(p.get('expected_gain'))}</td>"
            f"<td>{html.escape(_break_even(p))}</td></tr>")
    head = ("<tr><th>plan</th><th>rounds</th><th>tokens</th><th>share of the time</th><th>acceptance</th>"
            "<th>tokens / s, measured</th><th>tokens / s, cost model</th><th>× plain, estimate at this acceptance</th>"
            "<th>× plain, expected when chosen</th><th>break-even acceptance</th></tr>")
    key = ("Plan key: “a → b → full model”: a proposes, b judges what a proposed, the full model decides. "
           "Break-even: the acceptance of the pair named at which the plan's estimate reaches a plain step's, its "
           "other pairs held at what it measured. Expected when chosen: the adaptive policy's estimate at the moment "
           "it picked the plan (median over its rounds), from the acceptance it had measured until then.")
    if any(p["drafts_on"] for p in story["plans"]):
        key += " " + DRAFTS_ON_MEANS[0].upper() + DRAFTS_ON_MEANS[1:] + "."
    return (scrolling(f"<table class='hs-stats' id='{ids[0]}'>{head}{''.join(rows)}</table>")
            + f"<p class='hs-hint' id='{ids[1]}'>{html.escape(key)}</p>")


def synthetic_plans_html(plans: list[dict], take: int, rates: tuple[float, float]) -> str:
    """A what-if take's own plan table (explain.why.plan_table of its synthetic run's record: the real run's
    table type), so the plans the synthetic run used are seen, labelled synthetic."""
    if not plans:
        return ""
    head = (f"<p class='hs-hint' id='hs-what-if-plans-head'><b>{html.escape(SYNTHETIC)}</b>: the plans of take {take}'s "
            f"synthetic run, verdicts drawn at {rates[0]:.0%} / {rates[1]:.0%}; its acceptance is the drawn one, not "
            "the model's.</p>")
    return head + plans_table({"plans": plans}, ("hs-what-if-plans-table", "hs-what-if-plan-key"))


def scrolling(table: str) -> str:
    """A wide table in a box that scrolls sideways, saying so on a narrow screen (assets/app.css)."""
    return ("<div class='hs-scroll'>" + table + "</div><p class='hs-scroll-hint'>↔ This table is wider than the "
            "screen: swipe it sideways to see every column.</p>")


def _measured_row(story: dict) -> str:
    m = story["measured"]
    if not m and story.get("pairs_asked"):  # asked for, but the run ended early (a Stop, the time limit)
        return (f"<tr><td>this run, measured</td><td>–</td><td>not measured: the run was stopped before its "
                f"{story['pairs_asked']} timing pair(s) against plain decoding (a run cut short is never timed)</td>"
                "<td>–</td></tr>")
    if not m:
        return ("<tr><td>this run, measured</td><td>–</td><td>not measured: set “pairs” above 0 to time plain "
                "decoding on this prompt</td><td>–</td></tr>")
    if not m.get("runs") and m.get("yielded"):
        return (f"<tr><td>this run, measured</td><td>–</td><td>not measured: its {m['yielded']} timing pair(s) gave "
                "way to a visitor waiting for the model (the machine is shared)</td><td>–</td></tr>")
    if not m.get("runs"):
        return (f"<tr><td>this run, measured</td><td>–</td><td>not measured: {m.get('asked', 0)} pair(s) asked for, "
                "every one cut short (a Stop or the server's time limit), and a cut pair is never counted</td>"
                "<td>–</td></tr>")
    cut = f", {m['cut']} more cut short and not counted" if m.get("cut") else ""
    if m.get("yielded"):
        cut += f", {m['yielded']} more not run: they gave way to a visitor waiting for the model"
    pairs = f"{m['runs']} pair{'s' if m['runs'] > 1 else ''} of runs, {m.get('new_tokens', '?')} tokens each{cut}"
    # every pair the run measured (not only its main plan's): lookup may have written most tokens
    return (f"<tr><td>this run, measured against plain decoding ({pairs}, prefill included in both)</td>"
            f"<td>{html.escape(_plan_acceptance(story.get('run_acceptance') or {}))}</td>"
            f"<td><b>{html.escape(pairs_words(m))}</b></td><td>measured</td></tr>")


def _what_if_row(w: dict, story: dict) -> str:
    """The what-if's result on the run's own level list (synthetic verdicts at the sliders' acceptance)."""
    a_dv, a_vt = w["rates"]
    names = " → ".join(level_name(x).removeprefix("the ") for x in story.get("levels", ()))
    return (f"<tr><td>this run's levels ({html.escape(names)}), what-if run at the sliders ({w['takes']} takes, "
            f"timing only)</td><td>{_pct(a_dv)} middle level, {_pct(a_vt)} → full</td>"
            f"<td>{_x(w['median'], (w['low'], w['high']) if w['takes'] > 1 else None)}</td>"
            "<td>measured, SYNTHETIC verdicts</td></tr>")


def pairs_words(m: dict) -> str:
    """'1.31× (1.15–1.47×): 31% faster'; with too few pairs or a range holding 1×, no percentage."""
    if m["runs"] < pairs.MIN_PAIRS:
        return f"{m['median']:.2f}×, {m['verdict']}"
    return f"{_x(m['median'], (m['low'], m['high']))}: {m['verdict']}{spread_words(m)}"


def spread_words(m: dict) -> str:
    """The pairs' own spread beside a range widened to its floor (evaluation.pairs.summary): '; the range is
    the floor, median ±20% (identical runs differ that much here); the 3 pairs themselves: 1.93–2.41×'."""
    spread, floor = m.get("spread"), m.get("floor")
    if not spread or not floor:
        return ""
    low, high = spread
    floored = m["low"] < low or m["high"] > high
    head = (f"; the range is the floor, median ±{floor:.0%} (identical runs differ that much here)" if floored
            else f"; the range is the pairs' own spread (wider than the ±{floor:.0%} floor)")
    return f"{head}; the {m['runs']} pairs themselves: {low:.2f}–{high:.2f}×" if floored else head


def why_html(story: dict) -> str:
    rows = [_measured_row(story)]
    busy = bool(plain_step_flag(story["plain"]))  # the costs were timed at another speed: no estimate of the run
    if story["measured"] and story["predicted"] is not None:
        figure = (f"– ({TOO_BUSY})" if busy else _x(story['predicted'], story['predicted_range']))
        rows.append(f"<tr><td>this run, estimated from its plans (decoding only)</td><td>–</td>"
                    f"<td>{figure}</td><td>estimate</td></tr>")
    plan = story.get("slider_plan")
    if plan is not None:
        at = story["sliders"]
        words = html.escape(f"{plan['words']} ({plan['round']})")
        acc = (f"{_pct(at['a_dv'])} {plan['low_pair']}, {_pct(at['a_vt'])} {plan['full_pair']}" if at["has_low"]
               else f"{_pct(at['a_vt'])} {plan['full_pair']}")
        rows.append(f"<tr><td>{words}, at the sliders</td><td>{acc}</td><td><b>{_x(at['predicted'])}</b></td>"
                    "<td>estimate</td></tr>")
        w = at["what_if"]
        if w and w.get("median") is not None:
            rows.append(f"<tr><td>{words}, what-if run at the sliders ({w['takes']} takes, timing only)</td><td>{acc}</td>"
                        f"<td>{_x(w['median'], (w['low'], w['high']) if w['takes'] > 1 else None)}</td>"
                        "<td>measured, SYNTHETIC verdicts</td></tr>")
            rows.append(f"<tr><td colspan='4' class='hs-hint' id='hs-what-if-gap'>{what_if_gap_html(w, at['what_if_gap'])}"
                        "</td></tr>")
        be = at["break_even"]
        held = f" ({plan['low_pair']} held at {_pct(at['a_dv'])})" if at["has_low"] else ""
        rows.append(f"<tr><td>break-even of the same plan{html.escape(held)}</td>"
                    f"<td>{_pct(be) if be is not None else 'never'} {html.escape(plan['full_pair'])}</td><td>1.00×</td>"
                    "<td>estimate</td></tr>")
    if story.get("what_if"):  # a run with no fixed shape: its own list replayed at the sliders
        rows.append(_what_if_row(story["what_if"], story))
    table = scrolling("<table class='hs-stats' id='hs-why-table'><tr><th>figure</th><th>acceptance</th>"
                      f"<th>× plain decoding</th><th>kind</th></tr>{''.join(rows)}</table>")
    notes = ""
    if story["differences"] and not busy:
        items = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in story["differences"])
        notes = ("<p>The estimate lies outside the measured range. By how much, and why they may differ:</p>"
                 f"<ul class='hs-why-notes'>{items}</ul>")
    if any(p["predicted"] is None and p["new_tokens"] for p in story["plans"]):
        notes += ("<p class='hs-hint'>A plan shown '–' has no estimate: the run kept no pass costs for one of its "
                  "levels, or no formula covers its shape (a copy judged by two levels). It is measured all the "
                  "same, and exact: the full model decides every token.</p>")
    plain = story["plain"]
    calibration = ""
    if plain["measured_decode_tokens_per_s"]:
        calibration = (f" A plain step here: {plain['measured_decode_tokens_per_s']:.1f} tokens/s measured after the "
                       f"first token (the cost model alone: {plain['model_tokens_per_s']:.1f}); the estimates in "
                       "tokens/s are scaled to the measured one.")
    sharing = (f"<p class='hs-sharing' id='hs-why-sharing'>{html.escape(story['sharing'])}</p>"
               if story.get("sharing") else "")  # how sharing the machine changed the figures (explain.why)
    return (f"<div class='hs-why'>{_recorded_words(story)}<p class='hs-definition'>{html.escape(story['definition'])}</p>"
            f"<p class='hs-speed-source'>{html.escape(speed_source_words(story))}</p>{plain_step_flag(story['plain'])}"
            f"{sharing}<p><b>Plan by plan</b> ({html.escape(_policy_words(story))}):</p>{plans_table(story)}"
            f"<p><b>The run against plain decoding</b>:</p>{table}{notes}"
            f"<p class='hs-hint'>Estimates: the cost model of this machine (pass and head costs timed for this model"
            f"{_costs_words(story)}) at the acceptance shown, the same formulas the adaptive policy plans with; the range "
            f"is that of the acceptance's 90% interval. Measured figures are the facts; estimates explain them.{calibration}"
            "</p></div>")


def plain_step_flag(plain: dict) -> str:
    """A flag when the cost model's plain step is more than a quarter off plain decoding measured on the run's
    pairs (a busy machine moves one and not the other): by how much, and that the estimates use the measured
    one. '' when they agree within a quarter or nothing was measured."""
    measured, model = plain["measured_decode_tokens_per_s"], plain["model_tokens_per_s"]
    if not measured or not model or abs(model / measured - 1) <= OFF_BY:
        return ""
    off = model / measured - 1
    words = (f"The cost model's plain step ({model:.1f} tokens/s) is {abs(off):.0%} {'above' if off > 0 else 'below'} "
             f"plain decoding measured on this run's pairs ({measured:.1f} tokens/s): the machine ran at another speed "
             "when its pass costs were timed (a shared machine's load moves it). So the page does not estimate the run "
             "as a whole: the machine is too busy to estimate. The plans' estimates below use the measured one for "
             "tokens/s; their × figures are ratios within the cost model, and hold only as far as its costs kept "
             "their proportions.")
    return f"<p class='hs-msg hs-msg-warn' id='hs-plain-flag'>{html.escape(words)}</p>"


def _not_measured(story: dict) -> str:
    """Why a run has no plain timing, in words."""
    m = story.get("measured")
    if m and m.get("yielded") and not m.get("runs"):
        return f"its {_n(m['yielded'], 'timing pair')} gave way to a visitor waiting for the model"
    if m and m.get("asked"):
        return f"every one of its {_n(m['asked'], 'timing pair')} was cut short"
    if story.get("pairs_asked"):
        return f"the run was stopped before its {_n(story['pairs_asked'], 'timing pair')}"
    return "no timing pairs were asked for"


def speed_source_words(story: dict) -> str:
    """Where the run's speed came from, in a sentence or two: which plans wrote how many tokens in how
    much time, which of them beat plain decoding measured here (with no plain timing, that it was not
    measured: no ratio to the cost model's plain step), and, when the exits' hierarchy barely ran, that it
    did and where to see it."""
    plans = [p for p in story["plans"] if p["new_tokens"]]
    if not plans:
        return ""
    plain = story["plain"]["measured_decode_tokens_per_s"]
    parts, faster = [], []
    for p in sorted(plans, key=lambda p: -p["new_tokens"]):
        rate = p["measured_tokens_per_s"]
        seconds = p["new_tokens"] / rate if rate else 0.0
        parts.append(f"{p['words']} wrote {_n(p['new_tokens'], 'token')} in {seconds:.1f} s")
        if not p["plain"] and rate and plain and rate > plain:
            faster.append(f"{p['words']} ({rate / plain:.2f}×)")
    text = "Where the speed came from: " + "; ".join(parts) + ". "
    if not plain:
        text += (f"Against plain decoding: not measured ({_not_measured(story)}), so no plan's speed is set against "
                 "it here (the plan table's estimates are the cost model's own, labelled so).")
    else:
        text += (f"Faster than plain decoding measured here: {', '.join(faster)}." if faster
                 else "No plan beat plain decoding measured here in this run.")
    rounds = sum(p["rounds"] for p in story["plans"])
    hierarchy = sum(p["rounds"] for p in story["plans"] if p["hierarchy"])
    # the list has a hierarchy of exits
    two_exits = sum(lv.kind == "exit" for lv in story.get("levels", ())) >= 2
    if story.get("adapts") and two_exits and rounds and hierarchy / rounds < 0.1:
        text += (f" The exits' hierarchy (draft exit, then verifier exit, then the full model) ran in {hierarchy} of "
                 f"{rounds} rounds: to watch it at work, pick the Teaching preset (fixed rounds).")
    return text


def _recorded_words(story: dict) -> str:
    """A recorded run replayed (a lesson): whose figures these are, said first."""
    where = story.get("recorded_where")
    if not where:
        return ""
    return (f"<p class='hs-recorded'><b>A recorded run, replayed</b>: every figure below, measured or estimated, is "
            f"that of {html.escape(where)} when it was recorded (its own timing pairs and pass costs), not this "
            "machine's now. The sliders re-estimate it on those costs.</p>")


def _costs_words(story: dict) -> str:
    if story.get("costs_frozen") == "run":
        return (", as this run's policy had them at its end: kept with the run, so a later run or what-if does not "
                "change this explanation")
    if story.get("costs_frozen") == "first":
        return (", as they stood when this run was first explained (it kept none of its own): kept with the run "
                "from then on, so a later run or what-if does not change this explanation")
    return ", as they stand now: this run kept none of its own"


def _policy_words(story: dict) -> str:
    if story.get("adapts"):
        return "the adaptive policy chose a plan every round from the acceptance measured so far and these costs"
    return "fixed rounds: one plan throughout"


def _split_words(split: dict) -> str:
    return (f"set-up {split['setup_s']:.2f}, prefill {split['prefill_s']:.2f}, layer passes {split['passes_s']:.2f}, "
            f"other {split['other_s']:.2f} (heads, token choice, bookkeeping)")


def what_if_gap_html(w: dict, gap: dict | None) -> str:
    """The what-if's time split and the plain rate it was measured against, then its ratio as the
    estimate's scope is approached step by step, and what is left: unexplained."""
    syn, plain = w.get("synthetic_split"), w.get("plain_split")
    if not syn or not plain:
        return "This what-if run kept no time split (an older run): run it again for the numbers."
    words = (f"Where the what-if's time went (median of its takes, seconds). Synthetic run: {_split_words(syn)}. "
             f"Plain run: {_split_words(plain)}; plain decoding ran at {w['plain_tokens_per_s']:.1f} tokens/s. ")
    if gap is None:
        return html.escape(words + "There is no estimate to set against it.")
    steps = (f"Against plain decoding: whole runs {gap['whole']:.2f}×, decoding only (set-up and prefill left out) "
             f"{gap['decoding']:.2f}×, layer passes only (the other work left out too) {gap['passes']:.2f}×; "
             f"the estimate, {gap['estimate']:.2f}×, counts layer passes and heads at this page's pass costs. ")
    left = gap["unexplained"]
    if left is None:
        rest = ""
    elif left == 0:
        rest = ("Unexplained: nothing; the estimate lies between the last two, the part the engine's other work "
                "(which the runs do not split further) accounts for.")
    else:
        rest = (f"Unexplained: {abs(left):.0%}, the estimate being {'above' if left > 0 else 'below'} both of the "
                "last two (the page's pass costs against these passes as timed).")
    return html.escape(words + steps + rest)
