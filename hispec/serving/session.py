"""Every request of the page and the API, from admission to its last update, in one place.

    submitted                                         when its request arrived: a later Stop ends it
    cheap checks (the request's own: sizes, types)   microseconds, before anything else
    registered as a job                               a Stop made since it was submitted ends it here
    rate limits per visitor (a session within an address) and per address, then a fair share per address
                                                      when everyone together is over the overall figure
    the model allow-list
    room in the queue
    the model, leased (loaded if needed, progress streamed)   kept loaded until the job ends (serving.hold)
    prepare(model): tokenize, resolve, token limits
    the model's turn, fair between visitors          its place streamed when it changes; a Stop applies
    the work in a worker thread                       its items streamed in batches; the time limit counts
    the end: done, stopped, time limit, failed, refused, or the client left

What serving asks of a request is declared in serving.protocol; the requests are serving.api's.
A Stop is never lost: it is remembered from the moment it arrives and ends every job of that
session (and kind) submitted before it, registered yet or not (serving.jobs). The time limit counts
the job's own time on the model, from its turn: waiting behind other visitors is not counted
(serving.turns shares the turns out between visitors). The model is shared round by round: a
generation passes its turn between the engine's rounds once it has had its slice and another
visitor waits (serving.share), so a short request never waits for a long one to finish; the paused
time counts neither against the time limit nor in the job's speed figures. The job's lease and turn
are one Hold, released once: by the worker when the work really ends, never before, or by the
stream when no worker took it. Every ending says which it was: the last update's outcome and
message, and a generation cut by a Stop or by the time limit ends with its DoneEvent's reason
"stopped" or "time_limit". A client is gone, and its job ends as "the client left", when no update
stream has been open for it for a while, or it never opened one (serving.presence: the edge sees
every stream open and close); a queued job ends at once. Updates are three small types
(serving.updates); the page and the API turn them into what they show.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Iterable, Iterator

from hispec.errors import HiSpecError
from hispec.serving.api import CostsRequest
from hispec.serving.caller import Caller, caller_of
from hispec.serving.hold import TICK, Hold
from hispec.serving.jobs import LEFT, STOPPED, TIME_LIMIT, Job, Jobs
from hispec.serving.limits import Limits
from hispec.serving.presence import Streams
from hispec.serving.protocol import Request
from hispec.serving.addresses.ratelimit import RateLimits
from hispec.serving.registry import ModelRegistry
from hispec.serving.share import Share
from hispec.serving.updates import Ended, Output, Status
from hispec.serving.worker import Worker
from hispec.text import sentence

log = logging.getLogger("hispec.serving")


class Server:
    def __init__(self, registry: ModelRegistry, limits: Limits, default_model: str | None = None,
                 throttle_s: float = 0.3):
        self.registry, self.limits, self.throttle_s = registry, limits, throttle_s
        loaded = registry.loaded()
        self.default_model = default_model or (loaded[0] if loaded else "default")
        self.rates = RateLimits(limits.rate_per_minute, limits.global_rate_per_minute,
                                per_address=limits.address_rate_per_minute)
        self.jobs = Jobs()
        self.streams = Streams()  # the update streams open per session (the edge tells it)
        self.room = WaitingRoom(limits.queue_size)

    def caller(self, request) -> Caller:
        return caller_of(request, self.limits.proxies)

    def stop(self, caller: Caller, kinds: Iterable[str] | None = None) -> int:
        """End the caller's jobs of these kinds submitted before this Stop, queued or running, and
        those not registered yet (remembered, serving.jobs); how many were registered."""
        return self.jobs.stop(caller.session, kinds, at=caller.arrived)

    # ---- one request ----------------------------------------------------------------------------
    def submit(self, caller: Caller, request_type: type[Request], raw: dict) -> Iterator[Status | Output | Ended]:
        """serve() a request of `request_type` (serving.api) from its raw fields; submitted now (or
        when its HTTP request arrived, caller.arrived), so a Stop made after this call reaches it."""
        submitted = caller.arrived if caller.arrived is not None else time.monotonic()
        return self.serve(caller, request_type.kind, lambda: request_type.parse(raw, self.limits), submitted)

    def serve(self, caller: Caller, kind: str, parse: Callable[[], Request],
              submitted: float | None = None) -> Iterator[Status | Output | Ended]:
        """The updates of one request; the last is always an Ended. `parse()` checks the request's
        own fields and returns it (serving.protocol); `submitted`: when the request was made
        (time.monotonic(); default: when serving starts). A job whose client is gone
        (serving.presence) ends as the client left."""
        submitted = time.monotonic() if submitted is None else submitted
        try:
            request = parse()
        except HiSpecError as exc:
            yield refused(kind, caller, exc)
            return
        except Exception as exc:  # a check choking on odd input: a message, never a crash
            log.exception("%s could not be read", kind)
            yield Ended("failed", f"Could not read this request ({type(exc).__name__}: {exc}).")
            return
        job = self.jobs.open(caller.session, kind, submitted, address=caller.address)
        hold = Hold(self.registry, job)
        updates = self._serve(caller, request, job, hold)
        try:
            for update in updates:
                if isinstance(update, Ended):
                    # the last update: the job's turn, lease and registration are given back before the
                    # client hears it, whatever the consumer does next (one that stops iterating without
                    # closing, its generator kept alive by an exception's traceback, held the model's
                    # turn for everybody when a Stop landed just after the turn was taken)
                    updates.close()
                    self._forget(job, hold)
                    yield update
                    return
                if update is not TICK:
                    yield update
                if caller.watched and self.streams.gone(caller.session, submitted):
                    job.end(LEFT)
        finally:
            updates.close()
            self._forget(job, hold)

    def _serve(self, caller: Caller, request: Request, job: Job, hold: Hold):
        deadline, what = time.monotonic() + self.limits.max_seconds, request.what
        try:
            if job.stop.is_set():  # a Stop made since it was submitted: nothing is counted or queued
                yield self._ended(job, f"before the {what} started")
                return
            try:
                if not request.follow_up:  # a run's follow-up was counted with the run
                    self.rates.admit(caller.address, caller.session)  # per visitor, and per address
                name = self.limits.check_model(request.model or self.default_model)
                with self.room.entered():
                    lm = yield from hold.lease(name, deadline)
                    work = None if lm is None else request.prepare(lm, self.limits)
                    job.shares = request.shares_pass  # a generation holds the model beside others where it can
                    # a request that runs nothing on the model (a load) does not wait for its turn
                    held = lm is not None and (not request.needs_turn or (yield from hold.take_turn()))
            except HiSpecError as exc:
                yield refused(job.kind, caller, exc)
                return
            if not held or job.stop.is_set():
                yield self._ended(job, f"before the {what} started")
                return
            # the time limit counts the job's own time on the model, from its turn
            worker = Worker(job, work, hold, Share(hold.turns, job, self.limits.max_seconds), self.throttle_s)
            worker.start()
            failure = yield from worker.stream()
            if failure is not None:
                yield Ended("failed", f"The {what} failed ({type(failure.exc).__name__}: {failure.exc}). "
                                      "The app is still running; try again.")
                return
            yield self._ended(job, "")
        except GeneratorExit:  # the client left: its update stream was closed
            job.end(LEFT)
            raise
        except Exception as exc:  # a tokenizer or loader choking on odd input: a message, never a crash
            log.exception("%s failed before it started", job.kind)
            yield Ended("failed", f"Could not prepare this {what} ({type(exc).__name__}: {exc}).")

    def _forget(self, job: Job, hold: Hold) -> None:
        """The stream is done with the job (each step does nothing the second time)."""
        job.end(LEFT)  # no-op when it ended already; a worker still running stops
        self.jobs.close(job)
        hold.close()

    def result(self, caller: Caller, request_type: type[Request], raw: dict):
        """A request whose work yields one result (a run's follow-ups: serving.api.CostsRequest,
        BeliefsRequest), served like any other: admitted, queued, in its turn, under the time limit.
        Returns the result; raises HiSpecError with the ending's message when it did not finish."""
        last = None
        for update in self.submit(caller, request_type, raw):
            if isinstance(update, Output) and update.items:
                last = update.items[-1]
            elif isinstance(update, Ended) and not (update.ok and last is not None):
                raise HiSpecError(update.message)
        return last

    # ---- what the page reads of a loaded model ---------------------------------------------------
    def loaded_model(self, model: str | None = None):
        """A model already loaded, by a name the visitor may use (the allow-list applies; None: the start
        model): a preset reads its settings. Raises HiSpecError until it is loaded."""
        name = self.limits.check_model(model or self.default_model)
        if name not in self.registry.loaded():
            raise HiSpecError(f"model '{name}' is not loaded yet: press Load first")
        return self.registry.get(name)

    def pass_costs(self, caller: Caller, model: str, exits: tuple[int, ...]):
        """The loaded model's pass costs on this machine for these exits: those timed before, else measured
        in its turn (serving.api.CostsRequest, served like any request)."""
        known = getattr(self.loaded_model(model).ee, "cost_model", None)
        if known is not None and known.covers(exits):  # timed before: nothing to run, no need to wait
            return known
        return self.result(caller, CostsRequest, {"model": model, "exits": exits})

    def _ended(self, job: Job, when: str) -> Ended:
        """The last update: how the job ended; `when`: "before the generation started" or ""."""
        outcome = job.reason or "done"
        words = {STOPPED: "Stopped", LEFT: "The client left",
                 TIME_LIMIT: f"Cut at this server's time limit of {self.limits.max_seconds:g} s on the model per "
                             "request"}
        message = words.get(outcome, "Done")
        if job.overtaken_by is not None:  # serving.jobs.AHEAD_S: say which Stop, so a client can tell
            when += (f": a Stop of this session that found nothing running arrived {job.overtaken_by:.2f} s before "
                     "this request, and a Stop that overtakes its request still stops it; send it again")
        return Ended(outcome, f"{message} {when}." if when else f"{message}.")


class WaitingRoom:
    """The jobs loading a model or waiting for its turn, at most `size`: one more is refused."""

    def __init__(self, size: int):
        self.size, self.waiting = size, 0
        self._lock = threading.RLock()  # re-entrant as Jobs' (a stream finalised by the collector leaves the room)

    @contextlib.contextmanager
    def entered(self):
        with self._lock:
            if self.waiting >= self.size:
                raise HiSpecError(f"the server is busy: {self.waiting} requests are waiting for the model; "
                                  "try again in a minute")
            self.waiting += 1
        try:
            yield
        finally:
            with self._lock:
                self.waiting -= 1


def refused(kind: str, caller: Caller, exc: HiSpecError) -> Ended:
    log.info("refused %s from %s: %s", kind, caller.address, exc)  # one line, no traceback
    return Ended("refused", sentence(str(exc)))
