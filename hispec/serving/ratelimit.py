"""How often requests may come: per client address and from everyone, in a sliding minute.

The address is the client's (see serving/caller.py), not the Gradio session: a client can open a
new session for every request, it cannot change its address. Keys that have been idle for a whole
window are forgotten, so one-off visitors cost nothing after a minute.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Callable

from hispec.errors import ConfigError

EVERYONE = "*"  # the key of the overall limit


class RateLimited(ConfigError):
    """A request over a rate limit; the message says when to try again."""


class RateLimits:
    """At most `per_client` requests per address and `overall` requests from everyone in any
    window of `window_s` seconds (0 = no limit). A refused request is not counted."""

    def __init__(self, per_client: int, overall: int = 0, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self.per_client, self.overall, self.window_s = per_client, overall, window_s
        self._clock = clock
        self._seen: dict[str, deque] = {}
        self._lock = threading.Lock()
        self._swept: float | None = None  # when idle keys were last forgotten

    def admit(self, address: str, now: float | None = None) -> None:
        """Count one request from `address`, or raise RateLimited naming the limit and the wait."""
        now = self._clock() if now is None else now
        with self._lock:
            self._sweep(now)
            checks = [(address, self.per_client, f"at most {self.per_client} requests per minute from one address"),
                      (EVERYONE, self.overall, f"this server takes at most {self.overall} requests per minute "
                                               "from everyone")]
            checks = [c for c in checks if c[1]]
            for key, limit, words in checks:
                seen = self._recent(key, now)
                if len(seen) >= limit:
                    wait = max(1, round(self.window_s - (now - seen[0])))
                    raise RateLimited(f"rate limit: {words}; try again in {wait} s")
            for key, _, _ in checks:
                self._seen.setdefault(key, deque()).append(now)

    def _recent(self, key: str, now: float) -> deque:
        seen = self._seen.get(key) or deque()
        while seen and now - seen[0] >= self.window_s:
            seen.popleft()
        return seen

    def _sweep(self, now: float) -> None:
        """Forget keys idle for a whole window (at most once a window: O(keys) a minute)."""
        if self._swept is None:
            self._swept = now
        if now - self._swept < self.window_s:
            return
        self._swept = now
        for key in [k for k, seen in self._seen.items() if not seen or now - seen[-1] >= self.window_s]:
            del self._seen[key]

    def tracked(self) -> int:
        """How many keys are remembered now (the overall key included)."""
        with self._lock:
            return len(self._seen)
