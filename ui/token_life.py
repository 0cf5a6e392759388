"""One token's life in words (who wrote it, every verdict on it, in which round), shared by the tooltip
(render.tokens_html) and the token's story (token_story)."""

from __future__ import annotations

from hispec.engine.events import TokenState as S
from hispec.runs.trace import TraceToken
from ui.labels import level_words

WHO = {"draft": "the draft exit (layer {d})", "verify": "the intermediate verifier (exit {v})",
       "target": "the full model", "lookup": "the lookup level (copied from earlier text)"}
JUDGED = {S.TENTATIVE: "kept by {who} (tentative)", S.VERIFY_REJECTED: "rejected by {who}",
          S.ACCEPTED: "accepted by the full model (committed)", S.TARGET_REJECTED: "rejected by the full model",
          S.TARGET_WROTE: "committed", S.DISCARDED: "discarded (the run ended inside its block)"}


def who(level: str, d, v) -> str:
    """A stage by its role and layer: 'the draft exit (layer 2)', 'the intermediate verifier (exit 4)'; a
    level in a cheaper format by what it is, 'the 4-bit full model', whatever its role: it drafts, judges
    and drafts on, and the verb beside its name says which it did."""
    held = {"draft": d, "verify": v}.get(level)
    if "@" in str(held):  # a level in a cheaper format: named in words, not as an exit layer or a role
        return level_words(held)
    return WHO.get(level, level).format(d=d, v=v)


def drafter(level: str, d, v) -> str:
    """Who drafted a token: a level by what it did. The verifier's exit drafting on is 'exit 4', not 'the
    intermediate verifier': it did not verify that token."""
    held = {"draft": d, "verify": v}.get(level)
    if level == "verify" and held is not None and "@" not in str(held):
        return f"exit {held}"
    return who(level, d, v)


def life(token: TraceToken, d, v) -> str:
    """How the token entered the sequence and every verdict on it, with rounds."""
    state, stage, r = token.history[0] if token.history else (token.born, token.origin, token.round)
    if state is S.DRAFTED:
        born = "copied by the lookup level" if token.origin == "lookup" else f"drafted by {drafter(token.origin, d, v)}"
    else:
        born = f"written by {who(token.origin, d, v)}"
    steps = [f"{born} in round {r}"]
    for state, stage, r in token.history[1:]:
        if state in JUDGED and not (state is S.TARGET_WROTE and token.born is S.TARGET_WROTE):
            steps.append(f"{JUDGED[state].format(who=who(stage, d, v))} in round {r}")
    return ", then ".join(steps)
