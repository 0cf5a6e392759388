"""A model's turns, shared out fairly between visitors, and a waiting job can leave.

A model's layers are shared by every visitor; its KV caches are each generation's own. Where the
model's passes can be shared (``seats`` > 1: its passes run on the batch-invariant native route, and
hispec.model.shared fuses the passes of the generations that run together), up to `seats` jobs that
share (Job.shares: generations) hold the model at once, each in its own thread, and each writes what it
would alone. Any other job (a comparison, a benchmark, a timing) holds it alone, as every job does where
seats is 1: its timings must be its own. Waiting jobs learn their place; a Stop or a client that left
takes a job out of the queue at once.

The order is fair between visitors (a visitor: the client address of the job, Job.who), not
first come first served: each job gets a round when it arrives, the round of the job holding the
model or the one after its visitor's latest job, whichever is later, and jobs run by round, then
by arrival (start-time fair queuing, one turn a round per visitor). A turn is a slice of a job, not
the whole job: a generation running on the model passes it (`pass_turn`, called by serving between
the engine's rounds, engine.gate) when another visitor waits, and queues for its next turn. So a visitor's extra jobs
queue behind the first job of every other visitor, one visitor sending many long requests
delays a newcomer by one job at most, and a job already waiting is never overtaken by a later
job of the same or a later round: nobody waits forever.

Every loop over the queue or the rounds runs over a copy taken under the lock (list(), tuple() or dict()
of the table itself: one C call that allocates nothing the garbage collector tracks while it iterates, so
the collector cannot run inside it; a copy of .items() makes a tuple per item, and could). The lock is
re-entrant because the collector may finalise an abandoned update stream in this very thread, between any
two bytecodes, and that stream's `finally` leaves the queue and gives back its turn here: a loop over the
live deque or dict then failed ("deque mutated during iteration", "dictionary changed size during iteration").
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Iterator

from hispec.serving.jobs import Job

STEP_S = 0.5  # how often a waiting job looks at its stop flag and reports its place


class Turns:
    def __init__(self, seats: int = 1):
        self.seats = max(1, seats)  # jobs that share (Job.shares) holding the model at once
        self._cond = threading.Condition()
        self._queue: deque[Job] = deque()  # in arrival order
        self._holders: set[Job] = set()
        self._round: dict[Job, int] = {}  # each waiting or holding job's round
        self._latest: dict[str, int] = {}  # each visitor's latest round
        self._now = 0  # the round of the job holding the model (or of the last one that did)

    def wait(self, job: Job, deadline: float, step_s: float = STEP_S) -> Iterator[int]:
        """Wait for the model: yields the job's place (1 = next) at once when it cannot take the model, then
        every `step_s` while others run; returns True once the job holds the model, False if it was told to
        end or the deadline passed first. A generator: `held = yield from turns.wait(job, deadline)`."""
        with self._cond:
            self._queue.append(job)
            self._round[job] = self._latest[job.who] = max(self._now, self._latest.get(job.who, -1) + 1)
        first = True
        try:
            while True:
                with self._cond:
                    if job.stop.is_set() or time.monotonic() >= deadline:
                        return False
                    if self._take(job):
                        return True
                    if not first:  # a job that must wait hears its place at once, then every step_s
                        self._cond.wait(min(step_s, max(0.0, deadline - time.monotonic())))
                        if self._take(job):
                            return True  # our turn came while waiting: take it without reporting a place
                    first = False
                    place = self._place(job)
                yield place
        finally:
            with self._cond:
                if job in self._queue:  # left before its turn (stopped, out of time, or closed)
                    self._queue.remove(job)
                    self._left(job)
                    self._cond.notify_all()

    def hold(self, job: Job, timeout: float) -> bool:
        """Take the model without reporting places (short jobs); False after `timeout` s."""
        waiting = self.wait(job, time.monotonic() + timeout)
        try:
            while True:
                next(waiting)
        except StopIteration as end:
            return bool(end.value)

    def pass_turn(self, job: Job, step_s: float = STEP_S) -> bool:
        """Round-by-round sharing: the holder hands the model to the next waiting job if one of another
        visitor waits, and takes its turn back when the order comes round to it again (its visitor's
        next round, as if it had just arrived). Blocks until then, whatever happens to `job` meanwhile:
        a generation must not touch the model between rounds without holding it. True if it passed."""
        with self._cond:
            if job not in self._holders or not any(j.who != job.who for j in tuple(self._queue)):
                return False
            self._holders.discard(job)
            # its next turn is the next round; the visitor's own waiting jobs move one round back, so
            # that a visitor's jobs keep their order among themselves while visitors take turns
            for other in tuple(self._queue):
                if other.who == job.who and other in self._round:
                    self._round[other] += 1
            self._round[job] = self._now + 1
            self._latest[job.who] = max(r for j, r in dict(self._round).items() if j.who == job.who)
            self._queue.append(job)
            self._cond.notify_all()
            while not self._take(job):
                self._cond.wait(step_s)
            return True

    def release(self, job: Job) -> None:
        with self._cond:
            if job in self._holders:
                self._holders.discard(job)
                self._round.pop(job, None)
                self._forget_idle()
                self._cond.notify_all()

    def others_waiting(self, job: Job) -> bool:
        """Whether a job of another visitor than `job`'s waits for the model."""
        with self._cond:
            return any(j.who != job.who for j in tuple(self._queue))

    def others_holding(self, job: Job) -> bool:
        """Whether another job holds the model beside `job` (its passes share the machine)."""
        with self._cond:
            return any(j is not job for j in tuple(self._holders))

    def order(self) -> list[Job]:
        """The waiting jobs in the order they will get the model."""
        with self._cond:
            return self._order()

    # ---- under the lock ---------------------------------------------------------------------------
    def _take(self, job: Job) -> bool:
        if self._order()[0] is not job or not self._seat_for(job):
            return False
        self._queue.remove(job)
        self._holders.add(job)
        self._now = self._round[job]
        return True

    def _seat_for(self, job: Job) -> bool:
        """A free model, or a free seat beside holders that all share (and `job` shares too)."""
        holders = tuple(self._holders)
        return not holders or (job.shares and len(holders) < self.seats and all(j.shares for j in holders))

    def _order(self) -> list[Job]:
        queue, rounds = list(self._queue), dict(self._round)
        arrival = {job: n for n, job in enumerate(queue)}
        order = sorted((job for job in queue if job in rounds), key=lambda job: (rounds[job], arrival[job]))
        return [job for job in order if job in self._round]  # less any that left meanwhile

    def _place(self, job: Job) -> int:
        order = self._order()
        return order.index(job) + 1 if job in order else 0

    def _left(self, job: Job) -> None:
        """A job left the queue before its turn: its round is free for its visitor's next job."""
        mine = self._round.pop(job)
        if self._latest.get(job.who) == mine:
            others = [r for j, r in dict(self._round).items() if j.who == job.who]
            self._latest[job.who] = max(others, default=mine - 1)
        self._forget_idle()

    def _forget_idle(self) -> None:
        """Forget visitors with nothing here whose next job would start at the current round anyway."""
        active = {j.who for j in list(self._round)}
        for who, r in dict(self._latest).items():  # in place: a finaliser's own changes meanwhile are kept
            if who not in active and r + 1 <= self._now:
                self._latest.pop(who, None)

    @property
    def busy(self) -> bool:
        with self._cond:
            return bool(self._holders)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)
