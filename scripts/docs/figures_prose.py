"""Figures quoted in the prose of README.md and of the pages in docs/, outside their generated blocks,
and where each comes from.

A figure is a ratio (1.53×, 5x), a percentage (37%, ±5%), a speed or a time (57 tok/s, 13.7 ms) or a
range of them (0.91–0.93×, 11-75×); ratios and percentages are written without a space before their
sign (so "batch 2 × 128" is not one). Every figure in the prose (README.md and docs/*.md without
their generated blocks) must be one of:

- **in a block beside it**: the same text appears in the generated block just before it or just
  after it in its section (a ``##`` or ``###`` heading); blocks are regenerated from their
  artifacts, so once an artifact gives another figure the prose's copy no longer matches and is
  reported (a copy that drifts onto another figure of the same block still passes: ties are stricter);
- **shown by its section's artifact**: a section that retells one recorded run (``SHOWN``: the page's
  walkthrough and ``assets/walkthrough.json``) quotes text the artifact holds;
- **tied** (``TIES``, in figures_quotes.py): a quote of the prose, the artifacts it comes from and a function that computes
  the figures' text from them: a figure the artifacts no longer give is reported;
- **untied** (``UNTIED``): listed with why it has no artifact to check (a goal, a setting, another
  project's published figure, an earlier release's measurement whose artifact is not kept). The list
  is the pages' debt: each entry must still be on a page, so it can only shrink, and a new
  figure in the prose fails the check until it is put in a block, tied or listed here.

``problems(text)`` lists every figure that is none of these, every tie whose artifacts give another
figure, and every listed quote no page holds any more; ``python scripts/figures.py --check``
fails on any of them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from figures_quotes import SHOWN, TIES, UNTIED, load

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(  # a generated block (scripts/figures.py)
    r"<!-- figures: (?P<name>[\w.-]+) -->\n(?P<body>.*?)<!-- /figures -->", re.S)
FIGURE = re.compile(r"(?<![\w.])±?\d+(?:\.\d+)?(?:[–-]\d+(?:\.\d+)?)?(?:×|x\b|%| ?(?:tok/s|tokens/s|ms)\b)")
UNIT = re.compile(r" ?(?:tok/s|tokens/s|ms)$")
HEADING = re.compile(r"^#{2,3} .*$", re.M)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


# ---- the check ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Figure:
    text: str
    line: int
    section: str
    at: int  # where it starts in the README with its whitespace squashed (as quotes are written)
    near: frozenset  # the figures of the generated blocks just before and just after it in its section


def prose_figures(readme: str) -> tuple[list[Figure], dict[str, set[str]]]:
    """Every figure outside the generated blocks, and by section the figures its blocks hold."""
    blocks = [(m.start(), m.end(), frozenset(FIGURE.findall(m["body"]))) for m in BLOCK.finditer(readme)]
    headings = [(m.start(), m.group(0)) for m in HEADING.finditer(readme)]

    def section(at: int) -> str:
        return next((h for start, h in reversed(headings) if start <= at), "")

    def near(at: int) -> frozenset:
        mine = section(at)
        before = [b for b in blocks if b[1] <= at and section(b[0]) == mine][-1:]
        after = [b for b in blocks if b[0] > at and section(b[0]) == mine][:1]
        return frozenset().union(*(b[2] for b in before + after))

    in_blocks: dict[str, set[str]] = {}
    for start, _, figures in blocks:
        in_blocks.setdefault(section(start), set()).update(figures)
    found = [Figure(m.group(0), readme.count("\n", 0, m.start()) + 1, section(m.start()),
                    len(_squash(readme[:m.start()])), near(m.start()))
             for m in FIGURE.finditer(readme) if not any(a <= m.start() < b for a, b, _ in blocks)]
    return found, in_blocks


def _quoted(flat: str, quotes: list[tuple[str, set[str] | None]]) -> set[int]:
    """Where the figures inside every occurrence of the quotes start, in the squashed README: of a
    tie's quote only the figures it computes (None: every figure of the quote)."""
    out = set()
    for quote, only in quotes:
        at = flat.find(quote)
        while at >= 0:
            out.update(at + m.start() for m in FIGURE.finditer(quote) if only is None or m.group(0) in only)
            at = flat.find(quote, at + 1)
    return out


def problems(pages: dict[str, str] | str, root: Path = ROOT) -> list[str]:
    """Figures the prose quotes that nothing checks, ties their artifacts no longer bear out, and
    listed quotes no page holds any more. ``pages``: each page's name and text (README.md and the
    pages of docs/, checked together: a quote may live on any of them); a lone text is README.md."""
    if isinstance(pages, str):
        pages = {"README.md": pages}
    flats = {name: _squash(text) for name, text in pages.items()}
    out: list[str] = []
    quotes: dict[str, list] = {name: [] for name in pages}
    for tie in TIES:
        holders = [name for name, flat in flats.items() if tie.quote in flat]
        if not holders:
            out.append(f"tied quote not in the README or docs/: {tie.quote!r}")
            continue
        want = tie.figures(*(load(a, root) for a in tie.artifacts))
        for name in holders:
            quotes[name].append((tie.quote, set(want)))
        wrong = [w for w in want if w not in FIGURE.findall(tie.quote)]
        if wrong:
            out.append(f"{', '.join(tie.artifacts)} now gives {', '.join(wrong)}, not what {holders[0]} says: "
                       f"{tie.quote!r}")
    for entry in UNTIED:
        holders = [name for name, flat in flats.items() if entry.quote in flat]
        if not holders:
            out.append(f"untied quote not in the README or docs/ (take it off the list): {entry.quote!r}")
        for name in holders:
            quotes[name].append((entry.quote, None))
    shown = {h: json.dumps(load(p, root), ensure_ascii=False) for h, p in SHOWN.items()}
    for name, text in pages.items():
        found, _ = prose_figures(text)
        quoted = _quoted(flats[name], quotes[name])
        for fig in found:
            if fig.text in fig.near or fig.at in quoted:
                continue
            if fig.section in shown and UNIT.sub("", fig.text) in shown[fig.section]:
                continue  # the figure's number (a page's tables give units in their headings)
            out.append(f"{name}:{fig.line}: {fig.text} ({fig.section or 'top'}) is in neither block beside it, "
                       "no artifact and no list of figures_quotes.py")
    return out
