"""Every generation's committed tokens in this process, so that a run can say what the machine wrote while it
ran: its own tokens/s beside the machine's (runs.record.MachinePace).

One meter serves the process (``METER``): the machine's cores are one resource, whichever model or seat a
generation holds. Serving (serving.worker) counts the visitors' generations as their updates pass through it
(`metered`): a watch opened at a generation's first engine event, the tokens each batch commits added, the watch
closed at its DoneEvent (or when its stream ends without one: a client that left, a fault), so a watch never
outlives its stream. Counts follow the streams' batches (the throttle period), which is fine for a run's
average and says nothing finer.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from hispec.engine.events import COMMITTED_STATES, DoneEvent, Event, TokenEvent
from hispec.runs.record import MachinePace


@dataclass
class Watch:
    """One generation's view of the meter, from its first event on."""

    meter: Meter
    tokens_at_start: int
    since: float
    own: int = 0
    visitors: int = 1
    closed: bool = False

    def add(self, n: int) -> None:
        """This generation committed n more tokens (the machine's count too)."""
        if n:
            self.own += n
            self.meter._add(n)

    def close(self) -> MachinePace | None:
        """What the machine wrote from this watch's start until now; None when closed before."""
        if self.closed:
            return None
        return self.meter._close(self)


class Meter:
    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens = 0
        self._live: list[Watch] = []

    def watch(self) -> Watch:
        """A generation starts writing: its watch (every live watch sees one more generation at once)."""
        with self._lock:
            w = Watch(self, self._tokens, self._clock())
            self._live.append(w)
            for other in self._live:
                other.visitors = max(other.visitors, len(self._live))
            return w

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._live)

    def _add(self, n: int) -> None:
        with self._lock:
            self._tokens += n

    def _close(self, w: Watch) -> MachinePace | None:
        with self._lock:
            if w.closed:
                return None
            w.closed = True
            self._live.remove(w)
            return MachinePace(tokens=int(self._tokens - w.tokens_at_start), own_tokens=w.own,
                               seconds=max(0.0, self._clock() - w.since), visitors=w.visitors)


METER = Meter()


def metered(batch: list, watch: Watch | None) -> Watch | None:
    """A generation's batch of updates counted on METER: its watch opened at its first engine event, its committed
    tokens added, and at its DoneEvent the watch closed into a MachinePace put in the batch right after it. What
    follows the run (its timing pairs) is not counted."""
    if watch is not None and watch.closed:
        return watch
    for i, item in enumerate(batch):
        if not isinstance(item, Event):
            continue
        watch = watch or METER.watch()
        if isinstance(item, TokenEvent) and item.state in COMMITTED_STATES:
            watch.add(1)
        if isinstance(item, DoneEvent):
            pace = watch.close()
            if pace is not None:
                batch.insert(i + 1, pace)
            break
    return watch
