"""The server's limits for serving the engine to the public: each one named once, with its setting
(HISPEC_*), its default and the message a visitor sees when it applies (README, Hosting it in public).

The checks that cost nothing come first (serving.session): the prompt's length in characters
before any templating or tokenizing, the rate per visitor (a session within a client address: a
class behind one school network is many visitors) and per address, its visitors together (a client
that opens a new session for every request is still one address), and a fair share of the overall
figure per address when everyone together is over it, the model allow-list; the prompt's length in tokens
once it is tokenized. The time limit counts a request's own time on the model, from when it gets
its turn: waiting behind other visitors is not counted against it.

The client address comes from the proxy chain the operator states (serving.addresses.proxies):
HISPEC_TRUSTED_PROXIES (the proxies' addresses or ranges, "private", or "*" when the server can be
reached only through its proxy; on Hugging Face Spaces "*,private" by default) or HISPEC_PROXY_HOPS
(how many proxies stand in front of the server); unset, no forwarded header is believed, from
loopback either.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from hispec.errors import ConfigError, ModelLoadError
from hispec.serving.addresses.proxies import ANY, PRIVATE, ProxyChain

DEFAULT_MODEL_NAME = "default"
LAYERSKIP_CHECKPOINT = "facebook/layerskip-llama3.2-1B"
ANY_HUB_MODEL = "*"  # in the allow-list: any Hugging Face id (never a local folder)
# A token of these tokenizers is rarely over 8 characters; a prompt over 8 characters per allowed
# token cannot fit, so it is refused before the tokenizer sees it (a 5 MiB prompt costs seconds
# to template and tokenize).
CHARS_PER_TOKEN = 8
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")


def on_spaces() -> bool:
    return bool(os.environ.get("SPACE_ID"))


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int = 1024
    max_new_tokens: int = 512
    max_seconds: float = 120.0  # time of one request on the model, from its turn (the wait is not counted)
    # The defaults are sized for a class of 30 on one school network address (issue 60): every student's run waiting
    # at once, two runs each in a minute, beside as much from everyone else. On a Space and off it alike.
    # requests waiting for a model (or its load) before new ones are refused: a class's 30 and a few more. A waiting
    # job holds its prompt's token ids, no model state (its caches are made when its turn comes)
    queue_size: int = 40
    rate_per_minute: int = 12  # requests per visitor (a session within a client address) per minute (0 = no limit)
    allowed_models: tuple[str, ...] = (DEFAULT_MODEL_NAME,)  # what visitors may choose; "*": any hub id
    # beyond this many a minute from everyone, each address its fair share (0: off): twice an address's own figure,
    # so a class keeps its 60 beside another address as busy
    global_rate_per_minute: int = 120
    trusted_proxies: tuple[str, ...] = ()  # proxies whose X-Forwarded-For is believed (serving.addresses.proxies)
    proxy_hops: int = 0  # or: exactly this many proxies stand in front of the server (0: read `trusted_proxies`)
    # requests per address per minute that may join the HTTP queue (the page sends 3 per run; 0 = no limit):
    # counted at the edge, before anything is queued, per address (serving.edge says why not per session): a class's
    # 30 students x 2 runs x 3 joins = 180, and room for the page's other buttons
    join_rate_per_minute: int = 240
    # Stops per address per minute: /hispec/stop and the page's Stop together (0 = no limit): a class stopping each run
    stop_rate_per_minute: int = 120
    # requests per client address per minute, its visitors (sessions) together (0 = no limit): a class of 30 behind
    # one school network making two runs each; one client rotating session hashes gets no more
    address_rate_per_minute: int = 60

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
            if value < 0 or value != value:
                raise ConfigError(f"{name} must be 0 or more (got {raw})")
            return value

        def names(name, default):
            raw = env.get(name)
            return default if raw is None else tuple(m.strip() for m in raw.split(",") if m.strip())

        return cls(number("HISPEC_MAX_PROMPT_TOKENS", cls.max_prompt_tokens),
                   number("HISPEC_MAX_NEW_TOKENS", cls.max_new_tokens),
                   number("HISPEC_MAX_SECONDS", cls.max_seconds, float),
                   number("HISPEC_QUEUE_SIZE", cls.queue_size),
                   number("HISPEC_RATE_LIMIT", cls.rate_per_minute),
                   names("HISPEC_ALLOWED_MODELS", cls.allowed_models),
                   number("HISPEC_GLOBAL_RATE_LIMIT", cls.global_rate_per_minute),
                   # Spaces serves through its own proxy, the only way in; hops inside its network are skipped
                   names("HISPEC_TRUSTED_PROXIES", (ANY, PRIVATE) if on_spaces() else ()),
                   number("HISPEC_PROXY_HOPS", cls.proxy_hops),
                   number("HISPEC_JOIN_RATE_LIMIT", cls.join_rate_per_minute),
                   number("HISPEC_STOP_RATE_LIMIT", cls.stop_rate_per_minute),
                   number("HISPEC_ADDRESS_RATE_LIMIT", cls.address_rate_per_minute))

    def __post_init__(self):
        try:
            self.proxies
        except ValueError as exc:
            raise ConfigError(f"HISPEC_TRUSTED_PROXIES: {exc}") from None

    @property
    def proxies(self) -> ProxyChain:
        """The proxy chain in front of the server: which forwarded address is the client's."""
        return ProxyChain(self.trusted_proxies, self.proxy_hops)

    def allowing(self, *models: str) -> Limits:
        """These limits with the operator's own models (loaded at start) allowed too."""
        extra = tuple(m for m in models if m and m not in self.allowed_models)
        return replace(self, allowed_models=self.allowed_models + extra)

    @property
    def max_prompt_chars(self) -> int:
        return self.max_prompt_tokens * CHARS_PER_TOKEN

    def check_model(self, name) -> str:
        """A visitor's model choice, cleaned; refused unless the allow-list names it (or allows any
        Hugging Face id and it is one). The refusal says what is allowed and nothing of the server's
        files: a folder that exists and one that does not get the same answer."""
        shown = name[:60] if isinstance(name, str) else type(name).__name__
        name = name.strip() if isinstance(name, str) else ""
        if name in self.allowed_models:
            return name
        if (ANY_HUB_MODEL in self.allowed_models and _HUB_ID.fullmatch(name) and ".." not in name
                and not Path(name).expanduser().exists()):  # a relative folder of that name would be loaded instead
            return name
        offered = [m for m in self.allowed_models if m != ANY_HUB_MODEL]
        extra = " or any Hugging Face id (owner/name)" if ANY_HUB_MODEL in self.allowed_models else ""
        raise ModelLoadError(f"model {shown!r} is not offered on this server; choose one of: "
                             f"{', '.join(offered) or 'none'}{extra}")

    def check_request(self, prompt_tokens: int, max_new_tokens: int) -> None:
        if prompt_tokens > self.max_prompt_tokens:
            raise ConfigError(f"the prompt is {prompt_tokens} tokens, over this server's limit of "
                              f"{self.max_prompt_tokens}; shorten it")
        if max_new_tokens > self.max_new_tokens:
            raise ConfigError(f"max new tokens {max_new_tokens} is over this server's limit of {self.max_new_tokens}")

    def describe(self) -> str:
        models = ", ".join(m if m != ANY_HUB_MODEL else "any Hugging Face id" for m in self.allowed_models)
        rate = (f"{self.rate_per_minute} requests per minute per visitor" if self.rate_per_minute
                else "no rate limit per visitor")
        rate += (f", {self.address_rate_per_minute} per address" if self.address_rate_per_minute
                 else ", none per address")
        overall = (f" (beyond {self.global_rate_per_minute} from everyone, each address its fair share)"
                   if self.global_rate_per_minute else "")
        joins = (f" · {self.join_rate_per_minute} calls per minute per address into the queue"
                 if self.join_rate_per_minute else "")
        joins += f" · {self.stop_rate_per_minute} Stops per minute per address" if self.stop_rate_per_minute else ""
        return (f"Limits: prompt ≤ {self.max_prompt_tokens} tokens ({self.max_prompt_chars:,} characters) · "
                f"≤ {self.max_new_tokens} new tokens · ≤ {self.max_seconds:g} s on the model per request "
                f"(waiting not counted) · {rate}{overall}{joins} · {self.queue_size} requests may wait · one job at a "
                "time per model, taken in turns by visitors · "
                f"models: {models}")
