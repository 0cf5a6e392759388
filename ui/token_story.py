"""Click a token, read its story: who proposed it, who judged it, what each exit predicted there,
and what replaced it. One hidden block per token, shown by the page's script (EXPLAIN_JS) when its
token is clicked or tapped, so it works without a round trip to the server (ZeroGPU included)."""

from __future__ import annotations

import html

from hispec.engine.events import TokenState as S
from hispec.runs.record import RunRecord
from hispec.runs.trace import Trace, TraceToken
from hispec.text import printable
from ui.labels import level_words
from ui.render import roles_of
from ui.token_life import drafter as _drafter
from ui.token_life import life as _life
from ui.token_life import who as _who

FATE = {
    "accepted": "accepted by the full model: committed",
    "copied": "accepted by the full model: committed",
    "precision": "accepted by the full model: committed",
    "verify-wrote": "written as a correction by the verifier, then accepted by the full model: committed",
    "target-wrote": "written by the full model itself (a correction, a bonus token or a plain step): committed",
    "verify-rejected": "rejected by the intermediate verifier (exit {v}) before the full model saw it",
    "target-rejected": "rejected by the full model",
    "discarded": "discarded: generation ended inside its block",
    "tentative": "still tentative when the run ended",
    "drafted": "still waiting for a verifier when the run ended",
}

# Shows a token's block, and the exits' predictions at its position (one table per position, shared by
# every token proposed there), when the token is clicked or Enter is pressed on it; loaded once per page.
EXPLAIN_JS = """
<script>
(() => {
  function show(tok) {
    const all = document.querySelector('#hs-explain-all');
    if (!all) return;
    const serial = tok.getAttribute('data-s');
    let found = false, index = null;
    all.querySelectorAll('.hs-explain').forEach((b) => {
      const on = b.getAttribute('data-s') === serial;
      b.hidden = !on; found = found || on;
      if (on) index = b.getAttribute('data-i');
    });
    all.querySelectorAll('.hs-explain-at').forEach((t) => { t.hidden = t.getAttribute('data-i') !== index; });
    const hint = all.querySelector('.hs-explain-hint');
    if (hint) hint.hidden = found;
    document.querySelectorAll('#hs-tokens .hs-selected').forEach((t) => t.classList.remove('hs-selected'));
    tok.classList.add('hs-selected');
  }
  document.addEventListener('click', (e) => {
    const tok = e.target.closest && e.target.closest('#hs-tokens .hs-tok[data-s]');
    if (tok) show(tok);
  });
  document.addEventListener('keydown', (e) => {
    const tok = e.target.closest && e.target.closest('#hs-tokens .hs-tok[data-s]');
    if (tok && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); show(tok); }
  });
})();
</script>
"""

HINT = ("<p class='hs-hint hs-explain-hint'>Click or tap any token above to see which exit proposed it, what each "
        "stage predicted in its place, and what replaced it.</p>")


def _tok(text: str, cls: str = "") -> str:
    shown = printable(text)
    if not shown.strip():  # a space or a line break alone would be an empty chip: show what it is
        shown = shown.replace(" ", "␣").replace("\n", "↵").replace("\t", "→") or "∅"
    return f"<span class='hs-tok {cls}'>{html.escape(shown)}</span>"


def _candidates(cell: dict) -> str:
    return " · ".join(f"{_tok(text)} {prob:.0%}" for _, text, prob in cell["top"])


def _prob_of(cell: dict, token_id: int) -> float | None:
    return next((prob for tid, _, prob in cell["top"] if tid == token_id), None)


def predictions_html(index: int, beliefs: dict) -> str:
    """What each exit predicted at generated position `index`, given the committed text before it."""
    column = beliefs["tokens"][index]
    rows = []
    for layer, cell in zip(beliefs["layers"], column["cells"]):
        rows.append(f"<tr><td>{html.escape(layer['label'])}</td><td>{_candidates(cell)}</td></tr>")
    return (f"<div class='hs-explain-at' data-i='{index}' hidden><p>Top candidates of each exit at "
            f"token {index + 1}, given the committed text before it (the token kept there: {_tok(column['text'])}):</p>"
            f"<table class='hs-stats hs-explain-table'>{''.join(rows)}</table></div>")


def _sampling_note(token: TraceToken, beliefs: dict | None, record: RunRecord) -> str:
    """Under sampling a judge keeps a token x with probability min(1, p_judge(x) / p_holder(x)), the
    holder being the level that last proposed or passed it (the engine's speculative sampling)."""
    if record.sampling.greedy or not beliefs or token.origin not in ("draft", "verify"):
        return ""
    if not record.sampling.plain_distribution:
        return ("<p class='hs-hint'>Sampled run: each judge kept this token with probability min(1, p_judge(x) / "
                "p_holder(x)) over the distributions at this run's temperature, top-k and top-p; the "
                "probabilities in the table are plain (temperature 1), so the ratio is not shown here.</p>")
    if token.index >= len(beliefs.get("tokens", [])):
        return ""
    column = beliefs["tokens"][token.index]
    by_layer = {(lay["layer"], lay["kind"]): cell for lay, cell in zip(beliefs["layers"], column["cells"])}
    kept = column["token_id"] == token.token_id  # "p" is each exit's probability of the kept token

    def prob(layer):
        cell = by_layer.get((layer, "trained")) or by_layer.get((layer, "full")) or by_layer.get((layer, "raw"))
        if cell is None:
            return None
        return cell["p"] if kept and "p" in cell else _prob_of(cell, token.token_id)

    roles, L = roles_of(record.spec), record.num_layers
    # the levels that held the token in turn: where it was drafted, the exits above it, the full model
    chain = [roles[r] for r in ("draft", "verify") if r in roles and (token.origin == "draft" or r == "verify")] + [L]
    steps = []
    for holder, judge in zip(chain, chain[1:]):
        p_h, p_j = prob(holder), prob(judge)
        if p_h is None or p_j is None or p_h == 0:
            return ""
        name = "the full model" if judge == L else f"exit {judge}"
        steps.append(f"{name}: min(1, {p_j:.1%} / {p_h:.1%}) = <b>{min(1.0, p_j / p_h):.0%}</b>")
    return ("<p>Sampled run: the chance each judge kept this token — " + "; ".join(steps)
            + " (each against the level that last held it).</p>")


def chain_html(token: TraceToken, trace: Trace, d, v) -> str:
    """Every token that held this token's position, in order, each with its life: the whole chain
    from the first draft to the token committed there (the clicked one marked)."""
    items = []
    for t in trace.at(token.index):
        mark = " <b>← this one</b>" if t.serial == token.serial else ""
        items.append(f"<li>{_tok(t.text, 'hs-' + t.css_class)}: {html.escape(_life(t, d, v))}.{mark}</li>")
    return f"<p>Everything that happened at token {token.index + 1}:</p><ol class='hs-chain'>{''.join(items)}</ol>"


def explain_token(token: TraceToken, winner: TraceToken | None, fell_with_another: bool, beliefs: dict | None,
                  record: RunRecord, trace: Trace | None = None) -> str:
    """One token's story: who proposed it, who judged it and how, what replaced it (`winner`: the
    committed token at its position), and the whole chain of tokens at its position; `fell_with_another`:
    an earlier token of its block was rejected."""
    roles = roles_of(record.spec)
    d, v = roles.get("draft"), roles.get("verify")
    who = _drafter(token.origin, d, v) if token.born is S.DRAFTED else _who(token.origin, d, v)
    fate = FATE.get(token.css_class, token.css_class).format(d=d, v=v)
    for held in (d, v):  # a level in a cheaper format by what it is: 'rejected by the 4-bit full model'
        if "@" in str(held):
            fate = fate.replace(f"the intermediate verifier (exit {held})", level_words(held))
            fate = fate.replace(f"exit {held}", level_words(held))
    lines = [f"<p><b>{_tok(token.text, 'hs-' + token.css_class)}</b> · token {token.index + 1} · round "
             f"{token.round}</p>", f"<p>Proposed by <b>{html.escape(who)}</b>; {html.escape(fate)}.</p>"]
    if token.rejected and winner is not None:
        by = _who(winner.origin, d, v)
        lines.append(f"<p>Replaced by {_tok(winner.text, 'hs-' + winner.css_class)}, written by {html.escape(by)}.</p>")
    if fell_with_another:
        lines.append("<p class='hs-hint'>An earlier token of the same block was rejected first: this one fell with "
                     "it, whatever its judge thought of it.</p>")
    if trace is not None and len(trace.at(token.index)) > 1:
        lines.append(chain_html(token, trace, d, v))
    if not beliefs:
        lines.append("<p class='hs-hint'>Exit predictions appear once the run has finished.</p>")
    lines.append(_sampling_note(token, beliefs, record))
    return f"<div class='hs-explain' data-s='{token.serial}' data-i='{token.index}' hidden>{''.join(lines)}</div>"


def explain_all_html(trace: Trace, beliefs: dict | None, record: RunRecord) -> str:
    """Every token's hidden story and every position's hidden predictions, with the hint shown while
    no token is selected."""
    tokens = list(trace)
    winners = {t.index: t for t in tokens if t.state in (S.ACCEPTED, S.TARGET_WROTE)}
    first_rejected: dict[tuple[int, str], int] = {}  # (round, judge) -> the first position it rejected
    for t in tokens:
        if t.state in (S.VERIFY_REJECTED, S.TARGET_REJECTED):
            key = (t.round, t.stage)
            first_rejected[key] = min(first_rejected.get(key, t.index), t.index)
    blocks = []
    for t in tokens:
        fell = (t.state in (S.VERIFY_REJECTED, S.TARGET_REJECTED)
                and first_rejected.get((t.round, t.stage), t.index) < t.index)
        blocks.append(explain_token(t, winners.get(t.index), fell, beliefs, record, trace))
    if beliefs:
        positions = sorted({t.index for t in tokens if t.index < len(beliefs.get("tokens", []))})
        blocks += [predictions_html(i, beliefs) for i in positions]
    return f"<div class='hs-explain-all'>{HINT}{''.join(blocks)}</div>"
