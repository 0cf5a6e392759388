"""Every request of the page and the API, from admission to its last update, in one place.

    submitted                                         when its request arrived: a later Stop ends it
    cheap checks (the request's own: sizes, types)   microseconds, before anything else
    registered as a job                               a Stop made since it was submitted ends it here
    rate limit per client address, then a fair share when everyone together is over the overall figure
    the model allow-list
    room in the queue
    the model, loaded if needed (progress streamed)   kept loaded until the job ends
    prepare(model): tokenize, resolve, token limits
    the model's turn, fair between visitors          places streamed; a Stop applies
    the work in a worker thread                       its items streamed in batches; the time limit counts
    the end: done, stopped, time limit, failed, refused, or the client left

A Stop is never lost: it is remembered from the moment it arrives and ends every job of that
session (and kind) submitted before it, registered yet or not (serving.jobs). The time limit
counts the job's own time on the model, from its turn: waiting behind other visitors is not
counted (serving.turns shares the turns out between visitors). The model is shared round by round:
a generation passes its turn between the engine's rounds (engine.gate) once it has had SLICE_S of
it and another visitor waits, so a short request never waits for a long one to finish; the paused
time counts neither against the time limit nor in the job's speed figures (the decoder's clock
stands still while it waits). Every ending says which it was:
the last update's outcome and message, and a generation cut by a Stop or by the time limit ends
with its DoneEvent's reason "stopped" or "time_limit". A client that leaves (Gradio closes the
update stream when the connection drops) ends its job within a heartbeat; a queued job ends at
once. A client that never opened its update stream, or stopped reading it, ends its job once its
updates have lain unread for UNREAD_S (serving.caller counts them in Gradio's queue). The worker
releases the model's turn when the work really ends, never before. Updates are three small types
(serving.updates); the page and the API turn them into what they show.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from typing import Callable, Iterable, Iterator

from hispec.engine.events import DoneEvent
from hispec.engine.gate import gated
from hispec.errors import HiSpecError
from hispec.serving.caller import Caller, caller_of
from hispec.serving.jobs import LEFT, STOPPED, TIME_LIMIT, Job, Jobs
from hispec.serving.limits import Limits
from hispec.serving.ratelimit import RateLimits
from hispec.serving.registry import ModelRegistry
from hispec.serving.updates import Ended, Output, Status
from hispec.text import sentence

log = logging.getLogger("hispec.serving")

SLICE_S = 0.25  # a generation's turn on a shared model: it passes the model on after this much of its own time
HEARTBEAT_S = 1.0  # longest silence of an update stream: a dropped client is noticed at the next update
UNREAD_S = 5.0  # a client whose updates lie unread this long is gone: it never opened its stream, or left
READ_SLACK = 2  # updates that may wait for a client that does read (the one just sent, Gradio's own notices)
GRACE_S = 10.0  # after the time limit, how long the stream waits for the work to notice before it ends
# a generation cut short ends with this reason (its DoneEvent's, in the page's stats and the API's finish_reason)
FINISH_REASONS = {STOPPED: "stopped", TIME_LIMIT: "time_limit", LEFT: "left"}
# work(stop, emit): yields (or emits) what the stream passes on; a str is progress text (a Status)
Work = Callable[[threading.Event, Callable[[object], None]], Iterable[object] | None]
_END = object()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class _Reader:
    """Whether a client reads its updates: gone once more than READ_SLACK of them have lain unread
    for UNREAD_S without the pile shrinking (`unread`: serving.caller's count; None: always read)."""

    def __init__(self, unread: Callable[[], int] | None, clock: Callable[[], float] = time.monotonic):
        self.unread, self.clock = unread, clock
        self.read_at, self.last = clock(), 0

    def gone(self) -> bool:
        if self.unread is None:
            return False
        now, pile = self.clock(), self.unread()
        if pile <= READ_SLACK or pile < self.last:
            self.read_at = now
        self.last = pile
        return now - self.read_at >= UNREAD_S


class Server:
    def __init__(self, registry: ModelRegistry, limits: Limits, default_model: str | None = None,
                 throttle_s: float = 0.3):
        self.registry, self.limits, self.throttle_s = registry, limits, throttle_s
        loaded = registry.loaded()
        self.default_model = default_model or (loaded[0] if loaded else "default")
        self.rates = RateLimits(limits.rate_per_minute, limits.global_rate_per_minute)
        self.jobs = Jobs()
        self._waiting = 0  # jobs loading a model or waiting for its turn
        self._lock = threading.Lock()

    def caller(self, request) -> Caller:
        return caller_of(request, self.limits.trusted_proxies)

    def stop(self, caller: Caller, kinds: Iterable[str] | None = None) -> int:
        """End the caller's jobs of these kinds submitted before this Stop, queued or running, and
        those not registered yet (remembered, serving.jobs); how many were registered."""
        return self.jobs.stop(caller.session, kinds, at=caller.arrived)

    # ---- one request ----------------------------------------------------------------------------
    def submit(self, caller: Caller, request_type, raw: dict) -> Iterator[Status | Output | Ended]:
        """serve() a request of `request_type` (serving.api) from its raw fields; submitted now (or
        when its HTTP request arrived, caller.arrived), so a Stop made after this call reaches it."""
        submitted = caller.arrived if caller.arrived is not None else time.monotonic()
        return self.serve(caller, request_type.kind, lambda: request_type.parse(raw, self.limits), submitted)

    def serve(self, caller: Caller, kind: str, parse: Callable[[], object],
              submitted: float | None = None) -> Iterator[Status | Output | Ended]:
        """The updates of one request; the last is always an Ended. `parse()` checks the request's
        own fields and returns it (serving.api: `.model`, `.what`, `.prepare(lm, limits) -> work`);
        `submitted`: when the request was made (time.monotonic(); default: when serving starts).
        A job whose client does not read its updates (caller.unread) ends as the client left."""
        state = {"turns": None, "leased": None, "worker": False, "job": None}
        updates = self._serve(caller, kind, parse, submitted, state)
        reader = _Reader(caller.unread)
        try:
            for update in updates:
                if isinstance(update, Ended):
                    # the last update: the job's turn, lease and registration are given back before the
                    # client hears it, whatever the consumer does next (one that stops iterating without
                    # closing, its generator kept alive by an exception's traceback, held the model's
                    # turn for everybody when a Stop landed just after the turn was taken)
                    updates.close()
                    yield update
                    return
                yield update
                if state["job"] is not None and reader.gone():
                    state["job"].end(LEFT)
        finally:
            updates.close()

    def _serve(self, caller: Caller, kind: str, parse: Callable[[], object], submitted: float | None, state: dict):
        t0 = time.monotonic()
        submitted = t0 if submitted is None else submitted
        job: Job | None = None
        what = "request"
        try:
            try:
                request = parse()
                what = request.what
                job = state["job"] = self.jobs.open(caller.session, kind, submitted, visitor=caller.address)
                if job.stop.is_set():  # a Stop made since it was submitted: nothing is counted or queued
                    yield self._ended(job, f"before the {what} started")
                    return
                if not getattr(request, "follow_up", False):  # a run's follow-up was counted with the run
                    self.rates.admit(caller.address)
                name = self.limits.check_model(request.model or self.default_model)
                self._enter_queue()
            except HiSpecError as exc:
                yield self._refused(kind, caller, exc)
                return
            try:
                lm = yield from self._lease(name, job, t0 + self.limits.max_seconds, state)
                if lm is None:
                    yield self._ended(job, f"before the {what} started")
                    return
                work = request.prepare(lm, self.limits)
                turns = state["turns"] = self.registry.turns(name)
                held = True  # a request that runs nothing on the model (a load) does not wait for its turn
                if getattr(request, "needs_turn", True):
                    held = yield from self._wait_turn(turns, job, math.inf)  # the wait is not counted
            finally:
                self._leave_queue()
            if not held or job.stop.is_set():
                yield self._ended(job, f"before the {what} started")
                return
            # the time limit counts the job's own time on the model, from its turn
            yield from self._run(job, work, time.monotonic() + self.limits.max_seconds, state, what)
        except HiSpecError as exc:
            yield self._refused(kind, caller, exc)
        except GeneratorExit:  # the client left: its update stream was closed
            if job is not None:
                job.end(LEFT)
            raise
        except Exception as exc:  # a tokenizer or loader choking on odd input: a message, never a crash
            log.exception("%s failed before it started", kind)
            yield Ended("failed", f"Could not prepare this {what} ({type(exc).__name__}: {exc}).")
        finally:
            if job is not None:
                job.end(LEFT)  # no-op when it ended already; a worker still running stops
                self.jobs.close(job)
            if not state["worker"]:  # nothing was handed to a worker: give back what was taken here
                if state["turns"] is not None and job is not None:
                    state["turns"].release(job)
                if state["leased"]:
                    self.registry.release(state["leased"])

    def result(self, caller: Caller, request_type, raw: dict):
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

    # ---- the steps ------------------------------------------------------------------------------
    def _enter_queue(self) -> None:
        with self._lock:
            if self._waiting >= self.limits.queue_size:
                raise HiSpecError(f"the server is busy: {self._waiting} requests are waiting for the model; "
                                  "try again in a minute")
            self._waiting += 1

    def _leave_queue(self) -> None:
        with self._lock:
            self._waiting -= 1

    def _lease(self, name: str, job: Job, deadline: float, state: dict):
        """The model, leased to this job; loaded in a thread (progress streamed) when needed."""
        if name not in self.registry.loaded():
            yield Status(f"Loading model {name}… (the first start of the default model converts it, ~20 s)")
            messages: queue.Queue = queue.Queue()
            box: dict = {}

            def load():  # the load goes on for everybody even if this request leaves
                try:
                    self.registry.get(name, progress=messages.put)
                except BaseException as exc:
                    box["error"] = exc
                finally:
                    messages.put(_END)

            threading.Thread(target=load, name="hispec-load", daemon=True).start()
            while True:
                try:
                    message = messages.get(timeout=HEARTBEAT_S)
                except queue.Empty:
                    if job.stop.is_set() or time.monotonic() >= deadline:
                        self._out_of_time(job, deadline)
                        return None
                    yield Output(())
                    continue
                if message is _END:
                    break
                yield Status(str(message))
            if "error" in box:
                raise box["error"]
        lm = self.registry.acquire(name)
        state["leased"] = name
        return lm

    def _wait_turn(self, turns, job: Job, deadline: float):
        waiting = turns.wait(job, deadline)
        try:
            while True:
                ahead = next(waiting) - 1 + int(turns.busy)  # the ones queued before it, and the one running
                yield Status(f"Waiting for the model: {ahead} request{'s' if ahead != 1 else ''} ahead of "
                             "this one (one runs at a time).")
        except StopIteration as end:
            if not end.value:
                self._out_of_time(job, deadline)
            return bool(end.value)
        finally:
            waiting.close()

    def _run(self, job: Job, work: Work, deadline: float, state: dict, what: str):
        items: queue.Queue = queue.Queue()
        turns, leased = state["turns"], state["leased"]
        paused = [0.0]  # seconds this job's turn was with other visitors: the time limit does not count them
        pausing: list[float | None] = [None]  # since when it waits for its turn back (None: it holds the model)
        slice_start = [time.monotonic()]

        def give_way() -> None:  # between the engine's rounds (engine.gate): share the model round by round
            now = time.monotonic()
            if turns is None or now - slice_start[0] < SLICE_S:
                return
            pausing[0] = now
            try:
                turns.pass_turn(job)
            finally:
                paused[0] += time.monotonic() - now
                pausing[0] = None
            slice_start[0] = time.monotonic()

        def worker():
            try:
                with gated(give_way):
                    out = work(job.stop, items.put)  # a generator yields its items; other work emits them
                    for item in out or ():
                        items.put(item)
            except BaseException as exc:  # handed to the stream, reported there
                items.put(_Failure(exc))
            finally:
                turns.release(job)
                if leased:
                    self.registry.release(leased)
                items.put(_END)

        state["worker"] = True
        threading.Thread(target=worker, name=f"hispec-{job.kind}-{job.id}", daemon=True).start()
        def deadline_now() -> float:
            since = pausing[0]
            return deadline + paused[0] + (time.monotonic() - since if since is not None else 0.0)

        while True:
            batch, done, failure = self._collect(items, job, deadline_now)
            notes = [item for item in batch if isinstance(item, str)]  # progress text of the work
            batch = [self._honest(item, job) for item in batch if not isinstance(item, str)]
            if notes:
                yield Status(notes[-1])
            if batch or not (done or failure or notes):
                yield Output(tuple(batch))  # an empty Output is a heartbeat
            if failure is not None:
                log.error("%s failed", job.kind, exc_info=failure.exc)
                yield Ended("failed", f"The {what} failed ({type(failure.exc).__name__}: {failure.exc}). "
                                      "The app is still running; try again.")
                return
            if done:
                break
            if time.monotonic() > deadline_now() + GRACE_S:  # the work does not notice: stop waiting for it
                break
        yield self._ended(job, "")

    def _collect(self, items: queue.Queue, job: Job, deadline_now: Callable[[], float]):
        """What the worker emitted over one throttle period (or a heartbeat's silence):
        (items, worker ended, failure). Sets the time limit once it has passed (`deadline_now()`: the
        limit with the job's paused time added, as it stands now)."""
        batch: list = []
        first_by, batch_by = time.monotonic() + HEARTBEAT_S, None
        while True:
            now = time.monotonic()
            deadline = deadline_now()
            self._out_of_time(job, deadline)
            until = batch_by if batch_by is not None else first_by
            if not job.stop.is_set():
                until = min(until, deadline)  # wake at the deadline to tell the work
            try:
                item = items.get(timeout=max(0.0, until - now))
            except queue.Empty:
                return batch, False, None
            if item is _END:
                return batch, True, None
            if isinstance(item, _Failure):
                return batch, False, item
            batch.append(item)
            if batch_by is None:
                batch_by = time.monotonic() + self.throttle_s

    @staticmethod
    def _honest(item, job: Job):
        """A generation the engine saw stopped says what stopped it: a Stop, the time limit, or a
        client that left (the engine only knows its stop flag was set)."""
        if isinstance(item, DoneEvent) and item.reason == "stopped" and job.reason in FINISH_REASONS:
            return dataclasses.replace(item, reason=FINISH_REASONS[job.reason])
        return item

    @staticmethod
    def _out_of_time(job: Job, deadline: float) -> None:
        if time.monotonic() >= deadline:
            job.end(TIME_LIMIT)

    def _ended(self, job: Job, when: str) -> Ended:
        """The last update: how the job ended; `when`: "before the generation started" or ""."""
        outcome = job.reason or "done"
        words = {STOPPED: "Stopped", LEFT: "The client left",
                 TIME_LIMIT: f"Cut at this server's time limit of {self.limits.max_seconds:g} s on the model per "
                             "request"}
        message = words.get(outcome, "Done")
        return Ended(outcome, f"{message} {when}." if when else f"{message}.")

    @staticmethod
    def _refused(kind: str, caller: Caller, exc: HiSpecError) -> Ended:
        log.info("refused %s from %s: %s", kind, caller.address, exc)  # one line, no traceback
        return Ended("refused", sentence(str(exc)))
