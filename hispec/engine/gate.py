"""Where a generation gives way between rounds, so that one model can be shared round by round.

Serving runs each visitor's job in its own worker thread, and the model's turn passes between jobs
at round boundaries (iteration-level scheduling). The engine knows nothing of visitors: it calls
``give_way()`` after every round, which does nothing unless the thread running the generation is
inside ``gated(fn)``; then ``fn()`` may block until this job's next turn. The decoder keeps its clock
still while it waits (``Decoder``'s elapsed times count its own compute only), so a shared model does
not distort a job's tokens/s or its timed pairs against plain decoding.

The gate may also say whether another job waits for the model (``others_waiting()``): work that is
optional for the visitor who asked (the timing pairs after a run) gives way to it rather than share.
"""

from __future__ import annotations

import contextvars
import time
from contextlib import contextmanager
from typing import Callable, Iterator

_gate: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar("hispec_round_gate", default=None)
_waiting: contextvars.ContextVar[Callable[[], bool] | None] = contextvars.ContextVar("hispec_others_waiting",
                                                                                      default=None)


def give_way() -> float:
    """Let the current gate (if any) hand the model to another job; the seconds spent waiting."""
    fn = _gate.get()
    if fn is None:
        return 0.0
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def others_waiting() -> bool:
    """Whether another job waits for the model now (False outside a gate, or when the gate cannot tell)."""
    fn = _waiting.get()
    return bool(fn()) if fn is not None else False


@contextmanager
def gated(fn: Callable[[], None], waiting: Callable[[], bool] | None = None) -> Iterator[None]:
    """Generations run in this thread inside the block call `fn` between their rounds; `waiting`: whether
    another job waits for the model (what `others_waiting()` asks)."""
    token, told = _gate.set(fn), _waiting.set(waiting)
    try:
        yield
    finally:
        _waiting.reset(told)
        _gate.reset(token)
