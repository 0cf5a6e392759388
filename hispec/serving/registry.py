"""Shared models for a multi-user front end: load once, one generation at a time per model.

Not UI: the app (and any server) holds a ModelRegistry; the engine knows nothing of it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

from hispec.errors import ModelLoadError
from hispec.model.loading import LoadedModel, load_model
from hispec.serving.limits import Limits


class ModelRegistry:
    def __init__(self, device: str = "auto", dtype: str = "auto", max_loaded: int = 2,
                 loader: Callable[..., LoadedModel] = load_model, limits: Limits | None = None):
        self.device, self.dtype, self.max_loaded = device, dtype, max_loaded
        self.limits = limits or Limits()
        self._loader = loader
        self._models: OrderedDict[str, LoadedModel] = OrderedDict()
        self._gen_locks: dict[str, threading.Lock] = {}
        self._load_lock = threading.Lock()

    def add(self, name: str, lm: LoadedModel) -> None:
        with self._load_lock:
            self._models[name] = lm
            self._gen_locks.setdefault(name, threading.Lock())

    def loaded(self) -> list[str]:
        return list(self._models)

    def get(self, name: str, progress: Callable[[str], None] | None = None) -> LoadedModel:
        """The model called `name`, loading it (once, for everybody) if needed."""
        name = (name or "").strip()
        if not name:
            raise ModelLoadError("no model given: use 'default', a Hugging Face id or a local folder")
        with self._load_lock:
            if name in self._models:
                self._models.move_to_end(name)
                return self._models[name]
            self.limits.check_model(name)  # before anything could be downloaded
            lm = self._loader(name, device=self.device, dtype=self.dtype, progress=progress)
            while len(self._models) >= self.max_loaded:
                evicted, _ = self._models.popitem(last=False)
                self._gen_locks.pop(evicted, None)
            self._models[name] = lm
            self._gen_locks[name] = threading.Lock()
            return lm

    def generation_lock(self, name: str) -> threading.Lock:
        """Held while a generation runs on the model: its layers are shared, its caches are not."""
        with self._load_lock:
            return self._gen_locks.setdefault(name.strip(), threading.Lock())
