"""What a job holds of a shared model, as one object: the lease that keeps the model loaded
(serving.registry) and the model's turn (serving.turns), given back together by one idempotent
`release()`.

    hold = Hold(registry, job)
    lm = yield from hold.lease(name, deadline)   loaded in a thread if needed, its progress streamed
    held = yield from hold.take_turn()           its place streamed when the place changes
    hold.start(run)                              the work in a worker thread, which releases the hold
                                                 when the work really ends, never before
    hold.close()                                 the stream is done: releases, unless a worker has it

The generators yield updates for the client (Status) and TICKs: a TICK is for serving only (never
sent), the moment to look at the job's stop flag and whether its client is still there.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Callable

from hispec.serving.jobs import TIME_LIMIT, Job
from hispec.serving.registry import ModelRegistry
from hispec.serving.turns import Turns
from hispec.serving.updates import Status, Waiting

HEARTBEAT_S = 1.0  # longest silence of a job that waits: how often serving looks at it
TICK = object()  # an update for serving only (see above)
_END = object()


class Hold:
    def __init__(self, registry: ModelRegistry, job: Job):
        self.registry, self.job = registry, job
        self.name: str | None = None  # the model leased (None: none yet)
        self.turns: Turns | None = None  # the model's turns, once the job waits for one or holds it
        # Re-entrant: a client's abandoned update stream is finalised by the garbage collector, in whatever thread
        # allocates next, and its `finally` (Server._forget) takes this lock: inside this very lock, a plain Lock
        # deadlocked every request (seen in a CI-like run of the load test: Jobs.open -> the collector -> Server.serve's
        # finally -> Jobs.close, the same thread waiting for itself).
        self._lock = threading.RLock()
        self._released = False
        self._working = False  # a worker thread has the hold: it releases it

    def lease(self, name: str, deadline: float):
        """The model, leased to the job (a generator: `lm = yield from hold.lease(...)`); None when the
        job was stopped or ran out of time while it loaded. A load goes on for everybody if it leaves."""
        if name not in self.registry.loaded():
            yield Status(f"Loading model {name}… (the first start of the default model converts it, ~20 s)")
            messages: queue.Queue = queue.Queue()
            error: list[BaseException] = []

            def load():
                try:
                    self.registry.get(name, progress=messages.put)
                except BaseException as exc:
                    error.append(exc)
                finally:
                    messages.put(_END)

            threading.Thread(target=load, name="hispec-load", daemon=True).start()
            while (message := _next(messages)) is not _END:
                if message is TICK and (self.job.stop.is_set() or time.monotonic() >= deadline):
                    out_of_time(self.job, deadline)
                    return None
                yield message if message is TICK else Status(str(message))
            if error:
                raise error[0]
        lm = self.registry.acquire(name)
        self.name = name
        return lm

    def take_turn(self):
        """Wait for the model's turn, however long (the wait is not counted against the time limit):
        a generator returning True once the job holds it, False if the job was told to end first. A job
        that cannot take it at once hears so at once (serving.updates.Waiting), then whenever its place changes."""
        self.turns = self.registry.turns(self.name)
        waiting, said = self.turns.wait(self.job, float("inf")), None
        try:
            while True:
                ahead = next(waiting) - 1 + int(self.turns.busy)  # those queued before it, and the one running
                if ahead == said:
                    yield TICK
                    continue
                said = ahead
                yield Waiting.behind(ahead)
        except StopIteration as end:
            return bool(end.value)
        finally:
            waiting.close()

    def start(self, run: Callable[[], None], then: Callable[[], None]) -> None:
        """Run `run` in a worker thread that has the hold: when `run` returns, it releases the hold,
        then calls `then` (the stream hears the end after the model is free for the next job)."""
        def worker():
            try:
                run()
            finally:
                try:
                    self.release()
                finally:
                    then()  # the stream hears the end even if the release failed

        self._working = True
        threading.Thread(target=worker, name=f"hispec-{self.job.kind}-{self.job.id}", daemon=True).start()

    def release(self) -> None:
        """Give back the turn, then the lease; once (later calls do nothing)."""
        with self._lock:
            if self._released:
                return
            self._released = True
        try:
            if self.turns is not None:
                self.turns.release(self.job)
        finally:  # the lease is given back whatever the turn's release did
            if self.name is not None:
                self.registry.release(self.name)

    def close(self) -> None:
        """The job's stream is done with it: release, unless a worker has the hold (it releases it)."""
        if not self._working:
            self.release()

    @property
    def released(self) -> bool:
        return self._released


def out_of_time(job: Job, deadline: float) -> None:
    if time.monotonic() >= deadline:
        job.end(TIME_LIMIT)


def _next(messages: queue.Queue):
    try:
        return messages.get(timeout=HEARTBEAT_S)
    except queue.Empty:
        return TICK
