"""The requests in flight, so that a Stop reaches each one: queued, loading or running.

A job is registered the moment a request is admitted and forgotten when its last update is sent.
A session (a browser tab, an API client) may have several jobs at once; a Stop names the session
and the kinds it ends (the page's Stop ends its generation-like jobs, the Benchmark tab's Stop its
benchmark), and reaches every matching job, whichever started first or ended last.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Iterable

STOPPED, TIME_LIMIT, LEFT = "stopped", "time limit", "left"  # why a job was told to end


@dataclass(eq=False)
class Job:
    id: int
    session: str
    kind: str
    stop: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None  # the first reason it was told to end (None: it was not)

    def end(self, reason: str) -> None:
        """Tell the job to end (its work checks `stop` between steps); the first reason stays."""
        if not self.stop.is_set():
            self.reason = reason
            self.stop.set()


class Jobs:
    def __init__(self):
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def open(self, session: str, kind: str) -> Job:
        with self._lock:
            job = Job(next(self._ids), session, kind)
            self._jobs[job.id] = job
            return job

    def close(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job.id, None)

    def stop(self, session: str, kinds: Iterable[str] | None = None) -> int:
        """End the session's jobs of these kinds (all kinds: None); returns how many were told."""
        kinds = None if kinds is None else set(kinds)
        with self._lock:
            hit = [j for j in self._jobs.values() if j.session == session and (kinds is None or j.kind in kinds)]
        for job in hit:
            job.end(STOPPED)
        return len(hit)

    def of(self, session: str | None = None) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if session is None or j.session == session]
