"""A self-contained HTML report of a benchmark or a sweep: Plotly charts and summary tables.

`figures(report)` and `table_html(report)` take either kind of report (a sweep's has
kind == "sweep"); the app's Benchmark tab shows a saved report with them.
"""

from __future__ import annotations

import html
from pathlib import Path

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from hispec.evaluation.sweep import LABELS, SHORT


def is_sweep(report: dict) -> bool:
    return report.get("kind") == "sweep"


def figures(report: dict) -> list[go.Figure]:
    """The report's charts: bars per method for a benchmark, heatmaps per grid for a sweep."""
    return sweep_figures(report) if is_sweep(report) else _figures(report)


def table_html(report: dict) -> str:
    return sweep_table(report) if is_sweep(report) else summary_table(report)


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
    sets = list(summary) + ["all"]
    for m in methods:
        ratio.add_trace(go.Bar(name=m, x=sets, y=[_ratio(report["summary"][s]["methods"].get(m), ref) for s in sets]))
    ratio.add_hline(y=1.0, line_dash="dot")
    ratio.update_layout(title=f"Speed relative to {ref}: geometric mean of per-prompt ratios", barmode="group",
                        yaxis_title="ratio")
    figs.append(ratio)
    acc = go.Figure()
    for m in methods:
        levels = report["summary"]["all"]["methods"].get(m, {}).get("acceptance", {})
        if levels:
            acc.add_trace(go.Bar(name=m, x=list(levels), y=list(levels.values())))
    acc.update_layout(title="Acceptance per level (all sets)", barmode="group", yaxis_tickformat=".0%")
    figs.append(acc)
    return figs


def _ratio(r: dict | None, ref: str) -> float | None:
    """The geometric mean of a method's per-prompt ratios to the reference (older reports: of medians)."""
    if r is None:
        return None
    geo = (r.get("vs_reference") or {}).get("geomean")
    return geo if geo is not None else r["speedup_vs"].get(ref, 1.0)


def _equal_cell(r: dict) -> str:
    if r["outputs_equal"]:
        return "yes"
    if "outputs_differ" not in r:  # reports written before the count existed
        return "NO"
    return f"NO ({r['outputs_differ']} of {r['prompts']})"


def _geo_cell(r: dict, key: str = "vs_reference") -> str:
    v = r.get(key) or {}
    if v.get("geomean") is None:  # no shared prompt with the reference, or a report from before the figure
        return "–"
    return f"{v['geomean']:.2f}× ({v['min']:.2f}–{v['max']:.2f})"


def _number(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def summary_table(report: dict) -> str:
    ref = report["summary"]["all"]["reference"]
    rows = []
    for set_name, s in report["summary"].items():
        for m, r in s["methods"].items():
            acc = ", ".join(f"{k} {v:.1%}" for k, v in r["acceptance"].items()) or "–"
            rows.append(f"<tr><td>{html.escape(set_name)}</td><td>{html.escape(m)}</td><td>{r['prompts']}</td>"
                        f"<td>{r['tokens_per_s']:.2f}</td><td>{r['speedup_vs'].get(ref, 1.0):.2f}×</td>"
                        f"<td>{_geo_cell(r)}</td>"
                        f"<td>{_number(r.get('decode_tokens_per_s'), '.2f')}</td>"
                        f"<td>{_geo_cell(r, 'vs_reference_decode')}</td>"
                        f"<td>{_number(r.get('ttft_s') and r['ttft_s'] * 1e3, '.1f')}</td>"
                        f"<td>{html.escape(acc)}</td><td>{_equal_cell(r)}</td></tr>")
    ref_name = html.escape(ref)
    head = (f"<tr><th>set</th><th>method</th><th>prompts</th><th>tokens/s end to end (median)</th>"
            f"<th>vs {ref_name} (of medians)</th><th>vs {ref_name}, geometric mean per prompt (range)</th>"
            f"<th>tokens/s decode-only (median)</th><th>vs {ref_name} decode-only, geometric mean (range)</th>"
            f"<th>time to first token, ms (median)</th>"
            f"<th>acceptance</th><th>output = {ref_name}</th></tr>")
    note = ("<p>End to end counts the prompt's evaluation (time from the start to the last token); decode-only "
            "counts the tokens after the first over the time after it. \"–\": a report made before the time to "
            "first token was recorded.</p>")
    return f"<table>{head}{''.join(rows)}</table>{note}"


def _point(axes: tuple[str, str], cell: dict) -> str:
    return ", ".join(f"{SHORT[k]}={cell[k]}" for k in axes)


def _grid_matrix(grid: dict, cells: list[dict], value) -> list[list]:
    a, b = grid["rows_axis"], grid["cols_axis"]
    at = {(c[a], c[b]): c for c in cells}
    return [[value(at[(r, c)]) if (r, c) in at else None for c in grid["cols"]] for r in grid["rows"]]


def _cell_texts(grid: dict, matrix: list[list], fmt: str) -> list[list[str]]:
    """Each cell's figure, 'skipped' for an invalid point, blank for one not measured yet."""
    skipped = {(s[grid["rows_axis"]], s[grid["cols_axis"]]) for s in grid.get("skipped", [])}
    return [["skipped" if (r, c) in skipped else "" if v is None else fmt.format(v)
             for c, v in zip(grid["cols"], row)] for r, row in zip(grid["rows"], matrix)]


def _markers(fig: go.Figure, grid: dict, summary: dict, legend: bool = True, **where) -> None:
    """The best point (a gold frame) and the default point (a cyan frame) on a heatmap; both are
    hollow, so the cell's figure stays readable, and both can mark the same cell."""
    a, b = grid["rows_axis"], grid["cols_axis"]
    best, default = summary["best"], summary["default"]
    if default["on_grid"]:
        value = default.get("speedup_geomean") or default.get("speedup")
        speed = f" {value:.2f}×" if value is not None else ""
        fig.add_trace(go.Scatter(x=[str(default[b])], y=[str(default[a])], mode="markers",
                                 name=f"default ({_point((a, b), default)}){speed}", hoverinfo="name",
                                 legendgroup="default", showlegend=legend,
                                 marker=dict(symbol="square-open", size=36, color="#00c8d0", line=dict(width=3))),
                      **where)
    if best is not None:
        fig.add_trace(go.Scatter(x=[str(best[b])], y=[str(best[a])], mode="markers",
                                 name=f"best ({_point((a, b), best)}) {best.get('speedup_geomean') or best['speedup']:.2f}×",
                                 hoverinfo="name",
                                 legendgroup="best", showlegend=legend,
                                 marker=dict(symbol="square-open", size=48, color="gold", line=dict(width=4))),
                      **where)


def sweep_figures(report: dict) -> list[go.Figure]:
    """Per grid: the speedup heatmap (best point and defaults marked) and acceptance heatmaps."""
    figs = []
    ref = report["summary"].get("reference", {})
    for name, grid in report["grids"].items():
        summary = report["summary"].get("grids", {}).get(name)
        if summary is None:
            continue
        a, b = grid["rows_axis"], grid["cols_axis"]
        cells = summary["cells"]
        x, y = [str(c) for c in grid["cols"]], [str(r) for r in grid["rows"]]
        speed = _grid_matrix(grid, cells, lambda c: c.get("speedup_geomean") or c["speedup"])  # geometric mean
        text = _cell_texts(grid, speed, "{:.2f}×")
        tps = _grid_matrix(grid, cells, lambda c: c["tokens_per_s"])
        fig = go.Figure(go.Heatmap(
            x=x, y=y, z=speed, text=text, texttemplate="%{text}", customdata=tps, colorscale="RdBu", zmid=1.0,
            colorbar=dict(title="speedup"), name="speedup",
            hovertemplate=f"{LABELS[a]} %{{y}}<br>{LABELS[b]} %{{x}}<br>%{{z:.2f}}× vs {report.get('reference')}"
                          "<br>%{customdata:.2f} tok/s<extra></extra>"))
        _markers(fig, grid, summary)
        fixed = ", ".join(f"{k}={v}" for k, v in grid["fixed"].items())
        d = summary["default"]
        off = "" if d["on_grid"] else f"; default ({_point((a, b), d)}) not on this grid"
        ref_tps = f"{ref['tokens_per_s']:.2f} tok/s" if ref.get("tokens_per_s") else "n/a"
        fig.update_layout(title=f"HiSpec speedup (geometric mean per prompt) vs {report.get('reference')} ({ref_tps}) over {LABELS[a]} × "
                                f"{LABELS[b]} ({fixed}{off})",
                          xaxis=dict(title=LABELS[b], type="category"), yaxis=dict(title=LABELS[a], type="category"),
                          legend=dict(orientation="h", y=-0.2), template="plotly_white")
        figs.append(fig)
        levels = list(dict.fromkeys(k for c in cells for k in c["acceptance"]))
        if levels:
            acc = make_subplots(rows=1, cols=len(levels), subplot_titles=[f"acceptance {k}" for k in levels],
                                horizontal_spacing=0.12)
            for i, level in enumerate(levels, 1):
                z = _grid_matrix(grid, cells, lambda c, level=level: c["acceptance"].get(level))
                acc.add_trace(go.Heatmap(
                    x=x, y=y, z=z, zmin=0, zmax=1, colorscale="Viridis", showscale=i == len(levels), name=level,
                    text=_cell_texts(grid, z, "{:.0%}"), texttemplate="%{text}",
                    colorbar=dict(title="accepted", tickformat=".0%"),
                    hovertemplate=f"{LABELS[a]} %{{y}}<br>{LABELS[b]} %{{x}}<br>{level} %{{z:.1%}}<extra></extra>"),
                    row=1, col=i)
                _markers(acc, grid, summary, legend=i == 1, row=1, col=i)
                acc.update_xaxes(title_text=LABELS[b], type="category", row=1, col=i)
                acc.update_yaxes(title_text=LABELS[a], type="category", row=1, col=i)
            acc.update_layout(title=f"Acceptance per level over {LABELS[a]} × {LABELS[b]}", template="plotly_white",
                              legend=dict(orientation="h", y=-0.25))
            figs.append(acc)
    return figs


def sweep_table(report: dict) -> str:
    s = report["summary"]
    ref = s.get("reference", {})
    ref_tps = f"{ref['tokens_per_s']:.2f}" if ref.get("tokens_per_s") else "–"
    parts = [f"<p>Reference {html.escape(str(report.get('reference')))}: {ref_tps} tokens/s (median of "
             f"{ref.get('prompts', 0)} prompts); {report.get('max_new_tokens')} new tokens per prompt."
             f"{'' if report.get('complete') else ' <b>Incomplete run</b>: the figures cover the prompts done.'}</p>"]
    for name, grid in report["grids"].items():
        g = s.get("grids", {}).get(name)
        if g is None:
            continue
        a, b = grid["rows_axis"], grid["cols_axis"]
        fixed = ", ".join(f"{k}={v}" for k, v in grid["fixed"].items())
        rows = []
        for c in g["cells"]:
            marks = [m for m, hit in (("best", g["best"] and (c[a], c[b]) == (g["best"][a], g["best"][b])),
                                      ("default", (c[a], c[b]) == (g["default"][a], g["default"][b]))) if hit]
            acc = ", ".join(f"{k} {v:.1%}" for k, v in c["acceptance"].items()) or "–"
            value = c.get("speedup_geomean") or c["speedup"]  # the geometric mean of per-prompt ratios
            speed = f"{value:.2f}×" if value is not None else "–"
            rows.append(f"<tr><td>{c[a]}</td><td>{c[b]}</td><td>{c['prompts']}</td><td>{c['tokens_per_s']:.2f}</td>"
                        f"<td>{speed}</td><td>{html.escape(acc)}</td>"
                        f"<td>{'yes' if c['outputs_equal'] else 'NO'}</td><td>{' '.join(marks)}</td></tr>")
        for sk in grid.get("skipped", []):
            rows.append(f"<tr><td>{sk[a]}</td><td>{sk[b]}</td><td colspan='6'>skipped: "
                        f"{html.escape(sk['reason'])}</td></tr>")
        head = (f"<tr><th>{LABELS[a]}</th><th>{LABELS[b]}</th><th>prompts</th><th>tokens/s (median)</th>"
                f"<th>vs {html.escape(str(report.get('reference')))}</th><th>acceptance</th>"
                f"<th>output = reference</th><th></th></tr>")
        parts.append(f"<h3>{html.escape(name)} sweep ({html.escape(fixed)})</h3><table>{head}{''.join(rows)}</table>")
    return "".join(parts)


def write_html(report: dict, path: str) -> None:
    env = report["environment"]
    title = "HiSpec sweep" if is_sweep(report) else "HiSpec benchmark"
    parts = [f"<h1>{title}</h1><p>{html.escape(str(env))}</p>", table_html(report)]
    for i, fig in enumerate(figures(report)):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))  # plotly.js embedded once
    style = "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:right}</style>"
    Path(path).write_text(f"<!doctype html><html><head><meta charset='utf-8'>{style}</head>"
                          f"<body>{''.join(parts)}</body></html>", encoding="utf-8")
