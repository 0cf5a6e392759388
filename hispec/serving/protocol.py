"""What serving asks of a request (serving.api declares the requests, serving.session serves them).

    kind        the name a Stop reaches it by ("generate", "compare", ...)
    what        its name in the messages a visitor reads ("generation")
    needs_turn  it runs on the model, so it waits for the model's turn (False: a load, which only leases it)
    shares_pass it may hold the model beside other such jobs, its passes shared with theirs (a generation:
                its output is what it writes alone); False: it holds the model alone (its timings are its own)
    follow_up   part of a run the visitor already made ("Why this speed"): not counted again by the
                per-address rate limit
    model       the model it asks for (None: the server's)
    parse(raw, limits) -> the request, its own fields checked (cheapest first), or a ConfigError
    prepare(lm, limits) -> Work, the checks that need the model done

Work is `work(stop, emit)`: it yields (or emits) what the update stream passes on; a str is progress
text (a Status). It checks `stop` between its steps.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, Callable, ClassVar, Iterable

Work = Callable[[threading.Event, Callable[[object], None]], Iterable[object] | None]


class Request(ABC):
    kind: ClassVar[str]
    what: ClassVar[str]
    needs_turn: ClassVar[bool] = True
    shares_pass: ClassVar[bool] = False
    follow_up: ClassVar[bool] = False

    @property
    @abstractmethod
    def model(self) -> str | None:
        """The model asked for (None: the server's)."""

    @classmethod
    @abstractmethod
    def parse(cls, raw: dict, limits: Any) -> Request:
        """The request from its raw fields, checked; a ConfigError names the field and what is allowed."""

    @abstractmethod
    def prepare(self, lm, limits: Any) -> Work:
        """The checks that need the model, then the work."""
