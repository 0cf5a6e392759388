"""The HTTP edge, in front of Gradio's queue: what must neither wait in that queue nor fill it.

One ASGI middleware (`Edge`, installed by the app) sees every HTTP request before Gradio does:

- it stamps the request's arrival (serving.caller.ARRIVED): a Stop applies to the requests that
  arrived before it, however long they took to reach serving;
- it answers `POST /hispec/stop` (that exact path) itself: a Stop for API clients that never enters
  Gradio's queue, so a full or slow queue cannot refuse it or hold it up (gradio_client sends even
  the app's queue-less /stop endpoint through the queue). The body names the session
  (`{"session_hash": client.session_hash}`, optionally `"kinds": ["generate", ...]`); it ends that
  session's jobs submitted before it, like the page's Stop. Stops are counted per client address
  (`Limits.stop_rate_per_minute`);
- it sees every update stream open and close (`/queue/data?session_hash=...`,
  `/call/<api>/<event_id>`) and tells serving.presence, so that a client is judged gone only when
  no stream has been open for it for a while;
- it counts the requests that join Gradio's queue (`/queue/join`, `/call/<api>`) per client address
  and refuses those over `Limits.join_rate_per_minute` with 429 before anything is queued (per address,
  not per session as serving's own rate limit: the session hash is whatever a client writes in its join,
  and a REST call has none, so a count per session would let one client rotate hashes past it; the
  figure is sized for a class of 30 behind one address instead, serving.limits), and
  answers a join with the wrong number of inputs with 400 and the event's field list (Gradio would
  queue it and fail it with no message);
- it keeps Gradio's queue-less routes (`/run/<api>`, `/api/<api>`) closed to the events that
  run in the queue, on every host (Gradio closes them on Spaces only): those would skip the queue,
  the join limit and the update stream;
- it counts the page's own Stops (its queue-less Stop events: `/run/stop`, or `/run/predict` with
  the event's fn_index) under the same per-address Stop limit as `/hispec/stop`: a Stop event is one
  whose handler is named `stop` (the page's, the Benchmark tab's) or whose API name is `stop`.

The address is serving.caller's: the peer, or the forwarded address the operator's proxy chain names.
"""

from __future__ import annotations

import inspect
import json
import time
from collections import OrderedDict
from typing import Callable
from urllib.parse import parse_qs

from hispec.errors import HiSpecError
from hispec.serving.caller import ARRIVED, Caller, joins_queue
from hispec.serving.addresses.proxies import forwarded_in_scope
from hispec.serving.addresses.ratelimit import RateLimits
from hispec.text import sentence

STOP_PATH = "/hispec/stop"
MAX_BODY = 4096  # bytes a Stop's body may hold
MAX_JOIN_BODY = 4 << 20  # bytes a queue join's body may hold (its inputs, read to count them)
MAX_SESSION = 128  # characters of a session hash
MAX_EVENTS = 10_000  # REST events whose session is remembered for their stream (the oldest go first)


class Edge:
    """ASGI middleware: arrival stamps, the queue-less Stop, update streams seen, the per-address
    limits on queue joins and Stops, input counts, the queue-less routes closed. `server()` returns
    the serving.session.Server (read on each request: the app builds it after the middleware is declared)."""

    def __init__(self, app, server: Callable[[], object]):
        self.app, self.server = app, server
        self._limits: dict[str, RateLimits] = {}
        self._event_sessions: OrderedDict[str, str] = OrderedDict()  # a REST event's id -> its session

    async def __call__(self, scope, receive, send):
        if scope.get("type") not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        scope[ARRIVED] = time.monotonic()
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method, path = scope.get("method", ""), scope.get("path", "")
        if path == STOP_PATH:
            return await self._stop(scope, receive, send)
        stream = self._stream_session(method, path, scope)
        if stream is not None:
            return await self._watched(stream, scope, receive, send)
        if method == "POST" and ("/run/" in path or "/api/" in path):
            _close_direct_routes(scope)
            return await self._direct(scope, receive, send, path)
        if joins_queue(method, path):
            return await self._join(scope, receive, send, path)
        await self.app(scope, receive, send)

    # ---- queue joins: counted, their inputs counted -----------------------------------------------
    async def _join(self, scope, receive, send, path: str):
        server = self.server()
        refusal = self._over(scope, "join", server.limits.join_rate_per_minute,
                             "counted as requests join the server's queue, before it holds any of them")
        if refusal:
            return await _answer(send, 429, {"detail": refusal})
        read = await _read_body(receive, send)
        if read is None:
            return
        body, fields = read
        wrong = _wrong_inputs(scope, path, fields)
        if wrong:
            return await _answer(send, 400, {"detail": wrong})
        rest = "/call/" in path and "/call/v2/" not in path
        await self.app(scope, _replay(body, receive), self._learn_event(send, fields) if rest else send)

    # ---- queue-less calls: a Stop event among them is counted as a Stop ----------------------------------
    async def _direct(self, scope, receive, send, path: str):
        server = self.server()
        read = await _read_body(receive, send)
        if read is None:
            return
        body, fields = read
        if _is_stop(_event_of(scope, path, fields)):
            refusal = self._over(scope, "stop", server.limits.stop_rate_per_minute, "counted at the page's Stop and "
                                 f"{STOP_PATH} together")
            if refusal:
                return await _answer(send, 429, {"detail": refusal})
        await self.app(scope, _replay(body, receive), send)

    def _learn_event(self, send, fields):
        """A REST join's answer names its event: remember whose session it is (for its stream)."""
        session = fields.get("session_hash") if isinstance(fields, dict) else None

        async def sending(message):
            if message.get("type") == "http.response.body" and isinstance(session, str):
                answer = _json(message.get("body", b""))
                if isinstance(answer, dict) and isinstance(answer.get("event_id"), str):
                    self._event_sessions[answer["event_id"]] = session
                    while len(self._event_sessions) > MAX_EVENTS:
                        self._event_sessions.popitem(last=False)
            await send(message)

        return sending

    # ---- update streams ---------------------------------------------------------------------------
    def _stream_session(self, method: str, path: str, scope) -> str | None:
        """The session whose updates this request streams, or None when it is no update stream."""
        if method != "GET":
            return None
        if path.endswith("/queue/data"):
            query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
            session = (query.get("session_hash") or [None])[0]
            return session[:MAX_SESSION] if session else None
        parts = path.rstrip("/").split("/")
        if len(parts) >= 3 and "call" in parts[:-2]:  # .../call/<api>/<event_id>
            event = parts[-1][:MAX_SESSION]
            return self._event_sessions.get(event, event)  # a REST event's session is its id unless it named one
        return None

    async def _watched(self, session: str, scope, receive, send):
        streams = self.server().streams
        streams.opened(session)
        try:
            await self.app(scope, receive, send)
        finally:
            streams.closed(session)

    # ---- the queue-less Stop ----------------------------------------------------------------------
    async def _stop(self, scope, receive, send):
        if scope.get("method") != "POST":
            return await _answer(send, 405, {"detail": f"{STOP_PATH} takes POST with "
                                                       '{"session_hash": "...", "kinds": [...] (optional)}'})
        server = self.server()
        refusal = self._over(scope, "stop", server.limits.stop_rate_per_minute, f"counted at {STOP_PATH}")
        if refusal:
            return await _answer(send, 429, {"detail": refusal})
        body = await _body(receive, MAX_BODY)
        if body is None:
            return await _answer(send, 413, {"detail": f"A Stop's body is at most {MAX_BODY} bytes"})
        try:
            session, kinds = _stop_fields(body)
        except ValueError as exc:
            return await _answer(send, 400, {"detail": sentence(str(exc))})
        n = server.stop(Caller(session, _address(scope, server), scope[ARRIVED]), kinds)
        said = (f"Stopping {n} request{'s' if n != 1 else ''} of this session." if n else
                "Nothing of this session is running; a request sent just before this Stop is stopped as it arrives "
                "(wait for a request's event id before you stop it, to be sure).")
        await _answer(send, 200, {"stopped": n, "message": said})

    def _over(self, scope, what: str, limit: int, where: str) -> str | None:
        """None when the address may go on (counted), else the refusal."""
        if not limit:
            return None
        limits = self._limits.get(what)
        if limits is None or limits.per_client != limit:
            limits = self._limits[what] = RateLimits(limit)
        try:
            limits.admit(_address(scope, self.server()))
        except HiSpecError as exc:
            text = sentence(str(exc))
            return f"{text} ({where})" if what == "join" else f"{text.replace('requests', 'Stops', 1)} ({where})"
        return None


def _close_direct_routes(scope) -> None:
    """Gradio's own rule, on every host: a queued event is not served by its queue-less route."""
    app = scope.get("app")
    blocks = app.get_blocks() if hasattr(app, "get_blocks") else None
    if blocks is not None and getattr(blocks, "api_open", False):
        blocks.api_open = False


STOP_EVENT = "stop"  # a Stop event's handler name (the page's, the Benchmark tab's) or API name (app.py)


def _is_stop(fn) -> bool:
    return fn is not None and STOP_EVENT in (getattr(fn, "name", None), getattr(fn, "api_name", None))


def _event_of(scope, path: str, fields):
    """The event a queue-less call runs, as Gradio picks it: the body's fn_index when it has one, else the
    API name that ends the path; None when there is no such event (Gradio answers)."""
    app = scope.get("app")
    blocks = app.get_blocks() if hasattr(app, "get_blocks") else None
    if blocks is None or not isinstance(fields, dict):
        return None
    index = _index(fields.get("fn_index"))
    if index is not None:
        return blocks.fns.get(index)
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return next((f for f in blocks.fns.values() if f.api_name == name), None)


def _index(value) -> int | None:
    """A body's fn_index as Gradio's body model reads it (5, 5.0 or "5"), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        return int(value.strip())
    return value if isinstance(value, int) else None


def _wrong_inputs(scope, path: str, fields) -> str | None:
    """What is wrong with the number of a join's inputs, or None (also when it cannot tell: Gradio decides)."""
    app = scope.get("app")
    blocks = app.get_blocks() if hasattr(app, "get_blocks") else None
    if blocks is None or not isinstance(fields, dict) or not isinstance(fields.get("data"), list):
        return None
    if "/call/" in path:
        name = path.rstrip("/").rsplit("/", 1)[-1]
        fn = next((f for f in blocks.fns.values() if f.api_name == name), None)
    else:
        name, fn = None, blocks.fns.get(fields.get("fn_index")) if isinstance(fields.get("fn_index"), int) else None
    if fn is None:
        return None
    counts = {len(fn.inputs), sum(not getattr(b, "skip_api", False) for b in fn.inputs)}
    got = len(fields["data"])
    if got in counts:
        return None
    names = _input_names(fn)
    said = f"/{fn.api_name}" if isinstance(fn.api_name, str) and fn.api_name else f"event {fields.get('fn_index')}"
    return (f"{said} takes {len(names)} inputs, in this order: {', '.join(names)}; got {got}. Send them all "
            f"in this order, or by name (gradio_client: client.predict(prompt=..., api_name=\"{said}\"))")


def _input_names(fn) -> list[str]:
    try:
        params = [p for p in inspect.signature(fn.fn).parameters.values()
                  if p.name != "request" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) == len(fn.inputs):
        return [p.name for p in params]
    return [str(getattr(b, "label", None) or type(b).__name__) for b in fn.inputs]


def _stop_fields(body: bytes) -> tuple[str, tuple[str, ...] | None]:
    fields = _json(body or b"{}")
    if fields is _NOT_JSON:
        raise ValueError('the body is not JSON; send {"session_hash": "..."}')
    if fields is _TOO_DEEP:
        raise ValueError(f'{TOO_DEEP}: send {{"session_hash": "...", "kinds": [...] (optional)}}')
    if not isinstance(fields, dict):
        raise ValueError('the body must be a JSON object: {"session_hash": "...", "kinds": [...] (optional)}')
    session, kinds = fields.get("session_hash"), fields.get("kinds")
    if not isinstance(session, str) or not 0 < len(session) <= MAX_SESSION:
        raise ValueError(f"session_hash must be the client's session hash, a string of 1 to {MAX_SESSION} "
                         "characters (gradio_client: client.session_hash)")
    if kinds is not None and not (isinstance(kinds, list) and all(isinstance(k, str) for k in kinds)):
        raise ValueError('kinds must be a list of request kinds, e.g. ["generate"], or left out for all')
    return session, None if kinds is None else tuple(kinds)


_NOT_JSON, _TOO_DEEP = object(), object()
TOO_DEEP = ("the body's JSON is nested too deeply for this server to read (hundreds of levels); a request's "
            "fields are plain values and short lists, nested a few levels at most")


def _json(body: bytes):
    """The body's JSON, _NOT_JSON, or _TOO_DEEP when its nesting exhausts the parser's recursion limit
    (a 5,000-deep body raised RecursionError here: a 500 and a traceback)."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return _NOT_JSON
    except RecursionError:
        return _TOO_DEEP


async def _body(receive, limit: int) -> bytes | None:
    """The whole request body, or None when it is over `limit` bytes."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body"):
            return body


def _replay(body: bytes, receive):
    """`receive` for the app behind: the body already read, then what the connection says next."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _address(scope, server) -> str:
    client = scope.get("client")
    peer = str(client[0]) if client else "unknown"
    return server.limits.proxies.client(peer, forwarded_in_scope(scope))  # every field line of it


async def _read_body(receive, send) -> tuple[bytes, object] | None:
    """A POST's body and its JSON fields; None once a too large (413) or too deeply nested (400) body is answered."""
    body = await _body(receive, MAX_JOIN_BODY)
    if body is None:
        await _answer(send, 413, {"detail": f"A request's body is at most {MAX_JOIN_BODY} bytes"})
        return None
    fields = _json(body)
    if fields is _TOO_DEEP:
        await _answer(send, 400, {"detail": sentence(TOO_DEEP)})
        return None
    return body, fields


async def _answer(send, status: int, payload: dict) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
