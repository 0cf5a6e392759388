"""'What each exit believes': a layer x token grid of hispec.explain.beliefs.exit_beliefs's result.

One row per exit (raw, trained, full model), one column per generated token; each cell is that
exit's top-1 token there, green when it is the token the generation kept, red otherwise, with the
top candidates and their probabilities on hover. Model text is always escaped: text, never markup.
"""

from __future__ import annotations

import html

from hispec.text import printable
from ui.render import COLORS

MATCH, MISMATCH = COLORS["accepted"], COLORS["target-rejected"]
CAPTION = (
    "Each column is a generated token (its text on top), each row an exit: the hidden state after that many "
    "layers, read by the model's own final norm and LM head (raw) or by a trained exit head (trained); the last "
    "exit row is the full model. A cell shows what that exit would have written there as its first choice: green "
    "when it is the token the generation kept, red when not; hover a cell for its top candidates and their "
    "probabilities. The bottom row, depth of certainty, names the shallowest exit whose first choice was already "
    "the kept token: the smaller it is, the earlier the model knew, and the more an early exit can draft there."
)


def _show(text: str) -> str:
    """Model text as safe, visible HTML text on one line (newlines and tabs as arrows, other control
    characters shown as escapes, markup escaped)."""
    shown = printable(text.replace("\n", "↵").replace("\t", "→"))
    if not shown.strip():  # a space alone would be an empty cell: show what it is
        shown = shown.replace(" ", "␣") or "∅"
    return html.escape(shown, quote=True)


def _pct(p: float) -> str:
    if p >= 0.095:
        return f"{p:.0%}"
    return f"{p:.1%}" if p >= 0.001 else "<0.1%"


def _candidates(cell: dict) -> str:
    """Plain text for a title attribute: "' the' 41% · ' a' 12% · …" (escaped by the caller)."""
    parts = [f"'{printable(text)}' {_pct(p)}" for _, text, p in cell.get("top", [])]
    return " · ".join(parts) if parts else "no candidates"


def beliefs_html(beliefs: dict) -> str:
    rows = beliefs.get("layers") or []
    tokens = beliefs.get("tokens") or []
    caption = f'<p class="hs-beliefs-caption">{html.escape(CAPTION)}</p>'
    if not rows or not tokens:
        return (f'<div class="hs-beliefs" id="hs-beliefs-grid">{caption}'
                '<p class="hs-empty">Generate some text first: the grid shows what each exit believed at each '
                'generated token.</p></div>')
    head = ['<th class="hs-beliefs-rowhead">exit \\ token</th>']
    for tok in tokens:
        title = _show(f"token {tok['index'] + 1} · id {tok['token_id']}")
        head.append(f'<th class="hs-beliefs-token" title="{title}">{_show(tok["text"])}</th>')
    body = []
    for r, row in enumerate(rows):
        row_title = row.get("head") or row["label"]
        if row.get("note"):
            row_title = f"{row_title} — {row['note']}"
        cells = [f'<th class="hs-beliefs-rowhead" title="{_show(row_title)}">{_show(row["label"])}</th>']
        for tok in tokens:
            cell = tok["cells"][r]
            top = cell.get("top") or []
            first = top[0] if top else None
            match = bool(cell.get("match"))
            colour = MATCH if match else MISMATCH
            kind = "match" if match else "miss"
            p_kept = cell.get("p")
            kept = "" if p_kept is None else f" · kept token: {_pct(p_kept)}"
            title = _show(f"{row['label']}: {_candidates(cell)}{kept}")
            text = _show(first[1]) if first else "–"
            prob = f'<span class="hs-beliefs-p">{_pct(first[2])}</span>' if first else ""
            cells.append(f'<td class="hs-beliefs-cell hs-beliefs-{kind}" style="background:{colour}" '
                         f'title="{title}"><span class="hs-beliefs-text">{text}</span>{prob}</td>')
        body.append(f'<tr class="hs-beliefs-{row["kind"]}">{"".join(cells)}</tr>')
    certainty = ['<th class="hs-beliefs-rowhead" title="the shallowest exit whose first choice was the kept '
                 'token">depth of certainty</th>']
    for tok in tokens:
        layer, label = tok.get("certain_at"), tok.get("certain_label")
        if layer is None:
            certainty.append('<td class="hs-beliefs-certain hs-beliefs-never" title="no exit listed here had this '
                             'token as its first choice (e.g. it was sampled)">–</td>')
        else:
            certainty.append(f'<td class="hs-beliefs-certain" title="{_show(f"first right at {label}")}">'
                             f'{int(layer)}</td>')
    body.append(f'<tr class="hs-beliefs-certainty">{"".join(certainty)}</tr>')
    table = (f'<table class="hs-beliefs-table"><thead><tr>{"".join(head)}</tr></thead>'
             f'<tbody>{"".join(body)}</tbody></table>')
    return (f'<div class="hs-beliefs" id="hs-beliefs-grid">{caption}'
            f'<div class="hs-beliefs-scroll">{table}</div></div>')
