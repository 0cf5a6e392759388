"""A job's share of a shared model's time (fair sharing between visitors, round by round).

Between the engine's rounds (engine.gate calls `give_way`), a job that has had SLICE_S of the model
passes its turn to a job of another visitor waiting for it (serving.turns.pass_turn) and waits for
its turn back. The time it waits is kept apart: the time limit counts the job's own time on the model
(`deadline()` moves on by the paused time), and so do its speed figures (the decoder's clock stands
still while it waits).
"""

from __future__ import annotations

import time
from typing import Callable

from hispec.serving.jobs import Job
from hispec.serving.turns import Turns

SLICE_S = 0.25  # a generation's turn on a shared model: it passes the model on after this much of its own time


class Share:
    def __init__(self, turns: Turns | None, job: Job, limit_s: float, slice_s: float = SLICE_S,
                 clock: Callable[[], float] = time.monotonic):
        self.turns, self.job, self.slice_s, self._clock = turns, job, slice_s, clock
        self._limit_at = clock() + limit_s  # the time limit, before any pause
        self.paused = 0.0  # seconds the job's turn was with other visitors
        self._pausing: float | None = None  # since when it waits for its turn back (None: it holds the model)
        self._slice_start = clock()

    def give_way(self) -> None:
        """Between two rounds: pass the model on if this job has had its slice and another visitor waits."""
        now = self._clock()
        if self.turns is None or now - self._slice_start < self.slice_s:
            return
        self._pausing = now
        try:
            self.turns.pass_turn(self.job)
        finally:
            self.paused += self._clock() - now
            self._pausing = None
        self._slice_start = self._clock()

    def others_waiting(self) -> bool:
        """Whether a job of another visitor waits for this model now, or another job holds it beside this one (the
        timing pairs give way: their figures must be the method's alone)."""
        return self.turns is not None and (self.turns.others_waiting(self.job) or self.turns.others_holding(self.job))

    def deadline(self) -> float:
        """The time limit as it stands now: the job's own time on the model, its waits not counted."""
        since = self._pausing
        return self._limit_at + self.paused + (self._clock() - since if since is not None else 0.0)
