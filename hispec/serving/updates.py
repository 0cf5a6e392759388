"""What a request's update stream carries (serving.session): three small types (one with a variant), nothing else.

    Status(text)         progress in words: loading, a step of the work
      Waiting(text, ahead)  a Status: the job waits for the model's turn, `ahead` requests before it
                            (the one running counted); sent at once, and again whenever `ahead` changes
    Output(items)        what the work emitted since the last update (engine events, results);
                         empty: a heartbeat, sent after a second of silence
    Ended(outcome, msg)  always last: done | stopped | time limit | left | refused | failed

They are plain frozen dataclasses of plain values, so they can cross a process boundary (ZeroGPU).
"""

from __future__ import annotations

from dataclasses import dataclass

FAILED_OUTCOMES = ("refused", "failed")


@dataclass(frozen=True)
class Status:
    text: str


@dataclass(frozen=True)
class Waiting(Status):
    """The job waits for the model (another visitor's run, or its timing pairs, holds it): a Status, so every
    reader shows its words, and `ahead` as a number for a reader that needs it (no words parsed back)."""

    ahead: int = 0

    @classmethod
    def behind(cls, ahead: int) -> Waiting:
        return cls(f"Waiting for the model: {ahead} request{'s' if ahead != 1 else ''} ahead of this one "
                   "(one runs at a time).", ahead)


@dataclass(frozen=True)
class Output:
    items: tuple


@dataclass(frozen=True)
class Ended:
    outcome: str  # done | stopped | time limit | left | refused | failed
    message: str

    @property
    def ok(self) -> bool:
        """The work ran (to its end or to a stop); False: refused before it ran, or it failed."""
        return self.outcome not in FAILED_OUTCOMES
