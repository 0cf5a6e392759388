"""Which address of a proxy chain is the visitor's (serving.addresses.proxies): a second hop inside the host's
network must not make every visitor one address, by default on Spaces; an operator can state the
chain by trusted ranges or by a hop count."""

from __future__ import annotations

import pytest

from hispec.errors import ConfigError
from hispec.serving.limits import Limits
from hispec.serving.addresses.proxies import ProxyChain

SPACES = {"SPACE_ID": "someone/hispec"}


def test_on_spaces_a_second_internal_hop_does_not_make_every_visitor_one_address(monkeypatch):
    """Issue 50: with the old default ("*": the right-most forwarded address) both visitors below were
    172.16.0.1, and one visitor's joins locked the other out."""
    monkeypatch.setenv("SPACE_ID", "someone/hispec")
    chain = Limits.from_env({}).proxies
    assert chain.client("10.1.2.3", "198.51.100.7, 172.16.0.1") == "198.51.100.7"
    assert chain.client("10.1.2.3", "203.0.113.9, 172.16.0.1") == "203.0.113.9"
    assert chain.client("10.1.2.3", "198.51.100.7") == "198.51.100.7"  # one hop, as before
    # what a visitor writes to the left of the platform's own hops does not count
    assert chain.client("10.1.2.3", "6.6.6.6, 198.51.100.7, 172.16.0.1") == "198.51.100.7"
    assert chain.client("10.1.2.3", None) == "10.1.2.3"


def test_trusted_ranges_and_a_hop_count_an_operator_can_state():
    ranges = Limits.from_env({"HISPEC_TRUSTED_PROXIES": "10.0.0.0/8, 192.0.2.1"}).proxies
    assert ranges.client("10.9.9.9", "6.6.6.6, 198.51.100.7, 10.0.0.2") == "198.51.100.7"
    assert ranges.client("192.0.2.1", "198.51.100.7") == "198.51.100.7"
    assert ranges.client("198.51.100.99", "6.6.6.6") == "198.51.100.99"  # an untrusted peer: its header is ignored
    hops = Limits.from_env({"HISPEC_PROXY_HOPS": "2"}).proxies
    assert hops.client("10.0.0.1", "6.6.6.6, 198.51.100.7, 172.16.0.1") == "198.51.100.7"
    assert hops.client("10.0.0.1", "198.51.100.7") == "198.51.100.7"  # a shorter chain: the farthest hop known
    assert Limits.from_env({}).proxies.client("127.0.0.1", "6.6.6.6") == "127.0.0.1"  # unset: nothing believed


def test_a_bad_proxy_setting_says_what_is_allowed():
    with pytest.raises(ConfigError, match="'10.0.0.0/33' is not an address, a range .* 'private' or '\\*'"):
        Limits.from_env({"HISPEC_TRUSTED_PROXIES": "10.0.0.0/33"})
    with pytest.raises(ConfigError, match="HISPEC_PROXY_HOPS must be 0 or more"):
        Limits.from_env({"HISPEC_PROXY_HOPS": "-1"})
    assert ProxyChain(("*",)).client("1.2.3.4", "6.6.6.6, 7.7.7.7") == "7.7.7.7"  # "*" alone: the nearest hop


# ---- every field line of the header, and a hop's port ---------------------------------------------------
ONE_VISITOR_LINE = [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"198.51.100.7")]  # the proxy's own line


class Peer:
    host = "127.0.0.1"


class Starlette:
    """What serving gets from Gradio: a gr.Request's starlette request, its scope and headers."""

    def __init__(self, raw):
        from starlette.datastructures import Headers

        self.scope = {"type": "http", "headers": raw}
        self.headers = Headers(raw=raw)


class GradioRequest:
    def __init__(self, raw, with_scope: bool = True):
        from starlette.datastructures import Headers

        self.session_hash, self.client = "tab", Peer()
        self.request = Starlette(raw) if with_scope else None
        self.headers = Headers(raw=raw)


@pytest.mark.parametrize("chain", [ProxyChain(("*", "private")), ProxyChain(("127.0.0.1",)),
                                   ProxyChain(hops=1)], ids=["*,private", "127.0.0.1", "hops=1"])
def test_a_visitor_cannot_choose_its_address_with_a_line_of_its_own(chain):
    """Issue 57: only the first X-Forwarded-For line was read; behind a proxy that adds its own line, the
    visitor's line named the address. The lines are one list, in order (RFC 9110)."""
    from hispec.serving.caller import caller_of
    from hispec.serving.edge import _address

    class Server:
        class limits:
            proxies = chain

    for request in (GradioRequest(ONE_VISITOR_LINE), GradioRequest(ONE_VISITOR_LINE, with_scope=False)):
        assert caller_of(request, chain).address == "198.51.100.7"
    scope = {"type": "http", "client": ("127.0.0.1", 5000), "headers": [(b"host", b"x"), *ONE_VISITOR_LINE]}
    assert _address(scope, Server) == "198.51.100.7"


def test_hops_of_two_count_every_line():
    chain = ProxyChain(hops=2)
    raw = [(b"x-forwarded-for", b"6.6.6.6"), (b"x-forwarded-for", b"198.51.100.7, 10.0.0.1")]
    from hispec.serving.caller import caller_of

    assert caller_of(GradioRequest(raw), chain).address == "198.51.100.7"


def test_one_visitor_on_several_ports_is_one_visitor():
    chain = ProxyChain(("*", "private"))
    for port in ("1234", "4431"):
        assert chain.client("10.1.2.3", f"198.51.100.7:{port}, 172.16.0.1:80") == "198.51.100.7"
        assert chain.client("10.1.2.3", f"[2001:db8::7]:{port}, [fc00::1]:{port}") == "2001:db8::7"
    assert chain.client("10.1.2.3", "[2001:db8::7]") == "2001:db8::7"
    assert chain.client("10.1.2.3", "2001:db8::7") == "2001:db8::7"  # a bare IPv6 address keeps its colons
    assert ProxyChain(hops=1).client("10.0.0.1", "203.0.113.5:999") == "203.0.113.5"
