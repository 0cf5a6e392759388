"""The verdict on a block of pending tokens: the real comparison (engine.sampling), or a timing-only
judge's acceptance count in its place; every verdict is recorded and every judged token observed by
the policy, in order up to the first rejection."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from hispec.engine.ledger import Ledger
from hispec.engine.sampling import Selector, Verdict


class Judge:
    def __init__(self, selector: Selector, ledger: Ledger, policy, timing_only: Callable[[str, int], int] | None):
        self.selector, self.ledger, self.policy, self.timing_only = selector, ledger, policy, timing_only
        self.decisions: list[tuple[str, int, int]] = []  # every verdict: (stage, pending tokens, accepted)

    def block(self, stage: str, first: int, logits, preds: list[int] | None) -> Verdict:
        """`stage`'s verdict on the stack's tokens from `first` on, from its `logits` (rows predicting
        those positions, and one more); `preds`: the rows' argmaxes when already on the host."""
        stack = self.ledger.stack
        tokens, serials = stack.tokens[first:], stack.serials[first:]
        verdict = self.selector.judge(tokens, [self.ledger.proposal.get(s) for s in serials], logits, preds)
        key = "target" if stage == "target" else "verify"  # the timing-only judges' two stages
        if self.timing_only is not None and tokens:  # the verdict comes from hispec.runs.timing_only
            n_ok = self.timing_only(key, len(tokens))
            row = preds if preds is not None else logits.argmax(-1).tolist()
            verdict = replace(verdict, accepted=n_ok, token=row[n_ok] if n_ok < len(row) else None)
        self.decisions.append((key, len(tokens), verdict.accepted))
        for i, serial in enumerate(serials[: verdict.accepted + 1]):
            self.policy.observe(self.ledger.holder.get(serial, "draft"), stage, i < verdict.accepted)
        return verdict
