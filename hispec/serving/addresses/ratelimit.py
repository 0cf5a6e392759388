"""How often requests may come: per visitor, per client address, and a fair share when everyone together
is busy, in a sliding minute.

A visitor is a session within an address (Gradio's session hash: one per browser tab or API client;
serving/caller.py): a class of thirty behind one school network is one address and thirty visitors, each
with the per-visitor figure. A client can open a new session for every request, though, and it cannot
change its address: so the address has its own, larger figure, counted over all its sessions together
(`per_address`), and one client rotating sessions gets no more than that. Without a session (the edge's
counts: it cannot tell a session it could trust) the visitor is the address. Keys that have been idle
for a whole window are forgotten, so one-off visitors cost nothing after a minute; a refused request is
not counted, so with an address figure the sessions remembered for an address are at most that figure.

The overall figure is not a budget that refuses whoever comes last (a few addresses could spend
it and lock everybody else out): once the minute holds that many requests from everyone, an
address is refused only while it has had its fair share of them (the overall figure over the
addresses seen in the minute, itself included), so a new visitor is still admitted.
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
    """At most `per_client` requests per visitor (a session within an address; the address itself when
    no session is given) and `per_address` per address, its sessions together, in any window of
    `window_s` seconds; once the window holds `overall` requests from everyone, an address that had its
    fair share of them is refused (0 = no limit). A refused request is not counted."""

    def __init__(self, per_client: int, overall: int = 0, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, per_address: int = 0):
        self.per_client, self.overall, self.window_s, self.per_address = per_client, overall, window_s, per_address
        self._clock = clock
        self._seen: dict[str | tuple[str, str], deque] = {}  # an address, (address, session), or EVERYONE
        self._lock = threading.Lock()
        self._swept: float | None = None  # when idle keys were last forgotten

    def admit(self, address: str, session: str | None = None, now: float | None = None) -> None:
        """Count one request from `session` at `address` (None: the address is the visitor), or raise
        RateLimited naming the limit and the wait."""
        now = self._clock() if now is None else now
        with self._lock:
            self._sweep(now)
            mine = self._recent(address, now)  # the address's, all its sessions together
            visitor = (address, session) if session is not None else None
            theirs = mine if visitor is None else self._recent(visitor, now)
            if self.per_client and len(theirs) >= self.per_client:
                who = "one address" if visitor is None else "one visitor (a browser tab or API session)"
                raise RateLimited(f"rate limit: at most {self.per_client} requests per minute from {who}; "
                                  f"try again in {self._wait(theirs, now)} s")
            if self.per_address and visitor is not None and len(mine) >= self.per_address:
                raise RateLimited(f"rate limit: at most {self.per_address} requests per minute from one address, its "
                                  f"visitors together; try again in {self._wait(mine, now)} s")
            if self.overall:
                everyone = self._recent(EVERYONE, now)
                if len(everyone) >= self.overall:
                    self._fair_share(address, mine, len(everyone), now)
            keys = (address,) if self.per_client or self.per_address or self.overall else ()
            keys += (visitor,) if visitor is not None and self.per_client else ()
            for key in keys + ((EVERYONE,) if self.overall else ()):
                self._seen.setdefault(key, deque()).append(now)

    def _fair_share(self, address: str, mine: deque, total: int, now: float) -> None:
        """The server is busy: refuse the address if it had its share of the minute's requests."""
        addresses = sum(1 for key in list(self._seen) if isinstance(key, str) and key != EVERYONE  # not a session's
                        and self._recent(key, now))
        addresses += 0 if mine else 1  # a new visitor counts itself
        share = self.overall / addresses
        if len(mine) >= share:
            raise RateLimited(f"rate limit: the server is busy ({total} requests from everyone in the last minute, "
                              f"{self.overall} or more) and this address has had {len(mine)}, its fair share of "
                              f"{share:.3g} among {addresses} addresses; try again in {self._wait(mine, now)} s")

    def _wait(self, seen: deque, now: float) -> int:
        return max(1, round(self.window_s - (now - seen[0])))

    def _recent(self, key: str | tuple[str, str], now: float) -> deque:
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
