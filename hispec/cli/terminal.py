"""The CLI's view of a Trace: ANSI colours, with model text made inert first."""

from __future__ import annotations

from hispec.runs.trace import LEGEND, Trace
from hispec.text import printable

_STYLE = {
    "drafted": "2",
    "tentative": "33",
    "accepted": "32",
    "copied": "35",
    "precision": "92",
    "verify-wrote": "1;33",
    "target-wrote": "36",
    "verify-rejected": "9;35",
    "target-rejected": "9;31",
    "discarded": "9;90",
}


def _paint(text: str, cls: str, color: bool) -> str:
    return f"\x1b[{_STYLE[cls]}m{text}\x1b[0m" if color else text


def render(trace: Trace, color: bool = True, show_rejected: bool = False) -> str:
    parts = []
    for token in trace:
        if token.rejected and not show_rejected:
            continue
        parts.append(_paint(printable(token.text), token.css_class, color))
    return "".join(parts)


def legend(color: bool = True, show_rejected: bool = False) -> str:
    shown = [(c, label) for c, label, _ in LEGEND
             if show_rejected or c not in ("verify-rejected", "target-rejected", "discarded")]
    return "  ".join(_paint(label, c, color) for c, label in shown if c not in ("drafted", "tentative"))
