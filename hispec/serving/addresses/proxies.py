"""Which address in a proxy chain is the client's: by the proxies the operator trusts, or by how
many proxies stand in front of the server.

Each proxy appends the address it saw to X-Forwarded-For, so the right end of the header is the
nearest hop; anything to the left of the operator's own proxies may be written by the client. Two
ways to say where the operator's chain ends (HISPEC_TRUSTED_PROXIES, HISPEC_PROXY_HOPS):

- trusted proxies: addresses ("10.0.0.9"), ranges ("10.0.0.0/8"), `private` (the private, loopback,
  link-local and shared ranges: a proxy inside the host's own network), or `*` (any peer: a server
  reachable only through its proxy). When the peer is trusted, the client is the right-most
  forwarded address that is not a trusted proxy.
- a hop count N: exactly N proxies stand in front of the server and each appends what it saw; the
  client is the N-th address from the right (the peer being the nearest proxy). It wins over the list.

The header may come as several field lines (a proxy that adds its own line instead of appending to
the one it got): they are one list, joined in order (RFC 9110, 5.3), so the right end is still the
nearest hop (`forwarded_for`). A hop written with a port (`198.51.100.7:4431`, `[2001:db8::1]:443`)
is its address alone: one visitor on several ports is one visitor.

Unset, no forwarded header is believed: the peer is the client. On Hugging Face Spaces the default
is `*,private`: the Space is reachable only through its proxy, and hops inside the platform's private
network are skipped, so a second internal hop (`<visitor>, 10.0.0.1`) does not make every visitor one
address.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from functools import cached_property

ANY = "*"  # any peer is the operator's proxy
PRIVATE = "private"  # the private, loopback, link-local and shared address ranges
PRIVATE_RANGES = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "127.0.0.0/8", "169.254.0.0/16", "100.64.0.0/10",
                  "::1/128", "fc00::/7", "fe80::/10")
MAX_ADDRESS = 64  # characters of an address kept from a header


@dataclass(frozen=True)
class ProxyChain:
    trusted: tuple[str, ...] = ()  # addresses, ranges, PRIVATE or ANY
    hops: int = 0  # proxies in front of the server (0: read the chain by `trusted`)

    def __post_init__(self):
        self.networks  # a bad range is refused when the chain is made

    @cached_property
    def networks(self) -> tuple:
        out = []
        for entry in self.trusted:
            if entry == ANY:
                continue
            for text in PRIVATE_RANGES if entry == PRIVATE else (entry,):
                try:
                    out.append(ipaddress.ip_network(text, strict=False))
                except ValueError:
                    raise ValueError(f"trusted proxy {entry!r} is not an address, a range (10.0.0.0/8), "
                                     f"{PRIVATE!r} or {ANY!r}") from None
        return tuple(out)

    def client(self, peer: str, forwarded: str | None) -> str:
        """The client's address: the peer, or the forwarded address the chain names."""
        if not forwarded or not (self.hops or ANY in self.trusted or self._trusted(peer)):
            return peer
        hops = [host(h) for h in forwarded.split(",") if h.strip()]
        if not hops:
            return peer
        if self.hops:
            return hops[-min(self.hops, len(hops))][:MAX_ADDRESS]
        for hop in reversed(hops):
            if not self._trusted(hop):
                return hop[:MAX_ADDRESS]
        return hops[0][:MAX_ADDRESS]  # every hop is a trusted proxy: the farthest one known

    def _trusted(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return address in self.trusted
        return any(ip in net for net in self.networks if ip.version == net.version)

    def describe(self) -> str:
        if self.hops:
            return f"the client is the address {self.hops} proxies in front of the server saw"
        if not self.trusted:
            return "no forwarded header is believed"
        return f"forwarded addresses believed from {', '.join(self.trusted)}"


def host(hop: str) -> str:
    """A forwarded hop without its port: '198.51.100.7:4431' -> '198.51.100.7', '[2001:db8::1]:443' and
    '[2001:db8::1]' -> '2001:db8::1'; a bare IPv6 address or anything else is left as it is (stripped)."""
    hop = hop.strip()
    if hop.startswith("["):
        inside, bracket, rest = hop[1:].partition("]")
        if bracket and (not rest or (rest[:1] == ":" and rest[1:].isascii() and rest[1:].isdigit())):
            return inside
        return hop
    address, colon, port = hop.partition(":")
    if colon and ":" not in port and port.isascii() and port.isdigit():
        return address  # one colon: an IPv4 address or a name, then its port
    return hop


def forwarded_for(lines) -> str | None:
    """Every X-Forwarded-For field line (str or latin-1 bytes), in order, as the one list they are (RFC 9110:
    several field lines of a list-valued field are one comma-joined value); None when there is none."""
    values = [line.decode("latin-1") if isinstance(line, bytes) else str(line) for line in lines]
    return ", ".join(values) if values else None


def forwarded_in_scope(scope) -> str | None:
    """The X-Forwarded-For of an ASGI scope, every field line of it (`forwarded_for`)."""
    headers = scope.get("headers") if isinstance(scope, dict) else None
    return forwarded_for(value for name, value in headers or () if name.lower() == b"x-forwarded-for")
