"""Limits for serving the engine to the public: configurable, shown to users, enforced with
readable messages. Read from the environment (HISPEC_*); sensible defaults for a shared demo."""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field

from hispec.errors import ConfigError, ModelLoadError

LAYERSKIP_CHECKPOINT = "facebook/layerskip-llama3.2-1B"


def on_spaces() -> bool:
    return bool(os.environ.get("SPACE_ID"))


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 512
    max_seconds: float = 120.0  # wall time of one request
    queue_size: int = 16
    rate_per_minute: int = 12  # generations per visitor per minute (0 = no limit)
    allowed_models: tuple[str, ...] | None = None  # None = any model name (local use)

    @classmethod
    def from_env(cls, env=None) -> Limits:
        env = os.environ if env is None else env

        def number(name, default, kind=int):
            raw = env.get(name)
            if raw in (None, ""):
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise ConfigError(f"{name}={raw!r} is not a number") from None
            if value < 0:
                raise ConfigError(f"{name} must be 0 or more (got {raw})")
            return value

        allowed = env.get("HISPEC_ALLOWED_MODELS")
        if allowed is not None:
            models = tuple(m.strip() for m in allowed.split(",") if m.strip())
            allowed_models = None if models in ((), ("*",)) else models
        else:  # hosted on Spaces: an allow-list by default; locally any model
            allowed_models = ("default", LAYERSKIP_CHECKPOINT) if on_spaces() else None
        return cls(number("HISPEC_MAX_PROMPT_TOKENS", cls.max_prompt_tokens),
                   number("HISPEC_MAX_NEW_TOKENS", cls.max_new_tokens),
                   number("HISPEC_MAX_SECONDS", cls.max_seconds, float),
                   number("HISPEC_QUEUE_SIZE", cls.queue_size),
                   number("HISPEC_RATE_LIMIT", cls.rate_per_minute),
                   allowed_models)

    def check_model(self, name: str) -> None:
        if self.allowed_models is not None and name not in self.allowed_models:
            raise ModelLoadError(f"model '{name}' is not allowed on this server; choose one of: "
                                 f"{', '.join(self.allowed_models)}")

    def check_request(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if prompt_tokens > self.max_prompt_tokens:
            raise ConfigError(f"the prompt is {prompt_tokens} tokens, over this server's limit of "
                              f"{self.max_prompt_tokens}; shorten it")
        if max_new_tokens > self.max_new_tokens:
            raise ConfigError(f"max new tokens {max_new_tokens} is over this server's limit of {self.max_new_tokens}")

    def describe(self) -> str:
        models = "any" if self.allowed_models is None else ", ".join(self.allowed_models)
        rate = f"{self.rate_per_minute} generations per minute per visitor" if self.rate_per_minute else "no rate limit"
        return (f"Limits: prompt ≤ {self.max_prompt_tokens} tokens · ≤ {self.max_new_tokens} new tokens · "
                f"≤ {self.max_seconds:g} s per request · {rate} · queue of {self.queue_size} · "
                f"one generation at a time per model · models: {models}")


@dataclass
class RateLimiter:
    """At most `per_minute` requests per visitor in any 60-second window."""

    per_minute: int
    window_s: float = 60.0
    _seen: dict = field(default_factory=lambda: defaultdict(deque))
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def check(self, visitor: str, now: float | None = None) -> None:
        if not self.per_minute:
            return
        now = time.monotonic() if now is None else now
        with self._lock:
            seen = self._seen[visitor]
            while seen and now - seen[0] >= self.window_s:
                seen.popleft()
            if len(seen) >= self.per_minute:
                wait = self.window_s - (now - seen[0])
                raise ConfigError(f"rate limit: at most {self.per_minute} generations per minute per visitor; "
                                  f"try again in {wait:.0f} s")
            seen.append(now)
            if len(self._seen) > 10000:  # forget idle visitors
                for key in [k for k, v in self._seen.items() if not v]:
                    del self._seen[key]
