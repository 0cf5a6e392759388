"""Who is asking: the session a Stop belongs to, and the address a rate limit counts.

The session is Gradio's session hash (one per browser tab or API client): a visitor's Stop reaches
the requests of that session only. The address is the peer's IP, or, when the peer is a proxy the
operator trusts (HISPEC_TRUSTED_PROXIES; Hugging Face Spaces runs behind one), the nearest address
in X-Forwarded-For that is not a trusted proxy. A client cannot choose its address by sending a
header: headers from untrusted peers are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass

ANY = "*"  # trust every peer's X-Forwarded-For (a server reachable only through its proxy)


@dataclass(frozen=True)
class Caller:
    session: str  # whose requests a Stop reaches
    address: str  # what the rate limit counts


LOCAL = Caller("local", "local")  # a caller without a request: the command line, a test


def caller_of(request, trusted_proxies: tuple[str, ...] = ()) -> Caller:
    """The Caller of a request (a gr.Request or anything with session_hash, client.host, headers)."""
    if request is None:
        return LOCAL
    session = str(getattr(request, "session_hash", None) or "anonymous")
    client = getattr(request, "client", None)
    peer = str(getattr(client, "host", None) or "unknown")
    return Caller(session, client_address(peer, _header(request, "x-forwarded-for"), trusted_proxies))


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


def _header(request, name: str) -> str | None:
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    try:
        value = headers.get(name)
    except Exception:  # an odd headers object: no forwarded address
        return None
    return value if isinstance(value, str) else None
