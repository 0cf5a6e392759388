"""Whether a client is still there: the update streams open for its session, as the edge sees them.

A request's updates reach its client over an update stream (Gradio's `/queue/data?session_hash=...`,
or `/call/<api>/<event_id>` for a REST client). The edge (serving.edge) sees every such stream open
and close, and tells `Streams`. A client is gone only when no stream has been open for its session
for ABSENT_S (a page between two events, a dropped connection that comes back, may close one for a
moment), or, before its first stream, once it has had FIRST_OPEN_S to open one (a client on a busy
host or a slow network opens its stream late; one that never opens it is gone after that). How many
updates lie unread says nothing: a live client on a busy host reads late, and was ended for it.

Only requests whose stream the edge can see are judged (Caller.watched); the command line and tests
calling serving directly are always there.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable

FIRST_OPEN_S = 30.0  # how long a client may take to open its first update stream
ABSENT_S = 10.0  # how long no stream may be open for a client that had one before it counts as gone
MAX_SESSIONS = 10_000  # sessions whose last close is remembered (the oldest go first): bounded memory
FORGET_S = 600.0  # a close older than this is forgotten (a client so long gone is gone either way)


class Streams:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.RLock()  # re-entrant, as Jobs' (a stream finalised by the collector)
        self._open: dict[str, int] = {}  # session -> streams open now
        self._closed: OrderedDict[str, float] = OrderedDict()  # session -> when its last stream closed

    def opened(self, session: str) -> None:
        with self._lock:
            self._open[session] = self._open.get(session, 0) + 1

    def closed(self, session: str) -> None:
        now = self._clock()
        with self._lock:
            left = self._open.get(session, 0) - 1
            if left > 0:
                self._open[session] = left
                return
            self._open.pop(session, None)
            self._closed.pop(session, None)
            self._closed[session] = now  # the newest end
            while self._closed and (len(self._closed) > MAX_SESSIONS
                                    or now - next(iter(self._closed.values())) > FORGET_S):
                self._closed.popitem(last=False)

    def gone(self, session: str, since: float) -> bool:
        """Whether the client of `session` is gone, for a request it made at `since` (time.monotonic())."""
        now = self._clock()
        with self._lock:
            if self._open.get(session):
                return False
            closed = self._closed.get(session)
        if closed is None or closed < since:  # no stream of it has been open since the request
            return now - since >= FIRST_OPEN_S
        return now - closed >= ABSENT_S

    def open_now(self, session: str) -> int:
        with self._lock:
            return self._open.get(session, 0)
