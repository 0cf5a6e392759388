"""The HTTP edge, in front of Gradio's queue: what must neither wait in that queue nor fill it.

One ASGI middleware (`Edge`, installed by the app) sees every HTTP request before Gradio does:

- it stamps the request's arrival (serving.caller.ARRIVED): a Stop applies to the requests that
  arrived before it, however long they took to reach serving;
- it answers `POST /hispec/stop` itself: a Stop for API clients that never enters Gradio's queue,
  so a full or slow queue cannot refuse it or hold it up (gradio_client sends even the app's
  queue-less /stop endpoint through the queue). The body names the session
  (`{"session_hash": client.session_hash}`, optionally `"kinds": ["generate", ...]`); it ends that
  session's jobs submitted before it, like the page's Stop;
- it counts the requests that join Gradio's queue (`/queue/join`, `/call/<api>`) per client address
  and refuses those over `Limits.join_rate_per_minute` with 429 before anything is queued: a burst
  from one address cannot fill the queue that everybody else's requests pass through. The finer
  per-address request limit (serving.ratelimit) still applies when a request reaches serving.

The address is serving.caller's: the peer, or the forwarded address from a proxy the operator trusts.
"""

from __future__ import annotations

import json
import time
from typing import Callable

from hispec.errors import HiSpecError
from hispec.serving.caller import ARRIVED, Caller, client_address
from hispec.serving.ratelimit import RateLimits
from hispec.text import sentence

STOP_PATH = "/hispec/stop"
MAX_BODY = 4096  # bytes a Stop's body may hold
MAX_SESSION = 128  # characters of a session hash


def joins_queue(method: str, path: str) -> bool:
    """Whether an HTTP request adds an event to Gradio's queue."""
    return method == "POST" and (path.endswith("/queue/join") or "/call/" in path)


class Edge:
    """ASGI middleware: arrival stamps, the queue-less Stop, the per-address limit on queue joins.
    `server()` returns the serving.session.Server (read on each request: the app builds it after
    the middleware is declared)."""

    def __init__(self, app, server: Callable[[], object]):
        self.app, self.server = app, server
        self._joins: RateLimits | None = None

    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        scope[ARRIVED] = time.monotonic()
        if scope["type"] == "http":
            method, path = scope.get("method", ""), scope.get("path", "")
            if path == STOP_PATH or path.endswith(STOP_PATH):
                return await self._stop(scope, receive, send)
            if joins_queue(method, path):
                refusal = self._over_limit(scope)
                if refusal:
                    return await _answer(send, 429, {"detail": refusal})
        await self.app(scope, receive, send)

    def _over_limit(self, scope) -> str | None:
        server = self.server()
        limit = server.limits.join_rate_per_minute
        if not limit:
            return None
        if self._joins is None or self._joins.per_client != limit:
            self._joins = RateLimits(limit)
        try:
            self._joins.admit(_address(scope, server.limits.trusted_proxies))
        except HiSpecError as exc:
            return f"{sentence(str(exc))} (counted as requests join the server's queue, before it holds any of them)"
        return None

    async def _stop(self, scope, receive, send):
        if scope.get("method") != "POST":
            return await _answer(send, 405, {"detail": f"{STOP_PATH} takes POST with "
                                                       '{"session_hash": "...", "kinds": [...] (optional)}'})
        body, size = b"", 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY:
                return await _answer(send, 413, {"detail": f"A Stop's body is at most {MAX_BODY} bytes"})
            body += chunk
            if not message.get("more_body"):
                break
        try:
            session, kinds = _stop_fields(body)
        except ValueError as exc:
            return await _answer(send, 400, {"detail": sentence(str(exc))})
        server = self.server()
        caller = Caller(session, _address(scope, server.limits.trusted_proxies), scope[ARRIVED])
        n = server.stop(caller, kinds)
        said = (f"Stopping {n} request{'s' if n != 1 else ''} of this session." if n else
                "Nothing of this session is running; a request sent before this Stop is stopped as it arrives.")
        await _answer(send, 200, {"stopped": n, "message": said})


def _stop_fields(body: bytes) -> tuple[str, tuple[str, ...] | None]:
    try:
        fields = json.loads(body or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise ValueError('the body is not JSON; send {"session_hash": "..."}') from None
    if not isinstance(fields, dict):
        raise ValueError('the body must be a JSON object: {"session_hash": "...", "kinds": [...] (optional)}')
    session, kinds = fields.get("session_hash"), fields.get("kinds")
    if not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION:
        raise ValueError(f"session_hash must be the client's session hash, a string of 1 to {MAX_SESSION} "
                         "characters (gradio_client: client.session_hash)")
    if kinds is not None and not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise ValueError('kinds must be a list of request kinds, e.g. ["generate"], or left out for all')
    return session, None if kinds is None else tuple(kinds)


def _address(scope, trusted_proxies: tuple[str, ...]) -> str:
    client = scope.get("client")
    peer = str(client[0]) if client else "unknown"
    forwarded = None
    for name, value in scope.get("headers") or ():
        if name == b"x-forwarded-for":
            forwarded = value.decode("latin-1")
            break
    return client_address(peer, forwarded, trusted_proxies)


async def _answer(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
