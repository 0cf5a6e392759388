"""A model's turns, shared out fairly between visitors, and a waiting job can leave.

A model's layers are shared by every visitor; its KV caches are each generation's own. Where the
model's passes can be shared (``seats`` > 1: its passes run on the batch-invariant native route, and
hispec.model.shared fuses the passes of the generations that run together), up to `seats` jobs that
share (Job.shares: generations) hold the model at once, each in its own thread, and each writes what it
would alone. Any other job (a comparison, a benchmark, a timing) holds it alone, as every job does where
seats is 1: its timings must be its own. Waiting jobs learn their place; a Stop or a client that left
takes a job out of the queue at once.

The order is fair between visitors, not first come first served, and fair between addresses first: a
visitor is a session within a client address (Job.who: a browser tab or an API client), and a class of
thirty behind one school network is thirty visitors of one address (Job.origin). Turns go to addresses
by start-time fair queuing (one turn a round per address): each job gets a round when it arrives, the
round of the job holding the model or the one after its address's latest job, whichever is later, and
an address's turns come by round, then by arrival. Which of an address's waiting jobs takes each of its
turns is decided the same way one level down, between the address's visitors (their rounds among that
address's jobs alone). Hierarchical, not flat between visitors: one address's many sessions share one
address's turns, so a client that opens a session per request (or a class) gets one turn a round beside
every other address however many sessions it opens, and a visitor on an address of its own is never
queued behind thirty of another's; a flat order would give that address thirty turns for its one.
A turn is a slice of a job, not
the whole job: a generation running on the model passes it (`pass_turn`, called by serving between
the engine's rounds, engine.gate) when another visitor waits (another session of its own address too), and
queues for its next turn. So a visitor's extra jobs
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
        self._round: dict[Job, int] = {}  # each waiting or holding job's round among the addresses
        self._latest: dict[str, int] = {}  # each address's latest round
        self._now = 0  # the round of the job holding the model (or of the last one that did)
        # one level down, within each address: each job's round among its address's visitors, each visitor's
        # latest, and each address's own `now` (the round among its visitors of its job that last took the model)
        self._sround: dict[Job, int] = {}
        self._slatest: dict[tuple[str, str], int] = {}
        self._snow: dict[str, int] = {}

    def wait(self, job: Job, deadline: float, step_s: float = STEP_S) -> Iterator[int]:
        """Wait for the model: yields the job's place (1 = next) at once when it cannot take the model, then
        every `step_s` while others run; returns True once the job holds the model, False if it was told to
        end or the deadline passed first. A generator: `held = yield from turns.wait(job, deadline)`."""
        with self._cond:
            self._queue.append(job)
            self._round[job] = self._latest[job.origin] = max(self._now, self._latest.get(job.origin, -1) + 1)
            self._sround[job] = self._slatest[job.who] = max(self._snow.setdefault(job.origin, 0),
                                                             self._slatest.get(job.who, -1) + 1)
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
            # its address's next turn is the next round, its address's waiting jobs each one round back (its turns
            # keep their order); among its address's visitors, the same one level down: behind the others waiting
            self._requeue(self._round, self._latest, job, lambda j: j.origin, self._now)
            self._requeue(self._sround, self._slatest, job, lambda j: j.who, self._snow.get(job.origin, 0))
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
                self._sround.pop(job, None)
                self._forget_idle()
                self._cond.notify_all()

    def others_waiting(self, job: Job) -> bool:
        """Whether a job of another visitor than `job`'s (another session, of its address too) waits for the model."""
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
        slots = self._slots()
        if not slots or slots[0][2] is not job or not self._seat_for(job):
            return False
        turn = slots[0][0]  # its address's next turn: the job whose round it was takes this job's round instead
        owner = next((j for j in tuple(self._queue) if j.origin == job.origin and j is not job
                      and self._round.get(j) == turn), None)
        if owner is not None:
            self._round[owner] = self._round[job]
        self._round[job] = turn
        self._queue.remove(job)
        self._holders.add(job)
        self._now, self._snow[job.origin] = turn, self._sround[job]
        return True

    def _seat_for(self, job: Job) -> bool:
        """A free model, or a free seat beside holders that all share (and `job` shares too)."""
        holders = tuple(self._holders)
        return not holders or (job.shares and len(holders) < self.seats and all(j.shares for j in holders))

    def _order(self) -> list[Job]:
        return [job for _, _, job in self._slots() if job in self._round]  # less any that left meanwhile

    def _slots(self) -> list[tuple[int, int, Job]]:
        """The waiting jobs in order, each with the turn it takes (round, arrival): an address's turns are its
        jobs' (round, arrival) among the addresses, sorted; its jobs take them in their order among its visitors."""
        queue, rounds, srounds = list(self._queue), dict(self._round), dict(self._sround)
        arrival = {job: n for n, job in enumerate(queue)}
        by_address: dict[str, list[Job]] = {}
        for job in queue:
            if job in rounds and job in srounds:
                by_address.setdefault(job.origin, []).append(job)
        slots = []
        for jobs in by_address.values():
            turns = sorted((rounds[j], arrival[j]) for j in jobs)
            takers = sorted(jobs, key=lambda j: (srounds[j], arrival[j]))
            slots += [(r, n, j) for (r, n), j in zip(turns, takers)]
        return sorted(slots, key=lambda slot: slot[:2])

    def _place(self, job: Job) -> int:
        order = self._order()
        return order.index(job) + 1 if job in order else 0

    def _left(self, job: Job) -> None:
        """A job left the queue before its turn: its address keeps its earliest turns (the job's round goes to
        the address's waiting job of the latest), and its round is free for its visitor's next job."""
        mine = self._round.pop(job)
        last = max((j for j in tuple(self._queue) if j.origin == job.origin and j in self._round),
                   key=lambda j: self._round[j], default=None)
        if last is not None and self._round[last] > mine:
            self._round[last], mine = mine, self._round[last]
        self._free(self._round, self._latest, job.origin, mine, lambda j: j.origin)
        self._free(self._sround, self._slatest, job.who, self._sround.pop(job), lambda j: j.who)
        self._forget_idle()

    @staticmethod
    def _free(rounds: dict, latest: dict, key, gone: int, key_of) -> None:
        """Round `gone` of `key` (an address or a visitor) is no one's now: its latest is its jobs' latest."""
        if latest.get(key) == gone:
            latest[key] = max((r for j, r in dict(rounds).items() if key_of(j) == key), default=gone - 1)

    def _requeue(self, rounds: dict, latest: dict, job: Job, key, now: int) -> None:
        """`job` queues again at round now + 1 among its key's (address or visitor) jobs, those waiting one back."""
        for other in tuple(self._queue):
            if key(other) == key(job) and other in rounds:
                rounds[other] += 1
        rounds[job] = now + 1
        latest[key(job)] = max(r for j, r in dict(rounds).items() if key(j) == key(job))

    def _forget_idle(self) -> None:
        """Forget addresses and visitors with nothing here whose next job would start at the current round anyway
        (an address with nothing here starts afresh among its visitors)."""
        jobs = list(self._round)
        active, here = {j.origin for j in jobs}, {j.who for j in jobs}
        for who, r in dict(self._latest).items():  # in place: a finaliser's own changes meanwhile are kept
            if who not in active and r + 1 <= self._now:
                self._latest.pop(who, None)
        for address in [a for a in dict(self._snow) if a not in active]:
            self._snow.pop(address, None)
        for visitor, r in dict(self._slatest).items():
            if visitor not in here and (visitor[0] not in active or r + 1 <= self._snow.get(visitor[0], 0)):
                self._slatest.pop(visitor, None)

    @property
    def busy(self) -> bool:
        with self._cond:
            return bool(self._holders)

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)
