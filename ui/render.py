"""HTML views of a Trace. Model text is always escaped: it is shown as text, never as markup."""

from __future__ import annotations

import html

from hispec.evaluation.bench import first_difference
from hispec.evaluation.metrics import stats_rows
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


def _pct(x) -> str:
    return "–" if x is None else f"{x:.0%}"


def why_html(exp: dict, settings: dict, predicted_now: float, a_dv: float, a_vt: float) -> str:
    """The run's measured speed next to the cost model's prediction, in words and numbers.
    `exp`: evaluation.speed_model.explain(); `predicted_now`: at the sliders' acceptance."""
    method = exp["method"]
    if method not in ("layerskip", "hispec"):
        return ("<div class='hs-why'><p>This run decoded without exits (" + html.escape(method) + "): there is "
                "nothing to predict. Pick HiSpec or LayerSkip and generate.</p></div>")
    d, v = settings.get("draft_layer"), settings.get("verify_layer")
    k, T, L = settings.get("draft_len"), settings.get("verify_threshold"), settings.get("num_layers")
    shape = (f"LayerSkip: {k} drafts at exit {d}, then layers {d}–{L}" if method == "layerskip"
             else f"HiSpec: {k} drafts at exit {d}, judged at exit {v}, the full model once {T} are tentative")
    rows = [("measured speed vs a plain step", f"{exp['measured_vs_plain']:.2f}×"),
            ("a plain step on this machine (cost model)", f"{exp['plain_tokens_per_s']:.1f} tokens/s")]
    if method == "hispec":
        rows.append(("measured acceptance draft → verify", _pct(exp["a_dv"])))
    rows.append(("measured acceptance " + ("exit → full model" if method == "layerskip" else "verify → full model"),
                 _pct(exp["a_vt"])))
    if exp["predicted"] is not None:
        rows.append(("predicted at the measured acceptance", f"{exp['predicted']:.2f}×"))
    be = exp["break_even"]
    rows.append(("break-even acceptance (exit → full model)",
                 "never: the round costs more than it can commit" if be is None and exp["predicted"] is not None
                 else _pct(be)))
    rows.append(("predicted at the sliders' acceptance"
                 + (f" ({a_dv:.0%} draft → verify, {a_vt:.0%} → full)" if method == "hispec" else f" ({a_vt:.0%})"),
                 f"<b>{predicted_now:.2f}×</b>"))
    body = "".join(f"<tr><td>{html.escape(a)}</td><td>{b}</td></tr>" for a, b in rows)
    note = ""
    if settings.get("policy") == "auto":
        note = ("<p class='hs-hint'>This run used the adaptive policy, which changes its plan from round to round "
                "(see “adaptive plans” in the stats); the prediction is for fixed rounds with these settings.</p>")
    return (f"<div class='hs-why'><p>{html.escape(shape)}. A round pays when it commits more tokens per second "
            f"than plain steps would: that takes the acceptance on the right of the break-even point.</p>"
            f"<table class='hs-stats' id='hs-why-table'>{body}</table>{note}"
            "<p class='hs-hint'>Predictions: expected tokens per second of a round (per-token acceptance, in order) "
            "with pass and head costs timed on this machine for this model; acceptance measured in the run "
            "above. The model counts layer passes and heads only, not the engine's own bookkeeping, and real "
            "runs are burstier: the measured speed is the fact, the prediction the explanation.</p></div>")


def stats_html(s: dict) -> str:
    """The run's stats as a table (the CLI prints the same rows on one line)."""
    body = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in stats_rows(s))
    return f'<table class="hs-stats">{body}</table>'


def compare_table(rows: list[dict], sampling: bool = False) -> str:
    """Speeds side by side; under greedy decoding, whether each output equals the reference."""
    ref = next((r for r in rows if r["method"] == "autoregressive"), rows[0])
    head = ("<tr><th>method</th><th>tokens</th><th>tokens / s</th>"
            + "".join(f"<th>speedup vs {html.escape(r['method'])}</th>" for r in rows)
            + f"<th>identical to {html.escape(ref['method'])}</th></tr>")
    body = []
    for r in rows:
        ratios = "".join(
            f"<td>{r['tokens_per_s'] / o['tokens_per_s']:.2f}×</td>" if o["tokens_per_s"] else "<td>–</td>"
            for o in rows)
        same = ("n/a: sampled (same distribution, not the same text)" if sampling
                else "✓ same tokens" if r["token_ids"] == ref["token_ids"] else _difference(r, ref))
        body.append(f"<tr><td>{html.escape(r['method'])}</td><td>{r['new_tokens']}</td>"
                    f"<td>{r['tokens_per_s']:.2f}</td>{ratios}<td>{same}</td></tr>")
    return f'<table class="hs-stats hs-compare">{head}{"".join(body)}</table>'


def _difference(row: dict, ref: dict) -> str:
    """Where a greedy output first differs from the reference, and why it may in half precision."""
    first = first_difference(ref["token_ids"], row["token_ids"])
    why = ""
    if row.get("dtype", "float32") != "float32":
        why = (f" ({html.escape(row['dtype'])}: passes over different numbers of tokens can round a near-tie "
               "differently; exactness holds in float32)")
    return f"✗ DIFFERENT from token {first + 1}{why}"
