"""One job at a time on a model, in the order they came, and a waiting job can leave.

A model's layers are shared by every visitor; its KV caches and the timings the adaptive policy
relies on are not, so one generation (or comparison, benchmark, timing) runs on a model at a time.
Waiting jobs queue in arrival order and learn their place; a Stop, the time limit or a client that
left takes a job out of the queue at once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Iterator

from hispec.serving.jobs import Job

STEP_S = 0.5  # how often a waiting job looks at its stop flag and reports its place


class Turns:
    def __init__(self):
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()
        self._holder: Job | None = None

    def wait(self, job: Job, deadline: float, step_s: float = STEP_S) -> Iterator[int]:
        """Wait for the model: yields the job's place (1 = next) every `step_s` while others run;
        returns True once the job holds the model, False if it was told to end or the deadline
        passed first. A generator: `held = yield from turns.wait(job, deadline)`."""
        with self._cond:
            self._queue.append(job)
        try:
            while True:
                with self._cond:
                    if job.stop.is_set() or time.monotonic() >= deadline:
                        return False
                    if self._holder is None and self._queue[0] is job:
                        self._queue.popleft()
                        self._holder = job
                        return True
                    self._cond.wait(min(step_s, max(0.0, deadline - time.monotonic())))
                    if self._holder is None and self._queue[0] is job:
                        continue  # our turn came while waiting: take it without reporting a place
                    place = self._place(job)
                yield place
        finally:
            with self._cond:
                if job in self._queue:  # left before its turn (stopped, out of time, or closed)
                    self._queue.remove(job)
                    self._cond.notify_all()

    def hold(self, job: Job, timeout: float) -> bool:
        """Take the model without reporting places (short jobs); False after `timeout` s."""
        waiting = self.wait(job, time.monotonic() + timeout)
        try:
            while True:
                next(waiting)
        except StopIteration as end:
            return bool(end.value)

    def release(self, job: Job) -> None:
        with self._cond:
            if self._holder is job:
                self._holder = None
                self._cond.notify_all()

    def _place(self, job: Job) -> int:
        return list(self._queue).index(job) + 1 if job in self._queue else 0

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._holder is not None

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)
