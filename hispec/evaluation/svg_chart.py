"""A small static SVG bar chart of a benchmark report (for the README; no plotting dependency).

One group of bars per prompt set, one bar per method: the geometric mean of the method's
per-prompt ratios to the report's reference method (autoregressive: tokens/s over the reference's
on the same prompt; bench.summarise computes them), with a line at 1x and the value printed on each
bar. Reports written before the geometric mean existed show the ratio of medians instead.
"""

from __future__ import annotations

from html import escape

COLOURS = ["#6b7280", "#9ca3af", "#f59e0b", "#3b82f6", "#16a34a", "#db2777", "#0891b2", "#7c3aed", "#65a30d"]


def speedup_svg(report: dict, title: str | None = None, width: int = 760, height: int = 340) -> str:
    summary = report["summary"]
    sets = [s for s in summary if s != "all"] + ["all"]
    ref = summary["all"]["reference"]
    methods = list(summary["all"]["methods"])
    values = {(s, m): ratio(summary[s]["methods"][m], ref) if m != ref else 1.0
              for s in sets for m in methods if m in summary[s]["methods"]}
    geometric = any("vs_reference" in r for r in summary["all"]["methods"].values())
    top = max([1.0, *values.values()]) * 1.15
    left, right, upper, lower = 50, 10, 40, 70
    plot_w, plot_h = width - left - right, height - upper - lower
    group_w = plot_w / len(sets)
    bar_w = group_w * 0.8 / len(methods)

    def y(v: float) -> float:
        return upper + plot_h * (1 - v / top)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">'
           f'{escape(title or f"tokens/s relative to {ref}")}</text>',
           f'<text x="{width / 2}" y="34" text-anchor="middle" font-size="10" fill="#4b5563">'
           f'{"geometric mean over prompts of tokens/s / " + escape(ref) + " on the same prompt" if geometric else "ratio of median tokens/s"}'
           f'</text>']
    for tick in range(0, int(top) + 2):
        if tick <= top:
            out.append(f'<line x1="{left}" x2="{width - right}" y1="{y(tick):.1f}" y2="{y(tick):.1f}" '
                       f'stroke="{"#111" if tick == 1 else "#e5e7eb"}"/>'
                       f'<text x="{left - 6}" y="{y(tick) + 4:.1f}" text-anchor="end">{tick}x</text>')
    for gi, s in enumerate(sets):
        x0 = left + gi * group_w + group_w * 0.1
        for mi, m in enumerate(methods):
            if (s, m) not in values:
                continue
            v, x = values[(s, m)], x0 + mi * bar_w
            out.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{bar_w * 0.9:.1f}" height="{y(0) - y(v):.1f}" '
                       f'fill="{COLOURS[mi % len(COLOURS)]}"><title>{escape(s)} · {escape(m)}: {v:.2f}x</title></rect>'
                       f'<text x="{x + bar_w * 0.45:.1f}" y="{y(v) - 3:.1f}" text-anchor="middle" '
                       f'font-size="9">{v:.2f}</text>')
        out.append(f'<text x="{x0 + group_w * 0.4:.1f}" y="{y(0) + 15:.1f}" text-anchor="middle">{escape(s)}</text>')
    for mi, m in enumerate(methods):
        lx = left + mi * (plot_w / len(methods))
        out.append(f'<rect x="{lx:.1f}" y="{height - 25}" width="10" height="10" fill="{COLOURS[mi % len(COLOURS)]}"/>'
                   f'<text x="{lx + 14:.1f}" y="{height - 16}">{escape(m)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def ratio(method_summary: dict, ref: str) -> float:
    """The bar's value: the geometric mean of per-prompt ratios, else (older reports) the ratio of medians."""
    geo = (method_summary.get("vs_reference") or {}).get("geomean")
    return geo if geo is not None else method_summary["speedup_vs"].get(ref, 1.0)


def write_svg(report: dict, path: str, title: str | None = None) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(speedup_svg(report, title))
