"""Greedy drafts held on an accelerator until their block is judged (no host-device sync per draft).

Each draft token stays on the device and feeds the next draft step directly; the block reaches the
host together with the next verdict (`sync`). Deviation from a token-by-token loop: an EOS drafted
mid-block is found only then, and the drafts after it are discarded.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch

from hispec.engine.events import TokenState
from hispec.engine.ledger import Ledger

S = TokenState


class DeviceDrafts:
    def __init__(self, ledger: Ledger, enabled: bool):
        self.ledger, self.enabled = ledger, enabled  # disabled: every draft goes to the host at once
        self.block = None  # (first position, device tensors, origin) of drafts not yet on the host

    @property
    def waiting(self) -> bool:
        return self.block is not None

    def draft(self, n: int, origin: str, next_token: Callable[[], torch.Tensor], stop: threading.Event) -> None:
        """Up to n drafts, each `next_token()` (a device tensor of one id), appended to the stack."""
        stack = self.ledger.stack
        if n == 0:
            return
        self.block = (len(stack), [], origin)
        for _ in range(n):
            token = next_token()
            stack.append(token)
            self.block[1].append(token)
            if stop.is_set():
                break

    def with_verdict(self, logits: torch.Tensor, first: int) -> tuple[list[int] | None, torch.Tensor]:
        """(predictions, logits) for a verdict on the tokens from `first` on: with drafts waiting, they and
        the logits' argmaxes reach the host in one transfer (rows beyond a drafted EOS dropped); else (None, logits)."""
        if not self.waiting:
            return None, logits
        preds = self.sync(logits.argmax(-1))
        keep = len(self.ledger.stack) - first + 1  # row j predicts position first + j
        return preds[:keep], logits[:keep]

    def sync(self, preds: torch.Tensor | None = None) -> list[int]:
        """Bring the drafts (and a verifier's predictions `preds`, rows predicting positions from the
        verifier's first one on) to the host in one transfer; place the drafts' events, cut after a
        drafted EOS, and return the predictions."""
        led = self.ledger
        first, drafted, origin = self.block
        self.block = None
        values = torch.cat(drafted + ([preds] if preds is not None else [])).tolist()
        tokens, preds = values[: len(drafted)], values[len(drafted) :]
        led.stack.resolve(first, tokens)
        for i in range(len(tokens)):
            led.record(first + i, S.DRAFTED, origin)
        cut = next((i for i, t in enumerate(tokens) if t in led.eos), None)
        if cut is not None and cut + 1 < len(tokens):
            led.reject_from(first + cut + 1, S.DISCARDED, "draft")
        return preds
