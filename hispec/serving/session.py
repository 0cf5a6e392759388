"""One request of the app, served in one place: admission, the model's lock, a wall-time limit,
and the work in a worker thread whose results stream back.

The app's generate, compare and benchmark handlers all go through here, so every request is
limited, queued and stopped the same way; they only turn what comes back into pages. Updates are
plain dicts (`{"status": ...}`, `{"error": ..., "done": True}`), so they can cross ZeroGPU's
decorator.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from typing import Callable, Iterator

from hispec.engine.decoding import DecodeConfig, Decoder
from hispec.errors import HiSpecError
from hispec.serving.limits import Limits, RateLimiter
from hispec.serving.registry import ModelRegistry
from hispec.text import Detokenizer

log = logging.getLogger("hispec.app")
WAIT_STEP_S = 0.5


def error_update(message: str) -> dict:
    """The update that ends a request with a message for the visitor."""
    return {"error": message, "done": True}


def finite_number(name: str, value) -> float:
    """A visitor's number, or an error naming the field."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise HiSpecError(f"{name} must be a number (got {value!r})") from None
    if not math.isfinite(number) or isinstance(value, bool):
        raise HiSpecError(f"{name} must be a finite number (got {value!r})")
    return number


def whole_number(name: str, value) -> int:
    """A visitor's whole number (3, 3.0, "3"), or an error naming the field."""
    try:
        number = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number != int(number):
        raise HiSpecError(f"{name} must be a whole number (got {value!r})")
    return int(number)


class Guard:
    """The server's limits for one request: rate limit, prompt size, wall time."""

    def __init__(self, limits: Limits, rate: RateLimiter | None = None):
        self.limits = limits
        self.rate = rate or RateLimiter(limits.rate_per_minute)

    def admit(self, visitor: str, prompt_tokens: int, max_new_tokens: int) -> None:
        self.limits.check_request(prompt_tokens, max_new_tokens)
        self.rate.check(visitor)

    def timer(self, stop: threading.Event) -> tuple[threading.Timer, threading.Event]:
        """Sets `stop` once the request has run for the allowed wall time."""
        expired = threading.Event()

        def fire():
            expired.set()
            stop.set()

        timer = threading.Timer(self.limits.max_seconds, fire)
        timer.daemon = True
        return timer, expired


OPEN = Guard(Limits(max_prompt_tokens=10**9, max_new_tokens=10**9, max_seconds=10**9, rate_per_minute=0))


def _acquire(lock: threading.Lock, stop: threading.Event):
    """Wait for the model, telling the visitor why; gives up (returns False) on Stop."""
    while not lock.acquire(timeout=WAIT_STEP_S):
        if stop.is_set():
            return False
        yield {"status": "Waiting for another visitor's generation to finish…"}
    return True


def admitted(prepare: Callable, registry: ModelRegistry, model_name: str, stop: threading.Event, what: str):
    """Run `prepare()` (any error becomes a message), then wait for the model. Returns what
    `prepare` returned, with the model's generation lock held; None if the request ends here.
    A generator: `prepared = yield from admitted(...)` passes its updates on."""
    try:
        prepared = prepare()
    except HiSpecError as exc:
        yield error_update(str(exc))
        return None
    except Exception as exc:  # e.g. a tokenizer choking on odd input: a message, never a crash
        log.exception("could not prepare a %s", what)
        yield error_update(f"Could not prepare this request ({type(exc).__name__}: {exc}).")
        return None
    if not (yield from _acquire(registry.generation_lock(model_name), stop)):
        yield error_update(f"Stopped before the {what} started.")
        return None
    return prepared


_END = object()


def in_background(task: Callable[[Callable[[object], None]], None], lock: threading.Lock, throttle_s: float,
                  name: str = "hispec-request") -> Iterator[list]:
    """Run `task(emit)` in a worker thread (rendering never stalls it, nor enters its timings) and
    hand what it emits over in batches, at most one batch per `throttle_s`.
    The worker releases the model's lock when it ends, whatever happens here; an exception in the
    worker is raised here."""
    items: queue.Queue = queue.Queue()

    def work():
        try:
            task(items.put)
        except BaseException as exc:  # handed to the consumer, raised there
            items.put(exc)
        finally:
            lock.release()
            items.put(_END)

    threading.Thread(target=work, name=name, daemon=True).start()
    finished = False
    while not finished:
        batch, deadline = [], None
        while not finished:
            if deadline is None:  # block for the first item of a batch: no busy waiting
                item = items.get()
                deadline = time.perf_counter() + throttle_s
            else:
                try:
                    item = items.get(timeout=max(0.0, deadline - time.perf_counter()))
                except queue.Empty:
                    break
            if item is _END:
                finished = True
            elif isinstance(item, BaseException):
                raise item
            else:
                batch.append(item)
        if batch or finished:
            yield batch


def decode_in_background(lm, ids: list[int], config: DecodeConfig, lock: threading.Lock, stop: threading.Event,
                         throttle_s: float, judge: Callable[[str, int], int] | None = None,
                         before: Callable[[Callable[[object], None]], None] | None = None) -> Iterator[list]:
    """The engine's events of one generation, in batches (see in_background). The decoder is built
    in the worker, under the model's lock: its set-up may time the model (the adaptive policy's
    cost model), which must not run beside another visitor's generation.
    `judge`: TIMING ONLY acceptance (hispec.evaluation.timing_only); `before(emit)`: work run first
    under the same lock (e.g. a baseline measured side by side), emitting what it likes."""
    def task(emit):
        if before is not None:
            before(emit)
        for event in Decoder(lm.ee, ids, config, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer),
                             stop=stop, judge=judge).events():
            emit(event)

    return in_background(task, lock, throttle_s, "hispec-generation")


def under_model_lock(registry: ModelRegistry, model_name: str, work: Callable, timeout_s: float = 30.0):
    """`work(lm)` with the model's generation lock held, so that no other visitor's generation runs
    beside it (timings stay clean, caches stay apart). Raises HiSpecError when the model stays busy
    for `timeout_s`."""
    lm = registry.get(model_name)
    lock = registry.generation_lock(model_name)
    if not lock.acquire(timeout=timeout_s):
        raise HiSpecError("the model is busy with another visitor's generation; try again in a moment")
    try:
        return work(lm)
    finally:
        lock.release()


def model_costs_under_lock(registry: ModelRegistry, model_name: str, exits: tuple[int, ...],
                           timeout_s: float = 30.0):
    """This machine's pass and head costs for a model (engine.costs), timed once per model and exit
    under the model's lock. Raises HiSpecError when the model stays busy for `timeout_s`."""
    from hispec.engine.costs import model_costs

    exits = tuple(e for e in exits if e)
    known = getattr(registry.get(model_name).ee, "cost_model", None)
    if known is not None and known.covers(exits):  # timed before: nothing to run, no need to wait
        return known
    return under_model_lock(registry, model_name, lambda lm: model_costs(lm.ee, exits), timeout_s)
