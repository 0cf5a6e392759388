"""Who is asking: the session a Stop belongs to, the address a rate limit counts, and when the
request arrived.

The session is Gradio's session hash (one per browser tab or API client): a visitor's Stop reaches
the requests of that session only. The address is the peer's IP, or, when the peer is a proxy the
operator trusts (HISPEC_TRUSTED_PROXIES: its addresses, or "*" for a server reachable only through
its proxy, the default on Hugging Face Spaces), the nearest address in X-Forwarded-For that is not
a trusted proxy: the one the operator's proxy appended. A client cannot choose its address by
sending a header: headers from untrusted peers are ignored, loopback included.

That holds only if nothing under the app believes the header first: uvicorn (which serves Gradio)
replaces the peer by the X-Forwarded-For address whenever the peer is loopback, by default. The
app calls `forwarded_headers_left_to_serving()` before it launches, so that the peer it reports is
the real one and this module alone decides.

The arrival time is stamped on every HTTP request by serving.edge (the ASGI middleware the app
installs): a Stop applies to the requests that arrived before it, however long they took to reach
serving (serving.jobs).

Whether the client reads its updates: Gradio keeps a session's undelivered messages in a queue of
its own until the session's update stream takes them. A client that posted a request and never
opened that stream (or stopped reading it) leaves them piling up there; `unread_of` counts them, so
serving can drop such a job within seconds instead of running it in full for nobody.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

ANY = "*"  # trust every peer's X-Forwarded-For (a server reachable only through its proxy)
ARRIVED = "hispec.arrived"  # the ASGI scope key of a request's arrival (time.monotonic())
UVICORN_TRUST = "FORWARDED_ALLOW_IPS"  # uvicorn's own list of peers whose forwarded headers it believes

log = logging.getLogger("hispec.serving")


@dataclass(frozen=True)
class Caller:
    session: str  # whose requests a Stop reaches
    address: str  # what the rate limit counts
    arrived: float | None = field(default=None, compare=False)  # when its HTTP request arrived (monotonic)
    unread: Callable[[], int] | None = field(default=None, compare=False, repr=False)  # its updates not read yet


LOCAL = Caller("local", "local")  # a caller without a request: the command line, a test


def caller_of(request, trusted_proxies: tuple[str, ...] = ()) -> Caller:
    """The Caller of a request (a gr.Request or anything with session_hash, client.host, headers)."""
    if request is None:
        return LOCAL
    session = str(getattr(request, "session_hash", None) or "anonymous")
    client = getattr(request, "client", None)
    peer = str(getattr(client, "host", None) or "unknown")
    return Caller(session, client_address(peer, _header(request, "x-forwarded-for"), trusted_proxies),
                  arrival_of(request), unread_of(request))


def client_address(peer: str, forwarded: str | None, trusted_proxies: tuple[str, ...]) -> str:
    """The peer, or the right-most forwarded address that is not a trusted proxy when the peer is one."""
    trusted = set(trusted_proxies)
    if not forwarded or not (ANY in trusted or peer in trusted):
        return peer
    hops = [h.strip() for h in forwarded.split(",") if h.strip()]
    for hop in reversed(hops):  # each proxy appends the address it saw: the right end is the nearest
        if hop not in trusted:
            return hop[:64]
    return peer


def arrival_of(request) -> float | None:
    """When the request's HTTP call arrived (serving.edge stamps it), or None when nothing stamped it."""
    scope = getattr(getattr(request, "request", None), "scope", None)  # gr.Request -> the starlette request
    value = scope.get(ARRIVED) if isinstance(scope, dict) else None
    return value if isinstance(value, float) else None


def unread_of(request) -> Callable[[], int] | None:
    """How many of the session's updates wait in Gradio's queue for its stream (a function of no
    arguments), or None when the request did not come through Gradio's queue."""
    session = getattr(request, "session_hash", None)
    app = getattr(getattr(request, "request", None), "app", None)
    queue = getattr(app.get_blocks(), "_queue", None) if hasattr(app, "get_blocks") else None
    pending = getattr(queue, "pending_messages_per_session", None)
    if not session or pending is None:
        return None

    def unread() -> int:
        messages = pending.get(session)  # a plain read: it does not reorder Gradio's cache
        return messages.qsize() if messages is not None else 0

    return unread


def forwarded_headers_left_to_serving(env=None) -> None:
    """Tell uvicorn to believe no forwarded header (FORWARDED_ALLOW_IPS empty): by default it takes
    X-Forwarded-For from loopback as the client's address, a header anyone can send. The proxies
    to believe are HISPEC_TRUSTED_PROXIES, read by serving (above)."""
    env = os.environ if env is None else env
    if env.get(UVICORN_TRUST):
        log.warning("%s=%r is ignored: the proxies to believe are set with HISPEC_TRUSTED_PROXIES", UVICORN_TRUST,
                    env[UVICORN_TRUST])
    env[UVICORN_TRUST] = ""


def _header(request, name: str) -> str | None:
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    try:
        value = headers.get(name)
    except Exception:  # an odd headers object: no forwarded address
        return None
    return value if isinstance(value, str) else None
