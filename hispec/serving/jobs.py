"""The requests in flight, so that a Stop reaches each one: queued, loading or running, and those not
registered yet.

A job is registered once its request passes its own checks, and forgotten when its last update is
sent. A session (a browser tab, an API client) may have several jobs at once; a Stop names the
session and the kinds it ends (the page's Stop ends its generation-like jobs, the Benchmark tab's
Stop its benchmark), and reaches every matching job, whichever started first or ended last.

A Stop is also remembered from the moment it arrives: a job of that session and kind submitted
before it (its request arrived earlier) is ended the moment it registers, however late that is.
So a Stop sent right after a request can never be lost in the gap before the job exists.

A Stop can also reach the server before the request it means: gradio_client's `submit()` returns
before the request is sent, and a Stop sent at once may overtake it. So a Stop that found nothing
of its session (and kind) to end also ends the first such request that arrives within AHEAD_S after
it, and only that one (a Stop that came over HTTP, stamped with its arrival: a caller in the same
process, the command line or a test, cannot overtake its own request). A request sent later than
that is not touched by it; an API client that must be sure waits for its request's event id (the
join answered) before it sends its Stop. The server cannot tell a Stop that overtook its request
from one that came just too late for a run that had finished: a request sent within AHEAD_S after
such a late Stop's "Nothing to stop" is stopped too, and its ending says so (serving.session).
(Taking a Stop that follows its session's last job within AHEAD_S as late lost 9 of 17 Stops sent
as gradio_client's submit() returned in the load test: sequential clients look the same.)
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

STOPPED, TIME_LIMIT, LEFT = "stopped", "time limit", "left"  # why a job was told to end
ALL_KINDS = "*"  # a remembered Stop of every kind
REMEMBER_S = 600.0  # how long a Stop is remembered for the requests submitted before it
AHEAD_S = 1.0  # a Stop that found nothing ends the first request of its session arriving this soon after it
MAX_REMEMBERED = 10_000  # Stops remembered at most (the oldest go first): a flood of Stops costs bounded memory


@dataclass(eq=False)
class Job:
    id: int
    session: str
    kind: str
    stop: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # the first reason it was told to end (None: it was not)
    overtaken_by: float | None = None  # stopped by a Stop that found nothing this many seconds before it arrived
    address: str = ""  # the client address (serving.caller); "": the session stands for its own address
    shares: bool = False  # may hold the model beside other sharing jobs, its passes shared (serving.turns)

    def end(self, reason: str) -> None:
        """Tell the job to end (its work checks `stop` between steps); the first reason stays."""
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()

    @property
    def who(self) -> tuple[str, str]:
        """The visitor: a session within an address (a class behind one school network is many visitors)."""
        return (self.origin, self.session)

    @property
    def origin(self) -> str:
        """The address whose visitors share its turns (serving.turns): the client address, else the session."""
        return self.address or self.session


class Jobs:
    def __init__(self, clock=time.monotonic):
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        # Re-entrant: a client's abandoned update stream is finalised by the garbage collector, in whatever thread
        # allocates next, and its `finally` (Server._forget) takes this lock: inside this very lock, a plain Lock
        # deadlocked every request (seen in a CI-like run of the load test: Jobs.open -> the collector -> Server.serve's
        # finally -> Jobs.close, the same thread waiting for itself).
        self._lock = threading.RLock()
        self._clock = clock
        self._stops: OrderedDict[tuple[str, str], float] = OrderedDict()  # (session, kind) -> the last Stop's time
        # (session, kind) -> the time of a Stop that found nothing, for the request that may arrive just after it
        self._ahead: OrderedDict[tuple[str, str], float] = OrderedDict()

    def open(self, session: str, kind: str, submitted: float | None = None, address: str = "") -> Job:
        """Register a job; `submitted`: when its request arrived (time.monotonic()). A Stop of its
        session and kind that arrived at or after that time ends it at once, and so does one that found
        nothing and arrived at most AHEAD_S before it (the first such request only)."""
        with self._lock:
            job = Job(next(self._ids), session, kind, address=address)
            self._jobs[job.id] = job
            stops = [self._stops.get((session, k)) for k in (kind, ALL_KINDS)]
            stopped_at = max((at for at in stops if at is not None), default=None)
            meant = submitted is not None and stopped_at is not None and stopped_at >= submitted
            if meant:  # the Stop found the request it was sent after: it overtook none
                for key in ((session, kind), (session, ALL_KINDS)):
                    self._ahead.pop(key, None)
            ahead = None if meant else self._overtaken(session, kind, submitted)
            if meant or ahead is not None:
                job.overtaken_by = ahead
                job.end(STOPPED)
        return job

    def _overtaken(self, session: str, kind: str, submitted: float | None) -> float | None:
        """How long before this request a Stop that found nothing arrived, if at most AHEAD_S (it is
        used up); None when none did."""
        if submitted is None:
            return None
        for key in ((session, kind), (session, ALL_KINDS)):
            at = self._ahead.get(key)
            if at is not None and 0.0 <= submitted - at <= AHEAD_S:
                del self._ahead[key]
                return submitted - at
        return None

    def close(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job.id, None)

    def stop(self, session: str, kinds: Iterable[str] | None = None, at: float | None = None) -> int:
        """End the session's jobs of these kinds (all kinds: None), and remember the Stop (made `at`,
        time.monotonic(); default now) for the ones submitted before it and not registered yet.
        Returns how many registered jobs were told."""
        kinds = None if kinds is None else set(kinds)
        stamped, at = at is not None, self._clock() if at is None else at
        with self._lock:
            for kind in (ALL_KINDS,) if kinds is None else sorted(kinds):
                key = (session, kind)
                self._stops[key] = max(at, self._stops.pop(key, at))  # moved to the newest end
            self._forget(self._clock())
            hit = [j for j in list(self._jobs.values())  # a copy: a finaliser may close a job meanwhile (Turns)
                   if j.session == session and (kinds is None or j.kind in kinds)]
            if not hit and stamped:  # it may have overtaken its request (over HTTP: a caller in-process cannot)
                for kind in (ALL_KINDS,) if kinds is None else sorted(kinds):
                    self._ahead.pop((session, kind), None)
                    self._ahead[(session, kind)] = at
        for job in hit:
            job.end(STOPPED)
        return len(hit)

    def _forget(self, now: float) -> None:
        """Drop the remembered Stops older than REMEMBER_S (AHEAD_S for those ahead of their request),
        and the oldest beyond MAX_REMEMBERED."""
        for stops, keep_s in ((self._stops, REMEMBER_S), (self._ahead, AHEAD_S)):
            while stops:
                key, at = next(iter(stops.items()))
                if now - at < keep_s and len(stops) <= MAX_REMEMBERED:
                    break
                del stops[key]

    def remembered(self) -> int:
        """How many Stops are remembered now."""
        with self._lock:
            return len(self._stops)

    def of(self, session: str | None = None) -> list[Job]:
        with self._lock:
            return [j for j in list(self._jobs.values()) if session is None or j.session == session]
