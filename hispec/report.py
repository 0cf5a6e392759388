"""A self-contained HTML report of a benchmark: Plotly charts and the summary table."""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go


def _figures(report: dict) -> list[go.Figure]:
    summary = {k: v for k, v in report["summary"].items() if k != "all"}
    methods = report["methods"]
    figs = []
    speed = go.Figure()
    for m in methods:
        speed.add_trace(go.Bar(name=m, x=list(summary), y=[summary[s]["methods"].get(m, {}).get("tokens_per_s")
                                                            for s in summary]))
    speed.update_layout(title="Tokens per second (median) by prompt set", barmode="group", yaxis_title="tokens/s")
    figs.append(speed)
    ref = report["summary"]["all"]["reference"]
    ratio = go.Figure()
    for m in methods:
        ratio.add_trace(go.Bar(name=m, x=list(summary),
                               y=[summary[s]["methods"].get(m, {}).get("speedup_vs", {}).get(ref, 1.0) for s in summary]))
    ratio.add_hline(y=1.0, line_dash="dot")
    ratio.update_layout(title=f"Speed relative to {ref}", barmode="group", yaxis_title="ratio")
    figs.append(ratio)
    acc = go.Figure()
    for m in methods:
        levels = report["summary"]["all"]["methods"].get(m, {}).get("acceptance", {})
        if levels:
            acc.add_trace(go.Bar(name=m, x=list(levels), y=list(levels.values())))
    acc.update_layout(title="Acceptance per level (all sets)", barmode="group", yaxis_tickformat=".0%")
    figs.append(acc)
    return figs


def summary_table(report: dict) -> str:
    ref = report["summary"]["all"]["reference"]
    rows = []
    for set_name, s in report["summary"].items():
        for m, r in s["methods"].items():
            acc = ", ".join(f"{k} {v:.1%}" for k, v in r["acceptance"].items()) or "–"
            rows.append(f"<tr><td>{html.escape(set_name)}</td><td>{html.escape(m)}</td><td>{r['prompts']}</td>"
                        f"<td>{r['tokens_per_s']:.2f}</td><td>{r['speedup_vs'].get(ref, 1.0):.2f}×</td>"
                        f"<td>{html.escape(acc)}</td><td>{'yes' if r['outputs_equal'] else 'NO'}</td></tr>")
    head = (f"<tr><th>set</th><th>method</th><th>prompts</th><th>tokens/s (median)</th><th>vs {html.escape(ref)}</th>"
            f"<th>acceptance</th><th>output = {html.escape(ref)}</th></tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def write_html(report: dict, path: str) -> None:
    env = report["environment"]
    parts = [f"<h1>HiSpec benchmark</h1><p>{html.escape(str(env))}</p>", summary_table(report)]
    for i, fig in enumerate(_figures(report)):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))  # plotly.js embedded once
    style = "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:right}</style>"
    Path(path).write_text(f"<!doctype html><html><head><meta charset='utf-8'>{style}</head>"
                          f"<body>{''.join(parts)}</body></html>", encoding="utf-8")
