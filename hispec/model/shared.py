"""Passes of several generations carried by one call: each generation runs in its own thread and asks for
its passes as it always does; the passes of the threads that are members of the board meet here, and
those through the same layers (or the same final head) run as one shared pass.

A member's pass waits until every member is waiting at the board (then nobody else can add a row), or
until no member has posted a pass for a window (WINDOW_S for each member not yet waiting, since the latest
posting or the end of the last call: a member busy elsewhere, sampling or planning, is not waited for
longer). Then the largest group of passes with one key (the oldest among equals) runs as one call, in the
thread of whichever waiting member saw it ready (a lone member runs its own pass at once), while the others
wait for their results; one call runs at a time (it uses every core; the kernel's own thread pool serves any
calling thread alike). Taking the largest group brings members whose passes went different ways (one at its
head, another at its layers) back into step; a pass passed over MAX_SKIPS times goes next, so a member on a
lane of its own is never starved by a crowd on another. A member's result is what it gets alone: the shared
native call is batch-invariant (``q4_layer.NativeLayers.run_shared``; tests/model/test_shared_pass.py), so
sharing changes its speed, never its tokens. A fused call that fails is run again part by part, so that a
fault ends only the generation whose pass caused it.

Threads that are not members (the board's default for every thread) run their passes directly, as
before. One board serves the process (``BOARD``): the machine's cores are one resource.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

import torch

# How long the oldest pass waits for the members not yet waiting: WINDOW_S for each of them, at most WINDOW_CAP_S.
# Their Python work between two passes runs one thread at a time (the interpreter's lock), so the more members
# are still at it, the longer the last of them takes (a one-row pass: 3.5-10 ms on 2 cores).
WINDOW_S = 0.001
WINDOW_CAP_S = 0.006
MAX_SKIPS = 2  # calls a waiting pass may watch go before its own group runs


@dataclass(eq=False)
class _Pass:
    item: Any
    run_many: Callable[[list], list]  # the same operation for every pass of a key
    since: float
    tally: Tally | None = None  # its member's
    rows: int = 1  # the rows (new positions) it brings to the call
    beside: tuple[int, int] = (0, 0)  # the other members' passes in the call that carried it, and their rows
    skipped: int = 0  # calls that ran while it waited
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class Tally:
    """One member's share of the board: the calls that carried its passes, how many of them carried other
    members' passes too, and theirs in those calls (what the page says of a run that shared the machine)."""

    calls: int = 0
    shared_calls: int = 0
    others_passes: int = 0
    most_members: int = 1  # the most members' passes one of its calls carried
    own_rows: int = 0  # the rows its passes brought to the shared calls
    others_rows: int = 0  # the other members' rows in those calls

    def add(self, width: int, own_rows: int = 1, others_rows: int = 0) -> None:
        self.calls += 1
        if width > 1:
            self.shared_calls += 1
            self.others_passes += width - 1
            self.most_members = max(self.most_members, width)
            self.own_rows += own_rows
            self.others_rows += others_rows


@dataclass
class BoardCounts:
    """What the board ran: calls, rows by call, and how many members' passes each call carried."""

    calls: int = 0
    passes: int = 0
    by_width: Counter = field(default_factory=Counter)  # members' passes in a call -> calls


class PassBoard:
    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self._cond = threading.Condition()
        self._local = threading.local()
        self._members = 0
        self._waiting = 0  # members' passes posted and not yet taken into a call
        self._pending: dict[Hashable, list[_Pass]] = {}
        self._running = False
        self._ended = 0.0  # when the last call ended (time.monotonic())
        self.counts = BoardCounts()

    @contextlib.contextmanager
    def member(self):
        """This thread's passes meet the other members' while inside (re-entrant); yields its Tally."""
        depth = getattr(self._local, "depth", 0)
        self._local.depth = depth + 1
        if depth == 0:
            self._local.tally = Tally()
            with self._cond:
                self._members += 1
        try:
            yield self._local.tally
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._members -= 1
                    self._cond.notify_all()  # the others no longer wait for this one

    @property
    def is_member(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    def others(self) -> int:
        """How many other members hold the board beside this thread (0 for a thread that is no member)."""
        return max(0, self._members - 1) if self.is_member else 0

    def tally(self) -> Tally | None:
        return self._local.tally if self.is_member else None  # this thread's, while a member

    def last_beside(self) -> tuple[int, int]:
        """The other members' passes and rows in the calls of this thread's lane passes since it last asked."""
        got, self._local.beside = getattr(self._local, "beside", (0, 0)), (0, 0)
        return got

    def run(self, key: Hashable, item: Any, run_many: Callable[[list], list], rows: int = 1,
            lane_pass: bool = True) -> Any:
        """`item`'s result of run_many([...items of the same key...]); a non-member runs run_many([item]) at once.
        `rows`: the rows the item brings to a call (what the members' tallies count of a shared call);
        `lane_pass`: whether last_beside reports the call (a lane's layer pass; a head's call is no lane's pass)."""
        if not self.is_member:
            return run_many([item])[0]
        mine = _Pass(item, run_many, time.monotonic(), self._local.tally, rows)
        with self._cond:
            self._pending.setdefault(key, []).append(mine)
            self._waiting += 1
            self._cond.notify_all()
            while not mine.done:
                group = self._take()
                if group is None:
                    self._cond.wait(None if self._running else self._until())  # a running call notifies its end
                    continue
                # whichever waiting member sees a group ready runs it, in its own thread (a lone member runs its
                # own pass at once, with no hand-over); the others wait for their results
                self._cond.release()
                try:
                    with torch.inference_mode():  # the members' tensors (and caches) are inference tensors
                        _run_group(group)
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._ended = time.monotonic()
                    self._cond.notify_all()
        if lane_pass:
            told_passes, told_rows = getattr(self._local, "beside", (0, 0))
            self._local.beside = (told_passes + mine.beside[0], told_rows + mine.beside[1])
        if mine.error is not None:
            raise mine.error
        return mine.result

    # ---- under the lock ---------------------------------------------------------------------------
    def _take(self):
        """The group to run now (taken out of the pending passes), or None."""
        if self._running or not self._pending:
            return None
        everyone = self._waiting >= self._members
        if not everyone and time.monotonic() - self._since() < self._window():
            return None
        # a group passed over MAX_SKIPS times first; else the largest (then the oldest): members whose passes went
        # different ways fall into step
        key = max(self._pending, key=lambda k: (self._pending[k][0].skipped >= MAX_SKIPS, len(self._pending[k]),
                                                -self._pending[k][0].since))
        group = self._pending.pop(key)
        for others in self._pending.values():
            for p in others:
                p.skipped += 1
        self._waiting -= len(group)
        self._running = True
        self.counts.calls += 1
        self.counts.passes += len(group)
        self.counts.by_width[len(group)] += 1
        rows = sum(p.rows for p in group)
        for p in group:
            p.beside = (len(group) - 1, rows - p.rows)
            p.tally.add(len(group), p.rows, rows - p.rows)
        return group

    def _until(self) -> float:
        if not self._pending:
            return self.window_s
        return max(0.0005, self._window() - (time.monotonic() - self._since()))

    def _window(self) -> float:
        return min(WINDOW_CAP_S, self.window_s * max(1, self._members - self._waiting))

    def _since(self) -> float:
        """Since when the waiting passes have waited for the others: the latest posting, or the end of the last
        call if later (the members that call carried get the window to post their next pass). From the latest
        posting: while members keep arriving, one every so often, the pass waits for the rest."""
        return max(max(group[-1].since for group in self._pending.values()), self._ended)


def _run_group(group: list[_Pass]) -> None:
    """Run the group's items as one call; if it fails, each item alone (a fault is its own pass's)."""
    run_many = group[0].run_many
    try:
        for p, result in zip(group, run_many([p.item for p in group]), strict=True):
            p.result = result
    except BaseException as exc:
        if len(group) == 1:
            group[0].error = exc
        else:
            for p in group:
                try:
                    p.result = run_many([p.item])[0]
                except BaseException as own:
                    p.error = own
    for p in group:
        p.done = True


BOARD = PassBoard()
