"""A bench method as a value, and the one grammar of the text a person types and a report keys it by.

    METHOD[/POLICY][@WEIGHTS]   ours: autoregressive, layerskip, lookup, hispec; POLICY fixed or auto
    LEVELS[/POLICY][@WEIGHTS]   ours, a level list joined by '+' (engine.levels): lookup+full@a8/auto@q4
    PEER[:N][@WEIGHTS]          a peer of evaluation.peers (llamacpp_lookup:4); @ where it runs on the weights

'@' also names a level's precision. The last '@X' is the weights when it follows a policy ('lookup+4/auto@q4'),
a method or peer name ('hispec@q4', 'llamacpp@q4'), a level that has its precision ('full@q4@fp32'; also
'2@q4+full@q4': exit 2 in 4-bit on the 4-bit weights), or when X is fp32 (never a level's precision); otherwise
it is a level's: 'lookup+4@q4' runs exit 4 in 4-bit under the float32 model (write 'lookup+4/auto@q4' for those
levels on 4-bit weights). `parse` reads the text, `key` writes it back; elsewhere a method travels as the value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hispec.engine.config import METHODS
from hispec.engine.levels import parse_levels
from hispec.engine.planning.policy import POLICIES
from hispec.errors import ConfigError
from hispec.evaluation import peers
from hispec.model.loading import WEIGHTS

# A bench without a method list: ours and the peers of the default set (transformers'); every peer of the
# table (llama.cpp's too) by name (evaluation.peers)
BENCH_METHODS = ("autoregressive", *peers.DEFAULT_SET, "layerskip", "lookup", "hispec")


@dataclass(frozen=True)
class BenchMethod:
    """One of ours (`method`: the preset it runs, 'hispec' for a level list; `levels`: the list, parsed;
    `policy`: 'fixed', 'auto' or None for the run's) or a peer (`peer`: its entry in evaluation.peers, `count`:
    its N), on `weights` (None: the bench's first format). `name`: what stands before the policy as written
    ('hispec', 'lookup+full@a8', 'llamacpp_lookup:4'); `spelling`: the text as typed where `key` would
    write it otherwise ('hispec/', 'hispec/ auto'), so a record keeps what was typed."""

    name: str
    policy: str | None = None
    weights: str | None = None
    method: str | None = None
    levels: tuple | None = None
    peer: peers.Peer | None = None
    count: int | None = None
    spelling: str = ""

    @property
    def key(self) -> str:
        """The method as reports key it: 'hispec/auto@fp32', 'lookup+full@a8/auto@q4', 'llamacpp_lookup:4'."""
        policy, weights = f"/{self.policy}" if self.policy else "", f"@{self.weights}" if self.weights else ""
        return self.spelling or f"{self.name}{policy}{weights}"

    @property
    def on_weights(self) -> bool:
        """Whether it runs on the bench's loaded weights (ours, transformers' peers), so @FORMAT applies."""
        return self.peer is None or self.peer.on_weights

    def on(self, weights: str, policy: str) -> BenchMethod:
        """This method on `weights` (as METHOD@FORMAT); a level list without a policy gets `policy` spelled
        out, so the tag is not read as a level's precision ('lookup+4' -> 'lookup+4/auto@q4')."""
        if self.spelling:  # typed otherwise than `key` writes it: the text with its tag, read again
            name = self.spelling.partition("/")[0]
            as_is = "/" in self.spelling or name in METHODS or name.partition(":")[0] in peers.PEERS
            return BenchMethod.parse(f"{self.spelling if as_is else f'{self.spelling}/{policy}'}@{weights}")
        own = policy if self.levels is not None and self.policy is None else self.policy
        return replace(self, weights=weights, policy=own)

    @classmethod
    def plain(cls, weights: str | None = None) -> BenchMethod:
        """Plain decoding (on `weights`): every format's reference."""
        return cls("autoregressive", weights=weights, method="autoregressive")

    @classmethod
    def parse(cls, text: str) -> BenchMethod:
        """A bench method as typed; a ConfigError says what is wrong and what is allowed."""
        head, weights = _split_weights(text)
        if weights is not None and weights not in WEIGHTS:
            raise ConfigError(f"'{head}@{weights}': the weights after @ are {', '.join(WEIGHTS)}")
        if head.partition(":")[0] in peers.PEERS:  # a malformed count still names a peer
            found = _peer(head, weights)
        elif _ours(head.partition("/")[0]):
            found = replace(cls.parse_ours(head), weights=weights)
        else:
            raise ConfigError(f"unknown benchmark method '{head}'; choose from {', '.join(BENCH_METHODS)} (ours "
                              "optionally with /fixed or /auto), or a level list such as lookup+2+4")
        return found if found.key == text else replace(found, spelling=text)

    @classmethod
    def parse_ours(cls, text: str) -> BenchMethod:
        """One of our methods without weights, as `generate` takes it: METHOD[/POLICY] or LEVELS[/POLICY]."""
        label = text.strip()
        name, _, policy = label.partition("/")
        policy = policy.strip() or None
        if policy is not None and policy not in POLICIES:
            raise ConfigError(f"unknown policy '{policy}' in '{label}'; write METHOD/fixed or METHOD/auto")
        if name in METHODS:
            return cls(name, policy, method=name)
        if _ours(name):
            return cls(name, policy, method="hispec", levels=parse_levels(name.split("+")))
        raise ConfigError(f"unknown method '{name}'; choose from {', '.join(METHODS)}, optionally with /fixed or "
                          "/auto, or a level list joined by '+' such as lookup+2+4")


def _ours(name: str) -> bool:
    """Whether a name (before any policy) is one of our methods or a level list."""
    return name in METHODS or "+" in name or "@" in name or name.startswith("exit") or name.isdigit()


def _split_weights(text: str) -> tuple[str, str | None]:
    """The text before the weights tag and the tag (None: none), by the rules of the module's docstring."""
    head, sep, tail = text.rpartition("@")
    if not sep or "/" in tail or "+" in tail:
        return text, None
    plain = head.partition("/")[0] in METHODS or head.partition(":")[0] in peers.PEERS
    if "/" in head or plain or "@" in head or tail == "fp32":
        return head, tail or None
    return text, None


def _peer(name: str, weights: str | None) -> BenchMethod:
    """A peer's method: 'llamacpp_lookup:4' -> its peer and N (its default when not given)."""
    peer_name, sep, n = name.partition(":")
    peer = peers.PEERS[peer_name]
    if sep and peer.count is None:
        raise ConfigError(f"'{name}': {peer_name} takes no count after ':'")
    if sep and not (n.isdigit() and peer.count[0] <= int(n) <= peer.count[1]):
        raise ConfigError(f"'{name}': {peer_name}:N takes a whole number from {peer.count[0]} to {peer.count[1]}")
    if weights is not None and not peer.on_weights:
        raise ConfigError(f"'{name}@{weights}': {name} runs its own file, whatever the weights; write it without @")
    return BenchMethod(name, weights=weights, peer=peer, count=int(n) if sep else peer.count_default)
