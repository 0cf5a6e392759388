"""HTML views of a Trace. Model text is always escaped: it is shown as text, never as markup."""

from __future__ import annotations

import html

from hispec.evaluation.trace import LEGEND, Trace, TraceToken
from hispec.text import printable

COLORS = {
    "drafted": "#d9d9d9",
    "tentative": "#ffe08a",
    "accepted": "#9be79b",
    "copied": "#c3a6f0",
    "verify-wrote": "#ffb347",
    "target-wrote": "#8ecdf5",
    "verify-rejected": "#f2b8e0",
    "target-rejected": "#f4a3a3",
    "discarded": "#e0e0e0",
}
_STATE_WORDS = {
    "drafted": "drafted at exit {d}, waiting",
    "tentative": "tentatively accepted by the verifier (exit {v}), waiting for the full model",
    "accepted": "drafted, accepted by the full model",
    "copied": "copied by the lookup level from earlier text, accepted by the full model",
    "verify-wrote": "written by the intermediate verifier (exit {v})",
    "target-wrote": "written by the full model",
    "verify-rejected": "rejected by the intermediate verifier (exit {v})",
    "target-rejected": "rejected by the full model",
    "discarded": "discarded: generation ended inside the block",
}


def _title(token: TraceToken, d, v) -> str:
    words = _STATE_WORDS[token.css_class].format(d=d, v=v)
    return f"#{token.index} · id {token.token_id} · {words} · round {token.round}"


def tokens_html(trace: Trace, draft_layer=None, verify_layer=None, show_rejected: bool = True) -> str:
    spans = []
    for token in trace:
        if token.rejected and not show_rejected:
            continue
        text = html.escape(printable(token.text), quote=True)
        title = html.escape(_title(token, draft_layer, verify_layer), quote=True)
        spans.append(f'<span class="hs-tok hs-{token.css_class}" title="{title}">{text}</span>')
    body = "".join(spans) or '<span class="hs-empty">The generated text appears here, token by token.</span>'
    return f'<div class="hs-text">{body}</div>'


def legend_html(counts: dict[str, int] | None = None) -> str:
    items = []
    for cls, label, meaning in LEGEND:
        n = f" ({counts[cls]})" if counts else ""
        items.append(f'<span class="hs-legend-item"><span class="hs-tok hs-{cls}">{html.escape(label)}</span>'
                     f'<span class="hs-legend-text">{html.escape(meaning)}{n}</span></span>')
    return '<div class="hs-legend">' + "".join(items) + "</div>"


def message_html(text: str, kind: str = "error") -> str:
    return f'<div class="hs-msg hs-msg-{kind}">{html.escape(text)}</div>'


def depth_html(num_layers: int, draft_layer: int | None, verify_layer: int | None, method: str) -> str:
    """The model's depth as a strip of layers, coloured by the stage that runs them."""
    if not num_layers:
        return ""
    cells = []
    for layer in range(num_layers):
        if method == "autoregressive":
            stage = "target"
        elif method == "layerskip":
            stage = "draft" if layer < (draft_layer or 0) else "target"
        else:
            stage = "draft" if layer < (draft_layer or 0) else "verify" if layer < (verify_layer or 0) else "target"
        cells.append(f'<span class="hs-layer hs-stage-{stage}" title="layer {layer + 1}: {stage} stage"></span>')
    marks = []
    if method != "autoregressive" and draft_layer:
        marks.append(f"draft exit after layer {draft_layer}")
    if method == "hispec" and verify_layer:
        marks.append(f"verifier exit after layer {verify_layer}")
    marks.append(f"full model: {num_layers} layers")
    key = ('<span class="hs-stage-key hs-stage-draft">draft</span>'
           + ('<span class="hs-stage-key hs-stage-verify">intermediate verify</span>' if method == "hispec" else "")
           + '<span class="hs-stage-key hs-stage-target">full verification</span>')
    return (f'<div class="hs-depth"><div class="hs-layers">{"".join(cells)}</div>'
            f'<div class="hs-depth-caption">{html.escape(" · ".join(marks))} {key}</div></div>')
