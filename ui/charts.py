"""Plotly figures from the stats' plain values (history rows and work counts)."""

from __future__ import annotations

import plotly.graph_objects as go

from hispec.engine.levels import LOOKUP, levels_by_role
from hispec.explain.timeline import Lane, plain_pace, timeline_of
from hispec.runs.metrics import in_stack_order, pair_name
from ui.labels import level_words, run_words
from ui.render import COLORS

_LAYOUT = dict(height=300, margin=dict(l=55, r=10, t=36, b=50), legend=dict(orientation="h", y=-0.3),
               template="plotly_white")


def _not_applicable(fig: go.Figure, why: str) -> None:
    """An empty chart says why it is empty."""
    fig.add_annotation(text=f"n/a: {why}", showarrow=False, xref="paper", yref="paper", x=0.5, y=0.5,
                       font=dict(size=13, color="#777"))


def acceptance_figure(history: list[dict], levels: tuple = ()) -> go.Figure:
    """Each level pair's acceptance after every round, named as the stats name it (`levels`: the run's
    list; a level in a cheaper format is named as such: 'lookup → 4-bit full model')."""
    fig = go.Figure()
    rounds = [row["round"] for row in history]
    pairs = {key for row in history for key, v in row.items() if "->" in key and v is not None}
    roles = levels_by_role(tuple(levels or ()))
    for key in in_stack_order(pairs):
        values, name = [row.get(key) for row in history], pair_name(key, roles)
        if any(v is not None for v in values):
            fig.add_trace(go.Scatter(x=rounds, y=values, mode="lines", name=name,
                                     hovertemplate=f"{name}: " + "%{y:.0%} after round %{x}<extra></extra>"))
    if not fig.data:
        _not_applicable(fig, "nothing was drafted (autoregressive, or no round yet)")
    fig.update_layout(title="Acceptance per level pair (cumulative)", showlegend=True,
                      xaxis=dict(title="round"),
                      yaxis=dict(title="acceptance, per token", range=[0, 1.05], tickformat=".0%"), **_LAYOUT)
    return fig


def speed_figure(history: list[dict], baselines: dict[str, float] | None = None, synthetic: bool = False) -> go.Figure:
    """Tokens per second since the start (cumulative) and per round (instantaneous); `baselines`:
    name -> tokens/s drawn as lines; `synthetic`: a timing-only run, said in the title."""
    t = [row["t"] for row in history]
    fig = go.Figure(go.Scatter(x=t, y=[row["tokens_per_s"] for row in history], mode="lines", name="since the start",
                               hovertemplate="%{y:.1f} tokens/s at %{x:.1f} s<extra></extra>"))
    per_round, last_t, last_n = [], 0.0, 0
    for row in history:
        dt = row["t"] - last_t
        per_round.append((row["new_tokens"] - last_n) / dt if dt > 0 else None)
        last_t, last_n = row["t"], row["new_tokens"]
    if history:
        fig.add_trace(go.Scatter(x=t, y=per_round, mode="markers", name="per round", marker=dict(size=4, opacity=0.5),
                                 hovertemplate="%{y:.1f} tokens/s in the round ending at %{x:.1f} s<extra></extra>"))
    else:
        _not_applicable(fig, "no round yet")
    for name, value in (baselines or {}).items():
        fig.add_hline(y=value, line_dash="dot", annotation_text=f"{name} {value:.1f}")
    title = "SYNTHETIC acceptance (timing only): speed" if synthetic else "Speed"
    fig.update_layout(title=title, showlegend=True, xaxis=dict(title="seconds since the start"),
                      yaxis=dict(title="tokens / s", rangemode="tozero"), **_LAYOUT)
    return fig


def work_figure(work: dict, levels=()) -> go.Figure:
    """Layer-token work per level, each bar named by its level (the 4-bit model, exit 4, the full model),
    never by a role it may not have played (a 4-bit model that drafted is not a "verify" stage)."""
    stages = [s for s in ("draft", "verify", "target") if s in work.get("by_stage", {})]
    by_role = levels_by_role(tuple(levels or ()))
    names = [("full model" if s == "target" else level_words(by_role[s]).removeprefix("the ") if s in by_role else s)
             for s in stages]
    fig = go.Figure()
    for fate, color in (("useful", "#3fa34d"), ("wasted", "#d64545"), ("pending", "#bbbbbb")):
        values = [work["by_stage"][s].get(fate, 0) for s in stages]
        if any(values):
            fig.add_trace(go.Bar(x=names, y=values, name=fate, marker_color=color))
    if not fig.data:
        _not_applicable(fig, "no layer pass yet")
    fig.update_layout(title="Layer × token work by level", barmode="stack", showlegend=True,
                      xaxis=dict(title="level (the layers it runs)"), yaxis=dict(title="layer × token evaluations"),
                      **_LAYOUT)
    return fig


def compare_figure(rows: list[dict]) -> go.Figure:
    """Median tokens per second per method, with the range of its repeats as error bars."""
    runs = [r.get("runs") or [r["tokens_per_s"]] for r in rows]
    mid = [r["tokens_per_s"] for r in rows]
    names = [run_words(r["method"]) for r in rows]  # the page's names of the runs
    fig = go.Figure(go.Bar(x=names, y=mid, text=[f"{m:.1f}" for m in mid], textposition="auto",
                           name="median of the runs",
                           error_y=dict(type="data", symmetric=False, array=[max(x) - m for x, m in zip(runs, mid)],
                                        arrayminus=[m - min(x) for x, m in zip(runs, mid)])))
    fig.update_layout(title="Tokens per second, same prompt (bars: median; whiskers: range)", showlegend=True,
                      xaxis=dict(title="method"), yaxis=dict(title="tokens / s", rangemode="tozero"), **_LAYOUT)
    return fig


def why_figure(curves: dict[str, list[tuple[float, float]]], points: dict[str, tuple[float, float]],
               axis_label: str, published: list[dict] | None = None) -> go.Figure:
    """Predicted speedup over plain decoding against per-token acceptance, with the break-even line,
    this run's points (`points`: name -> (acceptance, speedup)) and published LayerSkip points
    (hispec.evaluation.published.load: other models on other hardware, each with its source)."""
    fig = go.Figure()
    if published:
        fig.add_trace(go.Scatter(
            x=[p["x"] for p in published], y=[p["y"] for p in published], mode="markers",
            name="published LayerSkip checkpoints (other models, GPUs)",
            marker=dict(size=9, symbol="star", color="#8a8a8a"),
            customdata=[[p["label"], p["acceptance"], p["drafts"], p["hardware"], p["source"]] for p in published],
            hovertemplate="%{customdata[0]}<br>%{y:.2f}× on %{customdata[3]}; token acceptance %{customdata[1]:.1%} "
                          "of %{customdata[2]} drafts ≈ %{x:.0%} per token<br>%{customdata[4]}<extra></extra>"))
    for name, curve in curves.items():
        fig.add_trace(go.Scatter(x=[a for a, _ in curve], y=[s for _, s in curve], mode="lines", name=name,
                                 hovertemplate="acceptance %{x:.0%}: %{y:.2f}× plain<extra></extra>"))
    for (name, (a, s)), symbol in zip(points.items(), ("circle", "diamond", "x", "square")):
        fig.add_trace(go.Scatter(x=[a], y=[s], mode="markers", name=name, marker=dict(size=11, symbol=symbol),
                                 hovertemplate=f"{name}: " + "%{y:.2f}× at %{x:.0%}<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="break-even: plain decoding (1×)",
                  annotation_position="bottom right")
    layout = dict(_LAYOUT, height=340, legend=dict(orientation="h", y=-0.3))
    fig.update_layout(title="Predicted speedup vs acceptance (cost model of this machine)",
                      xaxis=dict(title=axis_label, range=[0, 1], tickformat=".0%"),
                      yaxis=dict(title="× plain decoding (tokens/s ratio)", rangemode="tozero"), **layout)
    return fig


def race_figure(history: list[dict], plain: dict | None) -> go.Figure | None:
    """The run against plain decoding on one clock: tokens committed over the seconds since the start, this
    run's rounds beside plain decoding's line as its timing pairs measured it (its first token at their median
    prefill, then their median decode rate). None without a measured pair (nothing to race against)."""
    pace = plain_pace(plain)
    if not history or pace is None:
        return None
    first, rate = pace
    total = max(row["new_tokens"] for row in history)
    end = first + (total - 1) / rate
    run_t, run_n = [0.0] + [row["t"] for row in history], [0] + [row["new_tokens"] for row in history]
    ahead = next((t for t, n in zip(run_t, run_n) if t > first and n > 1 + (t - first) * rate + 1e-9), None)
    name = f"this run (ahead from {ahead:.2f} s)" if ahead is not None else "this run (never ahead)"
    fig = go.Figure(go.Scatter(x=run_t, y=run_n, mode="lines+markers", name=name, line_shape="hv",
                               hovertemplate="%{y} tokens at %{x:.2f} s<extra>this run</extra>"))
    fig.add_trace(go.Scatter(x=[0.0, first, end], y=[0, 1, total], mode="lines", name="plain decoding (measured)",
                             line=dict(dash="dot"), hovertemplate="%{y:.0f} tokens at %{x:.2f} s<extra>plain</extra>"))
    fig.update_layout(title="Race: tokens committed over time, against plain decoding", showlegend=True,
                      xaxis=dict(title="seconds since the start (this run's clock; plain: its pairs' medians)"),
                      yaxis=dict(title="tokens committed", rangemode="tozero"), **_LAYOUT)
    return fig


def position_figure(pairs) -> go.Figure:
    """Acceptance by position in the block: one line per level pair that judged (runs.record.PairAcceptance,
    named by its levels), x the position 1..k, y the share of its blocks whose token there survived (it and
    every token before it kept)."""
    fig = go.Figure()
    for pair in pairs:
        survival = pair.survival()
        if not survival:
            continue
        judged = [n for _, n in pair.by_position]
        fig.add_trace(go.Scatter(x=list(range(1, len(survival) + 1)), y=survival, mode="lines+markers",
                                 name=pair.words, customdata=judged,
                                 hovertemplate=f"{pair.words}: token %{{x}} survives in %{{y:.0%}} of blocks "
                                               "(%{customdata} judged there)<extra></extra>"))
    if not fig.data:
        _not_applicable(fig, "no level judged another's tokens (plain steps only)")
    fig.update_layout(title="Acceptance by position in the block", showlegend=True,
                      xaxis=dict(title="position in the block", dtick=1),
                      yaxis=dict(title="blocks whose token there survived", range=[0, 1.05], tickformat=".0%"),
                      **_LAYOUT)
    return fig


LANES_CAPTION = ("Where the time went: one lane per level of this run, each block one pass of that level's layers at its "
                 "measured length, laid end to end from its round's start (the gaps are the exit heads, token choice and "
                 "the engine's bookkeeping; lookup's copies run no layers and are marked), above plain decoding at the "
                 "pace its timing pairs measured.")
PREFILL_COLOR, PLAIN_COLOR = "#4a6d8c", "#9a9a9a"


def lanes_caption(record) -> str:
    """LANES_CAPTION, and for a run whose passes shared calls with other visitors', what the crossed blocks are."""
    shared = [b for _, b in timeline_of(record).shared]
    if not shared:
        return LANES_CAPTION
    passes = sum(b.beside for b in shared)
    rows, own = sum(b.beside_rows for b in shared), sum(b.tokens for b in shared)
    return (f"{LANES_CAPTION} Crossed blocks: {len(shared)} of this run's passes were carried by calls that held "
            f"other visitors' passes too ({passes} of theirs, {rows} of their rows beside its {own}); a shared call "
            "takes longer than this run's rows alone would, and serves everyone in it at once.")


def _lane_color(lane: Lane) -> str:
    """A level's hue on the page (ui.render.COLORS: the tokens it writes, the steps' edges)."""
    level = lane.level
    if level is None:
        return PLAIN_COLOR
    if level.kind == LOOKUP:
        return COLORS["copied"]
    if level.precision is not None:
        return COLORS["precision"]
    return {"draft": COLORS["accepted"], "verify": COLORS["verify-wrote"]}.get(level.name, COLORS["target-wrote"])


def lanes_figure(record) -> go.Figure:
    """The run's passes on one clock (explain.timeline): one lane per level, each pass of its layers a block,
    the prompt's prefill hatched, lookup's copies marked, and plain decoding's pace as the last lane when timing
    pairs measured it. A run whose events hold no pass timings says so instead."""
    timeline = timeline_of(record)
    fig = go.Figure()
    names = [lane.words for lane in timeline.lanes]
    prefill = [(lane, b) for lane in timeline.lanes if lane.level is not None for b in lane.blocks if b.prefill]
    for lane in timeline.lanes:
        blocks = [b for b in lane.blocks if lane.level is None or not b.prefill]
        if blocks:
            fig.add_trace(go.Bar(
                orientation="h", y=[lane.words] * len(blocks), x=[b.seconds for b in blocks],
                base=[b.start for b in blocks], name=lane.words,
                marker=dict(color=_lane_color(lane), line=dict(width=0)),  # a short pass stays visible
                customdata=[[b.round, f"{b.layers[0]}–{b.layers[1]}", b.tokens, b.seconds * 1e3] for b in blocks],
                hovertemplate="round %{customdata[0]}: layers %{customdata[1]} over %{customdata[2]} token(s), "
                              "%{customdata[3]:.2f} ms<extra>%{y}</extra>"))
        if lane.copies:
            fig.add_trace(go.Scatter(
                mode="markers", y=[lane.words] * len(lane.copies), x=[t for t, _, _ in lane.copies],
                name="lookup copies (no layer pass)", marker=dict(symbol="line-ns-open", size=14, color=_lane_color(lane),
                                                                  line=dict(width=3, color=_lane_color(lane))),
                customdata=[[r, n] for _, r, n in lane.copies],
                hovertemplate="round %{customdata[0]}: lookup copied %{customdata[1]} token(s)<extra></extra>"))
    for lane in timeline.lanes:  # a lane with nothing drawn (lookup that never copied) keeps its row
        if not lane.blocks and not lane.copies:
            fig.add_trace(go.Scatter(x=[0.0], y=[lane.words], mode="markers", marker=dict(opacity=0), showlegend=False,
                                     hoverinfo="skip"))
    if prefill:
        fig.add_trace(go.Bar(
            orientation="h", y=[lane.words for lane, _ in prefill], x=[b.seconds for _, b in prefill],
            base=[b.start for _, b in prefill], name="the prompt's prefill", marker=dict(
                color=PREFILL_COLOR, pattern=dict(shape="/")),
            customdata=[[f"{b.layers[0]}–{b.layers[1]}", b.tokens, b.seconds * 1e3] for _, b in prefill],
            hovertemplate="prefill: layers %{customdata[0]} over %{customdata[1]} prompt tokens, "
                          "%{customdata[2]:.2f} ms<extra>%{y}</extra>"))
    shared = timeline.shared
    if shared:  # drawn over their lanes' blocks: the passes other visitors' rows rode along with
        fig.add_trace(go.Bar(
            orientation="h", y=[lane.words for lane, _ in shared], x=[b.seconds for _, b in shared],
            base=[b.start for _, b in shared], name="shared with other visitors' passes", marker=dict(
                color="rgba(0,0,0,0)", line=dict(width=0), pattern=dict(shape="x", fgcolor="#333", solidity=0.25)),
            customdata=[[b.beside, b.beside_rows, b.tokens] for _, b in shared],
            hovertemplate="shared: %{customdata[0]} other visitor(s)' pass(es), %{customdata[1]} of their rows beside "
                          "its %{customdata[2]}<extra>%{y}</extra>"))
    if not timeline.timed:
        _not_applicable(fig, "no timings: this run's events hold no timed pass")
    # the legend (two rows) at the figure's foot, under the axis title, not over it
    layout = dict(_LAYOUT, height=190 + 36 * len(names), margin=dict(l=10, r=10, t=36, b=100),
                  legend=dict(orientation="h", yref="container", y=0, yanchor="bottom"))
    fig.update_layout(title="Passes by level, on the run's clock", showlegend=True, barmode="overlay",
                      xaxis=dict(title="seconds since the start (passes: measured; plain: its pairs' medians)",
                                 rangemode="tozero"),
                      yaxis=dict(title="level (its layers)", categoryorder="array", categoryarray=names[::-1],
                                 automargin=True), **layout)
    return fig
