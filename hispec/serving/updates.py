"""What a request's update stream carries (serving.session): three small types, nothing else.

    Status(text)         progress in words: loading, waiting (with the place), a step of the work
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
