"""Who is asking: the session a Stop belongs to, the address a rate limit counts, and when the
request arrived.

The session is Gradio's session hash (one per browser tab or API client): a visitor's Stop reaches
the requests of that session only. The address is the peer's IP, or, when the operator says which
proxies stand in front of the server (HISPEC_TRUSTED_PROXIES, HISPEC_PROXY_HOPS), the address that
chain names in X-Forwarded-For (serving.addresses.proxies). A client cannot choose its address by sending a
header: headers from untrusted peers are ignored, loopback included.

That holds only if nothing under the app believes the header first: uvicorn (which serves Gradio)
replaces the peer by the X-Forwarded-For address whenever the peer is loopback, by default. The
app calls `forwarded_headers_left_to_serving()` before it launches, so that the peer it reports is
the real one and serving alone decides.

The arrival time is stamped on every HTTP request by serving.edge (the ASGI middleware the app
installs): a Stop applies to the requests that arrived before it, however long they took to reach
serving (serving.jobs).

Whether the client is still there: a request that joined Gradio's queue through the edge is
`watched`: its updates travel over an update stream the edge sees open and close
(serving.presence), so serving can end its job once no stream has been open for it for a while.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from hispec.serving.addresses.proxies import ProxyChain, forwarded_for, forwarded_in_scope

ARRIVED = "hispec.arrived"  # the ASGI scope key of a request's arrival (time.monotonic())
UVICORN_TRUST = "FORWARDED_ALLOW_IPS"  # uvicorn's own list of peers whose forwarded headers it believes

log = logging.getLogger("hispec.serving")


@dataclass(frozen=True)
class Caller:
    session: str  # whose requests a Stop reaches
    address: str  # what the rate limit counts
    arrived: float | None = field(default=None, compare=False)  # when its HTTP request arrived (monotonic)
    watched: bool = field(default=False, compare=False)  # its update streams pass the edge (serving.presence)


LOCAL = Caller("local", "local")  # a caller without a request: the command line, a test


def caller_of(request, proxies: ProxyChain | tuple[str, ...] = ()) -> Caller:
    """The Caller of a request (a gr.Request or anything with session_hash, client.host, headers)."""
    if request is None:
        return LOCAL
    session = str(getattr(request, "session_hash", None) or "anonymous")
    client = getattr(request, "client", None)
    peer = str(getattr(client, "host", None) or "unknown")
    chain = proxies if isinstance(proxies, ProxyChain) else ProxyChain(tuple(proxies))
    arrived = arrival_of(request)
    path = getattr(getattr(getattr(request, "request", None), "url", None), "path", "")
    return Caller(session, chain.client(peer, _forwarded(request)), arrived,
                  watched=arrived is not None and joins_queue("POST", str(path or "")))


def client_address(peer: str, forwarded: str | None, trusted_proxies: tuple[str, ...], hops: int = 0) -> str:
    """The client's address (serving.addresses.proxies): the peer, or the forwarded address the chain names."""
    return ProxyChain(tuple(trusted_proxies), hops).client(peer, forwarded)


def joins_queue(method: str, path: str) -> bool:
    """Whether an HTTP request adds an event to Gradio's queue."""
    return method == "POST" and (path.endswith("/queue/join") or "/call/" in path)


def arrival_of(request) -> float | None:
    """When the request's HTTP call arrived (serving.edge stamps it), or None when nothing stamped it."""
    scope = getattr(getattr(request, "request", None), "scope", None)  # gr.Request -> the starlette request
    value = scope.get(ARRIVED) if isinstance(scope, dict) else None
    return value if isinstance(value, float) else None


def forwarded_headers_left_to_serving(env=None) -> None:
    """Tell uvicorn to believe no forwarded header (FORWARDED_ALLOW_IPS empty): by default it takes
    X-Forwarded-For from loopback as the client's address, a header anyone can send. The proxies
    to believe are HISPEC_TRUSTED_PROXIES, read by serving (above)."""
    env = os.environ if env is None else env
    if env.get(UVICORN_TRUST):
        log.warning("%s=%r is ignored: the proxies to believe are set with HISPEC_TRUSTED_PROXIES", UVICORN_TRUST,
                    env[UVICORN_TRUST])
    env[UVICORN_TRUST] = ""


def _forwarded(request) -> str | None:
    """Every X-Forwarded-For field line of the request, joined (serving.addresses.proxies.forwarded_for): from its ASGI
    scope (gr.Request -> the starlette request), else from its headers (getlist where they have it)."""
    scope = getattr(getattr(request, "request", None), "scope", None)
    if isinstance(scope, dict) and "headers" in scope:
        return forwarded_in_scope(scope)
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    try:
        lines = headers.getlist("x-forwarded-for") if hasattr(headers, "getlist") else [headers.get("x-forwarded-for")]
    except Exception:  # an odd headers object: no forwarded address
        return None
    return forwarded_for(line for line in lines if isinstance(line, str))
