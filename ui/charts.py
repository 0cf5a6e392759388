"""Plotly figures from the stats' plain values (history rows and work counts)."""

from __future__ import annotations

import plotly.graph_objects as go

_LAYOUT = dict(height=260, margin=dict(l=40, r=10, t=36, b=36), legend=dict(orientation="h", y=-0.25),
               template="plotly_white")


def acceptance_figure(history: list[dict]) -> go.Figure:
    fig = go.Figure()
    rounds = [row["round"] for row in history]
    for key in ("draft->verify", "verify->target", "draft->target"):
        values = [row.get(key) for row in history]
        if any(v is not None for v in values):
            fig.add_trace(go.Scatter(x=rounds, y=values, mode="lines", name=key, hovertemplate="%{y:.0%}"))
    fig.update_layout(title="Acceptance rate by round (cumulative)", yaxis=dict(range=[0, 1.05], tickformat=".0%"),
                      **_LAYOUT)
    return fig


def speed_figure(history: list[dict], baselines: dict[str, float] | None = None) -> go.Figure:
    fig = go.Figure(go.Scatter(x=[row["t"] for row in history], y=[row["tokens_per_s"] for row in history],
                               mode="lines", name="this run"))
    for name, value in (baselines or {}).items():
        fig.add_hline(y=value, line_dash="dot", annotation_text=f"{name} {value:.1f}")
    fig.update_layout(title="Tokens per second", yaxis_rangemode="tozero", **_LAYOUT)
    return fig


def work_figure(work: dict) -> go.Figure:
    stages = [s for s in ("draft", "verify", "target") if s in work.get("by_stage", {})]
    fig = go.Figure()
    for fate, color in (("useful", "#3fa34d"), ("wasted", "#d64545"), ("pending", "#bbbbbb")):
        values = [work["by_stage"][s].get(fate, 0) for s in stages]
        if any(values):
            fig.add_trace(go.Bar(x=stages, y=values, name=fate, marker_color=color))
    fig.update_layout(title="Layer×token work by stage", barmode="stack", **_LAYOUT)
    return fig


def compare_figure(rows: list[dict]) -> go.Figure:
    fig = go.Figure(go.Bar(x=[r["method"] for r in rows], y=[r["tokens_per_s"] for r in rows],
                           text=[f"{r['tokens_per_s']:.1f}" for r in rows], textposition="auto"))
    fig.update_layout(title="Tokens per second, same prompt", **_LAYOUT)
    return fig
