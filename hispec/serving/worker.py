"""A job's work in a worker thread, and what it emits, streamed in batches (serving.session).

The work runs under the job's hold (serving.hold: released when the work really ends, never
before) and its share of the model (serving.share: the turn passed between the engine's rounds).
What it emits is collected over the throttle period (or a heartbeat's silence) and streamed: its
progress text as a Status, the rest as an Output; an empty Output is a heartbeat. The time limit is
told to the work when it passes; a work that does not notice is waited for GRACE_S more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import time

from hispec.engine.events import DoneEvent
from hispec.engine.gate import gated
from hispec.model.shared import BOARD
from hispec.runs.meter import metered
from hispec.serving.hold import HEARTBEAT_S, Hold, out_of_time
from hispec.serving.jobs import LEFT, STOPPED, TIME_LIMIT, Job
from hispec.serving.protocol import Work
from hispec.serving.share import Share
from hispec.serving.updates import Output, Status

log = logging.getLogger("hispec.serving")

GRACE_S = 10.0  # after the time limit, how long the stream waits for the work to notice before it ends
# a generation cut short ends with this reason (its DoneEvent's, in the page's stats and the API's finish_reason)
FINISH_REASONS = {STOPPED: "stopped", TIME_LIMIT: "time_limit", LEFT: "left"}
_END = object()


class Failure:
    """The exception that ended a work."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class Worker:
    def __init__(self, job: Job, work: Work, hold: Hold, share: Share, throttle_s: float):
        self.job, self.work, self.hold, self.share, self.throttle_s = job, work, hold, share, throttle_s
        self._items: queue.Queue = queue.Queue()

    def start(self) -> None:
        self.hold.start(self._run, then=lambda: self._items.put(_END))

    def _run(self) -> None:
        try:
            # between the engine's rounds: share the model round by round; the timing pairs ask whether anyone waits
            with gated(self.share.give_way, waiting=self.share.others_waiting), self._member() as tally:
                out = self.work(self.job.stop, self._items.put)  # a generator yields its items; other work emits
                for item in out or ():
                    self._items.put(item)
            if tally is not None and tally.shared_calls:  # what sharing the machine did to this run (the page says)
                self._items.put(tally)
        except BaseException as exc:  # handed to the stream, reported there
            self._items.put(Failure(exc))

    def _member(self):
        """A sharing job's passes meet those of the others holding the model (model.shared's board)."""
        return BOARD.member() if self.job.shares else contextlib.nullcontext(None)

    def stream(self):
        """The work's updates (Status, Output); returns its Failure, or None when it ended (or the
        time limit passed and it did not notice within GRACE_S)."""
        watch = None  # a visitor's generation on the machine's meter (runs.meter: "your speed / the machine's")
        try:
            while True:
                batch, done, failure = self._collect()
                watch = metered(batch, watch) if self.job.kind == "generate" else None
                notes = [item for item in batch if isinstance(item, str)]  # progress text of the work
                batch = [honest(item, self.job) for item in batch if not isinstance(item, str)]
                if notes:
                    yield Status(notes[-1])
                if batch or not (done or failure or notes):
                    yield Output(tuple(batch))  # an empty Output is a heartbeat
                if failure is not None:
                    log.error("%s failed", self.job.kind, exc_info=failure.exc)
                    return failure
                if done or time.monotonic() > self.share.deadline() + GRACE_S:
                    return None
        finally:
            if watch is not None:
                watch.close()

    def _collect(self):
        """What the worker emitted over one throttle period (or a heartbeat's silence): (items, ended,
        failure). Sets the time limit once it has passed."""
        batch: list = []
        first_by, batch_by = time.monotonic() + HEARTBEAT_S, None
        while True:
            now, deadline = time.monotonic(), self.share.deadline()
            out_of_time(self.job, deadline)
            until = batch_by if batch_by is not None else first_by
            if not self.job.stop.is_set():
                until = min(until, deadline)  # wake at the deadline to tell the work
            try:
                item = self._items.get(timeout=max(0.0, until - now))
            except queue.Empty:
                return batch, False, None
            if item is _END:
                return batch, True, None
            if isinstance(item, Failure):
                return batch, False, item
            batch.append(item)
            if batch_by is None:
                batch_by = time.monotonic() + self.throttle_s


def honest(item, job: Job):
    """A generation the engine saw stopped says what stopped it: a Stop, the time limit, or a client
    that left (the engine only knows its stop flag was set)."""
    if isinstance(item, DoneEvent) and item.reason == "stopped" and job.reason in FINISH_REASONS:
        return dataclasses.replace(item, reason=FINISH_REASONS[job.reason])
    return item
