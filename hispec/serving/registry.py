"""Shared models for a multi-user front end: each loaded once, for everybody, with its turns.

Loading one model never blocks requests for models already loaded (each name has its own load
lock; the table's lock is held only to look up or insert). A model in use (leased) is never
evicted, nor is one the operator loaded at start (pinned); when a new model needs room and every
loaded one is in use or pinned, the load is refused with a message instead of evicting. Which
names a visitor may ask for is not decided here: serving.session checks the allow-list first.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from hispec.errors import ModelLoadError
from hispec.model.loading import LoadedModel, load_model
from hispec.serving.turns import Turns


@dataclass(eq=False)
class _Entry:
    lm: LoadedModel
    turns: Turns | None = None
    leases: int = 0
    pinned: bool = False

    def __post_init__(self):
        self.turns = self.turns or Turns(seats(self.lm))


SEATS = 8  # generations holding one model at once, their passes shared (HISPEC_SEATS)


def seats(lm: LoadedModel) -> int:
    """How many generations may hold the model at once: SEATS (or $HISPEC_SEATS) where its passes run on the
    native route, whose shared calls are batch-invariant (hispec.model.shared), else 1 (one at a time)."""
    ee = getattr(lm, "ee", None)
    lean = getattr(ee, "lean", None)
    if lean is None or getattr(lean, "native", None) is None or getattr(ee, "graphs", None) is not None:
        return 1
    told = os.environ.get("HISPEC_SEATS", "").strip()
    return max(1, int(told)) if told.isdigit() else SEATS


class ModelRegistry:
    def __init__(self, device: str = "auto", dtype: str = "auto", max_loaded: int = 2,
                 loader: Callable[..., LoadedModel] = load_model,
                 prepare: Callable[[LoadedModel, Callable[[str], None] | None], object] | None = None):
        """`prepare`: run on each model this registry loads, before anyone is served with it (the app:
        runs.runner.warm_up, so that no visitor's first run pays for one-off work)."""
        self.device, self.dtype, self.max_loaded = device, dtype, max_loaded
        self._loader, self._prepare = loader, prepare
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.RLock()  # the table only, never held while loading; re-entrant as Jobs' (a finaliser)
        self._loading: dict[str, threading.Lock] = {}

    def add(self, name: str, lm: LoadedModel, pinned: bool = True) -> None:
        """A model loaded elsewhere (the operator's start model, a test's), pinned by default."""
        with self._lock:
            self._entries[name] = _Entry(lm, pinned=pinned)

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def get(self, name: str, progress: Callable[[str], None] | None = None) -> LoadedModel:
        """The model called `name`, loading it once for everybody if needed."""
        return self._entry(name, progress).lm

    def acquire(self, name: str, progress: Callable[[str], None] | None = None) -> LoadedModel:
        """The model, loaded if needed and kept loaded (never evicted) until `release(name)`."""
        return self._entry(name, progress, lease=True).lm

    def release(self, name: str) -> None:
        with self._lock:
            entry = self._entries.get(name.strip())
            if entry is not None and entry.leases > 0:
                entry.leases -= 1

    @contextmanager
    def lease(self, name: str, progress: Callable[[str], None] | None = None) -> Iterator[LoadedModel]:
        """acquire() and release() around a `with` block."""
        lm = self.acquire(name, progress)
        try:
            yield lm
        finally:
            self.release(name)

    def turns(self, name: str) -> Turns:
        """The queue of jobs on a loaded model (serving.turns)."""
        with self._lock:
            entry = self._entries.get(name.strip())
        if entry is None:
            raise ModelLoadError(f"model '{name}' is not loaded")
        return entry.turns

    def in_use(self, name: str) -> int:
        with self._lock:
            entry = self._entries.get(name)
            return entry.leases if entry else 0

    def _entry(self, name: str, progress, lease: bool = False) -> _Entry:
        name = (name or "").strip() if isinstance(name, str) else ""
        if not name:
            raise ModelLoadError("no model given: use 'default', a Hugging Face id or a local folder")
        found = self._found(name, lease)
        if found is not None:
            return found
        with self._lock:
            load_lock = self._loading.setdefault(name, threading.Lock())
        with load_lock:  # one load per name; other names and loaded models go on meanwhile
            found = self._found(name, lease)
            if found is not None:
                return found
            self._make_room()
            lm = self._loader(name, device=self.device, dtype=self.dtype, progress=progress)
            if self._prepare is not None:
                self._prepare(lm, progress)
            with self._lock:
                entry = self._entries[name] = _Entry(lm, leases=int(lease))
                self._evict_over(keep=name)
            return entry

    def _found(self, name: str, lease: bool) -> _Entry | None:
        with self._lock:
            entry = self._entries.get(name)
            if entry is not None:
                self._entries.move_to_end(name)
                entry.leases += int(lease)
            return entry

    def _evictable(self, keep: str | None = None) -> list[str]:
        return [n for n, e in self._entries.items() if n != keep and not e.pinned and not e.leases]

    def _make_room(self) -> None:
        """Refuse a load that could only fit by evicting a model in use or pinned."""
        with self._lock:
            if len(self._entries) >= self.max_loaded and not self._evictable():
                raise ModelLoadError(f"this server already holds {len(self._entries)} models in use; "
                                     "try again when a generation on another model has finished")

    def _evict_over(self, keep: str) -> None:
        while len(self._entries) > self.max_loaded:
            candidates = self._evictable(keep)
            if not candidates:
                return  # everything else is in use: over the count for now, never evicting a model in use
            del self._entries[candidates[0]]  # least recently used first
