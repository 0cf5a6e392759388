"""HTML views of a Trace. Model text is always escaped: it is shown as text, never as markup."""

from __future__ import annotations

import html
import os
import statistics

from hispec.engine.events import COMMITTED_STATES
from hispec.engine.levels import levels_by_role
from hispec.evaluation.bench import first_difference
from hispec.evaluation import pairs
from hispec.runs.metrics import pair_name, stats_rows
from hispec.runs.trace import LEGEND, Trace, TraceToken
from hispec.text import printable, sentence
from ui.labels import level_words, plan_words, run_words
from ui.token_life import drafter, life, who

COLORS = {
    "drafted": "#d9d9d9",
    "tentative": "#ffe08a",
    "accepted": "#9be79b",
    "copied": "#c3a6f0",
    "precision": "#7fd6c2",
    "verify-wrote": "#ffb347",
    "target-wrote": "#8ecdf5",
    "verify-rejected": "#f2b8e0",
    "target-rejected": "#f4a3a3",
    "discarded": "#e0e0e0",
}
# a tooltip's first words by the token's state: {drafter} the level that proposed it, {middle} the level just
# below the full model, each named by what it is (token_life: 'exit 4', 'the 4-bit full model')
_STATE_WORDS = {
    "drafted": "drafted by {drafter}, waiting",
    "tentative": "tentatively accepted by {middle}, waiting for the full model",
    "accepted": "drafted, accepted by the full model",
    "copied": "copied by the lookup level from earlier text (the prompt with its chat template, or the output so "
              "far), accepted by the full model",
    "precision": "drafted by {drafter} (the same weights in a cheaper format), accepted by the full model",
    "verify-wrote": "written by {middle}",
    "target-wrote": "written by the full model",
    "verify-rejected": "rejected by {middle}",
    "target-rejected": "rejected by the full model",
    "discarded": "discarded: generation ended inside the block",
}


def roles_of(levels: tuple | None) -> dict[str, int | str]:
    """The level of each role ("draft", "verify") of a run's list as written (RunRecord.spec: (2, 4),
    ('lookup', 'full@a8')): an exit's layer, or a cheaper format's spec."""
    return levels_by_role(tuple(levels)) if levels else {}


def _title(token: TraceToken, roles: dict[str, int], winner: TraceToken | None = None) -> str:
    """The tooltip: what the token is now, then its whole life (who wrote it, who judged it, in which
    rounds) and, for a rejected token, what the position holds instead."""
    d, v = (roles.get(role, "?") for role in ("draft", "verify"))
    # a level in a cheaper format is named by what it is, its verb says what it did: 'rejected by the 4-bit
    # full model', never 'by the intermediate verifier (...)'
    words = _STATE_WORDS[token.css_class].format(drafter=drafter(token.origin, d, v), middle=who("verify", d, v))
    story = life(token, d, v)
    if token.rejected and winner is not None and winner.serial != token.serial:
        story += f"; replaced by '{printable(winner.text)}' ({life(winner, d, v).partition(' in round')[0]})"
    return (f"token {token.index + 1} · id {token.token_id} · {words} · round {token.round} · {story} "
            "· click for the whole story")


def tokens_html(trace: Trace, levels: tuple | None = None, show_rejected: bool = True) -> str:
    """The coloured tokens of a run; `levels`: its list below the full model as written (RunRecord.spec)."""
    roles = roles_of(levels)
    winners = {t.index: t for t in trace if t.state in COMMITTED_STATES}
    spans = []
    for token in trace:
        if token.rejected and not show_rejected:
            continue
        text = html.escape(printable(token.text), quote=True)
        title = html.escape(_title(token, roles, winners.get(token.index)), quote=True)
        spans.append(f'<span class="hs-tok hs-{token.css_class}" title="{title}" data-s="{token.serial}" '
                     f'tabindex="0">{text}</span>')
    body = "".join(spans) or '<span class="hs-empty">The generated text appears here, token by token.</span>'
    return f'<div class="hs-text">{body}</div>'


def _level_legend(levels: tuple) -> dict[str, tuple[str, str]]:
    """The legend's (label, meaning) of the states a run's levels name (its list below the full model as
    written, RunRecord.spec): who proposes, and the level just below the full model by what it is ('exit 4',
    'the 4-bit full model'), never 'the intermediate verifier'; the colours stay the states'."""
    names = [level_words(x) for x in levels]
    proposers = " or ".join(names) if len(names) < 3 else ", ".join(names[:-1]) + " or " + names[-1]
    out = {"drafted": ("drafted", f"proposed by {proposers}, waiting to be judged")}
    if "lookup" not in levels:
        out["copied"] = ("copied", "not in this run: it has no lookup level")
    cheaper = [level_words(x) for x in levels if "@" in str(x)]
    out["precision"] = ("4-bit draft", f"drafted by {' or '.join(cheaper)} (the same weights in a cheaper format), "
                                       "accepted by the full model" if cheaper else
                        "not in this run: none of its levels runs the weights in a cheaper format")
    middle = roles_of(levels).get("verify")
    if middle is None:  # nothing between the proposer and the full model: these states cannot happen
        absent = f"not in this run: no level sits between {proposers} and the full model"
        return out | {cls: (label, absent) for cls, label, _ in LEGEND
                      if cls in ("tentative", "verify-wrote", "verify-rejected")}
    m = level_words(middle)
    short = m.removeprefix("the ")
    return out | {"tentative": ("tentative", f"accepted by {m}, waiting for the full model"),
                  "verify-wrote": (f"{short}'s token", f"written by {m} (a correction), committed"),
                  "verify-rejected": (f"rejected by {short}", f"draft thrown away early by {m}")}


def legend_html(counts: dict[str, int] | None = None, levels: tuple | None = None) -> str:
    """The colours' key; `levels`: the run's list below the full model as written (RunRecord.spec), once
    known: the states are then named by its levels (without, the roles' general words)."""
    named = _level_legend(tuple(levels)) if levels else {}
    items = []
    for cls, label, meaning in LEGEND:
        label, meaning = named.get(cls, (label, meaning))
        n = f" ({counts[cls]})" if counts else ""
        items.append(f'<span class="hs-legend-item"><span class="hs-tok hs-{cls}">{html.escape(label)}</span>'
                     f'<span class="hs-legend-text">{html.escape(meaning)}{n}</span></span>')
    return '<div class="hs-legend">' + "".join(items) + "</div>"


def message_html(text: str, kind: str = "error") -> str:
    return f'<div class="hs-msg hs-msg-{kind}">{html.escape(sentence(text))}</div>'


def depth_html(num_layers: int, draft_exit: int | None, verify_exit: int | None, method: str,
               caption: str | None = None, whole: tuple[str, ...] = ()) -> str:
    """The model's depth as a strip of layers, coloured by the level that runs them (the text's hues);
    `caption`: what runs, in words, in place of the exits' marks (a level list); `whole`: levels that run
    every layer in a cheaper format ('the 4-bit full model'), each a row of its own above the strip."""
    if not num_layers:
        return ""
    stages = []
    for layer in range(num_layers):
        if method == "autoregressive":
            stages.append("target")
        elif method == "layerskip":
            stages.append("draft" if layer < (draft_exit or 0) else "target")
        else:
            stages.append("draft" if layer < (draft_exit or 0) else "verify" if layer < (verify_exit or 0) else "target")
    names = {"draft": "draft exit", "verify": "intermediate exit", "target": "full model"}
    cells = [f'<span class="hs-layer hs-stage-{stage}" title="layer {layer + 1}: {names[stage]}"></span>'
             for layer, stage in enumerate(stages)]
    marks = []
    if method != "autoregressive" and draft_exit:
        marks.append(f"draft exit after layer {draft_exit}")
    if method == "hispec" and verify_exit:
        marks.append(f"verifier exit after layer {verify_exit}")
    marks.append(f"full model: {num_layers} layers")
    if caption:
        marks = [caption, f"{num_layers} layers"]
    key = "".join(f'<span class="hs-stage-key hs-stage-{stage}">{words}</span>' for stage, words in
                  (("draft", "draft exit"), ("verify", "intermediate exit"), ("target", "full model"))
                  if stage in stages)  # a key for the colours on the strip only
    rows = "".join('<div class="hs-layers">' + "".join(
        f'<span class="hs-layer hs-stage-precision" title="layer {layer + 1}: {html.escape(words)}"></span>'
        for layer in range(num_layers)) + "</div>" for words in whole)
    if whole:
        key = "".join(f'<span class="hs-stage-key hs-stage-precision">{html.escape(w.removeprefix("the "))} (every '
                      "layer)</span>" for w in whole) + key
    return (f'<div class="hs-depth">{rows}<div class="hs-layers">{"".join(cells)}</div>'
            f'<div class="hs-depth-caption">{html.escape(" · ".join(marks))} {key}</div></div>')


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def reason_words(reason: str | None) -> str:
    """A generation's finish reason as the page says it, in the stats' "stopped by" and the status."""
    return {"eos": "end of text", "max_new_tokens": "the token limit", "stop_string": "a stop string",
            "stopped": "Stop"}.get(reason or "", (reason or "").replace("_", " "))


def stats_html(s: dict, vs_plain: dict | None = None, stopped_by: str | None = None, levels=None,
               load: tuple[list[float] | None, str] | None = None, shared=None, machine=None) -> str:
    """The run's stats as a table (the CLI prints the same rows on one line); `vs_plain`: the
    measured ratio to plain decoding on this prompt (evaluation.compare.vs_plain), when taken;
    `stopped_by`: what ended it when the engine only knows it was stopped (the time limit, a Stop);
    `levels`: the run's level list, once known (a level in a cheaper format is then named as such); `load`:
    (the machine's 1, 5, 15-minute load averages, whose: 'now' or 'when recorded'), shown beside tokens/s;
    `shared`: the calls the run's passes shared with other visitors' (model.shared.Tally), when they did;
    `machine`: what every visitor's generations wrote while it ran (runs.record.MachinePace), shown when others
    wrote too."""
    plans = sorted((s.get("policy_choices") or {}).items(), key=lambda kv: -kv[1])
    page_words = {"stopped by": stopped_by or reason_words(s.get("finish_reason")),  # the page's words for these
                  "adaptive plans (rounds)": ", ".join(f"{plan_words(k)}: {n}" for k, n in plans)}
    rows = [(k, page_words.get(k, v)) for k, v in stats_rows(s, levels_by_role(tuple(levels or ())))]
    if vs_plain:
        rows.insert(3, ("speed vs plain decoding, measured", vs_plain_words(vs_plain)))
    if load and load[0]:
        rows.insert(3, (f"machine load ({load[1]})", load_words(load[0])))
    if shared is not None and shared.shared_calls:
        rows.insert(3, ("shared with other visitors", shared_words(shared)))
    if machine is not None and machine.others:
        rows.insert(3, ("your speed / the machine's", machine_words(machine)))
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="hs-stats">{body}</table>'


def load_words(averages: list[float]) -> str:
    """'1.9 (1 min) on 2 cores: busy', then SHARED_WORDS: how sharing the machine changes the figures."""
    cores = os.cpu_count() or 1
    busy = "busy" if averages[0] >= cores else "some load" if averages[0] >= cores / 2 else "quiet"
    return f"{averages[0]:.1f} (1 min) on {cores} cores: {busy}. {SHARED_WORDS}"


# how sharing the machine changes the figures (serving: visitors' generations hold the model together and their passes
# share calls, or take turns round by round where they cannot; the timing pairs give way to another visitor)
SHARED_WORDS = ("This machine is shared: visitors' generations run together, their passes carried by the same calls "
                "(each writes exactly what it would alone), and other work here slows every tokens/s alike, so a "
                "run's tokens/s is its speed beside the others; the timing pairs time the method and plain decoding "
                "back to back, each alone on the model, so the ratio to plain decoding moves much less (and they "
                "give way while another visitor runs or waits).")


def shared_words(tally) -> str:
    """'12 of its 40 calls carried other visitors' passes too (31 of theirs, 58 rows beside its 20; up to 3
    visitors in one call): its tokens/s is its speed beside them; alone it runs faster, and the machine serves
    more tokens in all.'"""
    rows = (f", {tally.others_rows} rows beside its {tally.own_rows}" if tally.own_rows or tally.others_rows else "")
    return (f"{tally.shared_calls} of its {tally.calls} calls carried other visitors' passes too "
            f"({tally.others_passes} of theirs{rows}; up to {tally.most_members} visitors in one call): its tokens/s "
            "is its speed beside them; alone it runs faster, and the machine serves more tokens in all.")


def machine_words(pace) -> str:
    """'14.2 / 38.5 tok/s over the 4.1 s from its first update to its end: this run's tokens, and every visitor's
    generations' together (up to 3 at once, ...)'."""
    mine, everyone = pace.own_tokens_per_s, pace.tokens_per_s
    if mine is None or everyone is None:
        return f"{pace.own_tokens} of the {pace.tokens} tokens the machine's generations wrote meanwhile"
    return (f"{mine:.1f} / {everyone:.1f} tok/s over the {pace.seconds:.1f} s from its first update to its end: this "
            f"run's tokens, and every visitor's generations' together (up to {pace.visitors} at once, this one "
            "included); the tokens / s row counts from the request's start, its set-up and prompt included")


def vs_plain_words(vs: dict) -> str:
    """'1.31× (1.15–1.47×, 3 pairs): 31% faster', or what the pairs cannot tell: the measured ratio
    with a range that holds (evaluation.pairs.summary) and what it lets one say."""
    if not vs.get("runs"):
        return vs.get("verdict") or "not measured"
    words = f"{pairs.range_words(vs)}: {vs['verdict']}"
    if vs.get("cut"):
        words += f" ({vs['cut']} of {vs['asked']} pairs cut short, not counted)"
    if vs.get("yielded"):
        words += f" ({yielded_words(vs)})"
    return words


def yielded_words(vs: dict) -> str:
    """'1 of 3 timing pairs measured; the other 2 gave way to a visitor waiting for the model' (the summary's
    "yielded": evaluation.compare.vs_plain)."""
    n = vs["yielded"]
    return (f"{vs.get('runs', 0)} of {vs['asked']} timing pairs measured; the other {n} gave way to a visitor "
            "waiting for the model")


def compare_table(rows: list[dict], sampling: bool = False, order: list[str] | None = None) -> str:
    """One row per method that ran: what it ran (levels, policy, lengths, the adaptive policy's plans),
    its speed (median of the repeats, with their range), its speed against plain decoding in words
    (pass by pass), its acceptance and full-model passes, and under greedy decoding whether its
    output equals plain decoding's; `order`: the order the runs went in."""
    ref = next((r for r in rows if r["method"] == "autoregressive"), rows[0])
    head = ("<tr><th>method</th><th>what ran</th><th>tokens</th><th>tokens / s (median, range)</th>"
            "<th>vs plain decoding</th><th>acceptance</th><th>full-model passes</th>"
            f"<th>identical to {html.escape(run_words(ref['method']))}</th></tr>")
    body = []
    for r in rows:
        same = ("n/a: sampled (same distribution, not the same text)" if sampling
                else "✓ same tokens" if r["token_ids"] == ref["token_ids"] else _difference(r, ref))
        runs = r.get("runs") or [r["tokens_per_s"]]
        spread = (f" <span class='hs-hint'>({min(runs):.2f}–{max(runs):.2f}, {len(runs)} runs)</span>"
                  if len(runs) > 1 else " <span class='hs-hint'>(1 run)</span>")
        acceptance = ", ".join(f"{html.escape(pair)} {v:.0%}"  # keyed by its levels in words (evaluation.compare)
                               for pair, v in (r.get("acceptance") or {}).items() if v is not None) or "–"
        ran = html.escape(r.get("ran") or r["method"])
        if r.get("plans"):
            plans = ", ".join(f"{plan_words(k)}: {n}" for k, n in sorted(r["plans"].items(), key=lambda kv: -kv[1]))
            ran += f"<br><span class='hs-hint'>plans (rounds): {html.escape(plans)}</span>"
        vs = ("the reference" if r["method"] == "autoregressive" else
              vs_plain_words(r["vs_plain"]) if r.get("vs_plain") else "– (plain decoding was not run)")
        body.append(f"<tr><td>{html.escape(run_words(r['method']))}</td><td>{ran}</td><td>{r['new_tokens']}</td>"
                    f"<td>{r['tokens_per_s']:.2f}{spread}</td><td>{html.escape(vs)}</td><td>{acceptance}</td>"
                    f"<td>{r.get('full_passes', '–')}</td><td>{same}</td></tr>")
    caption = ""
    if order:
        caption = ("<p class='hs-hint'>Run order: " + html.escape(" → ".join(map(run_words, order))) + ". Speeds are "
                   "medians of the repeats; the order reverses every other pass, so a machine that speeds up or "
                   "slows down favours no method. “vs plain decoding” is the median of each pass's ratio (the "
                   "two runs of a pass are neighbours in time); when its range holds 1× this prompt cannot tell "
                   "the two apart here.</p>")
    return f'<table class="hs-stats hs-compare">{head}{"".join(body)}</table>{caption}'


def _difference(row: dict, ref: dict) -> str:
    """Where a greedy output first differs from the reference, and why it may in half precision."""
    first = first_difference(ref["token_ids"], row["token_ids"])
    why = ""
    if row.get("dtype", "float32") != "float32":
        why = (f" ({html.escape(row['dtype'])}: passes over different numbers of tokens can round a near-tie "
               "differently; exactness holds in float32)")
    return f"✗ DIFFERENT from token {first + 1}{why}"


# ---- what if: timing-only runs, labelled on every view ------------------------------------
SYNTHETIC = "SYNTHETIC — timing only"


def _what_if_banner(rates: tuple[float, float]) -> str:
    return (f"<div class='hs-synthetic'><b>{SYNTHETIC}.</b> Each verdict was drawn at random: a draft was kept with "
            f"probability {rates[0]:.0%} by the verifier and {rates[1]:.0%} by the full model, whatever the model "
            "predicted. Every layer pass and head ran for real, so the timing is this machine's; the text is "
            "<b>not</b> the model's output.</div>")


def what_if_tokens(tokens: str, rates: tuple[float, float]) -> str:
    """A what-if run's coloured tokens under its label."""
    return _what_if_banner(rates) + f"<div class='hs-synthetic-text'>{tokens}</div>"


def what_if_stats(s: dict, rates: tuple[float, float], plain=None, takes: list = (), of: int = 1,
                  levels: tuple = ()) -> str:
    """A what-if run's speed against the plain run timed just before it, every row labelled.
    `s`: the synthetic run's stats; `plain`: its take's plain run (explain.what_if.PlainTimed);
    `takes`: the takes finished so far (TakeDone), of `of` asked for; `levels`: its list as written
    (its pairs are named by what the levels are)."""
    this = " (this take)" if of > 1 else ""
    rows = [(f"{SYNTHETIC}: tokens / s{this}", f"{s['tokens_per_s']:.2f}")]
    if plain is not None:
        rows.append((f"plain decoding, real, timed just before: tokens / s{this}", f"{plain.tokens_per_s:.2f}"))
        if plain.tokens_per_s:
            rows.append((f"{SYNTHETIC}: speed vs plain{this}", f"<b>{s['tokens_per_s'] / plain.tokens_per_s:.2f}×</b>"))
    ratios = sorted(t.ratio for t in takes if t.ratio)
    if of > 1 and ratios:
        mid = statistics.median(ratios)
        rows.append((f"{SYNTHETIC}: speed vs plain, median of {len(ratios)} of {of} takes",
                     f"<b>{mid:.2f}×</b> (range {ratios[0]:.2f}–{ratios[-1]:.2f}×)"))
        rows.append((f"{SYNTHETIC}: each take, synthetic / real plain tokens / s (tokens)",
                     html.escape(", ".join(f"{t.synthetic_tokens_per_s:.1f} / {t.plain_tokens_per_s:.1f} "
                                           f"({t.new_tokens})" for t in takes))))
    roles = roles_of(levels)
    middle = f" ({level_words(roles['verify']).removeprefix('the ')})" if "verify" in roles else ""
    rows += [(f"{SYNTHETIC}: acceptance {pair_name(k, roles)}", _pct(v)) for k, v in s["acceptance"].items()]
    rows += [(f"{SYNTHETIC}: full-model passes", str(s["full_passes"])),
             (f"{SYNTHETIC}: new tokens", str(s["new_tokens"]))]
    body = "".join(f"<tr><td>{html.escape(a)}</td><td>{b}</td></tr>" for a, b in rows)
    return (f"<table class='hs-stats hs-synthetic-stats' id='hs-what-if-table'>{body}</table>"
            f"<p class='hs-hint'>Asked for: {rates[0]:.0%} for the middle level's verdicts{html.escape(middle)}, "
            f"{rates[1]:.0%} for the full model's (per token, "
            "drawn independently). Both runs of a take ignore end-of-text and write the whole budget, so they are "
            "the same length. "
            + ("Each take is a real plain run, then the synthetic run with its own draws." if of > 1 else
               "One take is noisy (timings on a shared machine vary from run to run): more takes give a median "
               "and a range.")
            + "</p>")


def published_html(points: list[dict]) -> str:
    """Where the chart's stars come from: each published point with its source."""
    if not points:
        return ""
    items = "".join(
        f"<li>{html.escape(p['label'])}: {p['y']:.2f}× on {html.escape(p['hardware'])}, token acceptance "
        f"{p['acceptance']:.1%} of {p['drafts']} drafts (≈ {p['x']:.0%} per token) — "
        f"<a href='{html.escape(p['url'], quote=True)}' target='_blank' rel='noopener'>{html.escape(p['source'])}</a></li>"
        for p in points)
    return ("<details class='hs-published'><summary>★ Published LayerSkip points on the chart: sources</summary>"
            "<p class='hs-hint'>Larger models trained to exit early, on GPUs: they show where trained exits sit on "
            "the acceptance axis, not what this machine would do. Papers count every draft after a block's first "
            "mismatch as rejected; the chart's axis is per token, so each figure is converted for its number of "
            "drafts (a + a² + … + a^k = k × the published share).</p>"
            f"<ul>{items}</ul></details>")
