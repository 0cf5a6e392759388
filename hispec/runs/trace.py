"""Fold token events into what a reader sees: every token ever proposed, in order, with its
latest state. The CLI's coloured text and the app's coloured spans both render a Trace."""

from __future__ import annotations

from dataclasses import dataclass, field

from hispec.engine.events import COMMITTED_STATES, Event, TokenEvent
from hispec.engine.events import TokenState as S

# Display classes, in legend order: (class, short label, what it means).
LEGEND = (
    ("drafted", "drafted", "proposed by the draft exit (or copied by lookup), waiting for a verifier"),
    ("tentative", "tentative", "accepted by the intermediate verifier, waiting for the full model"),
    ("accepted", "accepted", "drafted, then accepted by the full model (committed)"),
    ("copied", "copied", "proposed by the lookup level, copied from earlier text (the prompt as the model reads "
                         "it, its chat template's own words included, or what it wrote so far), accepted by the "
                         "full model"),
    ("precision", "4-bit draft", "drafted by the same weights in a cheaper format (4-bit), accepted by the full model"),
    ("verify-wrote", "verifier's token", "written by the intermediate verifier (a correction), committed"),
    ("target-wrote", "full model's token", "written by the full model itself: a correction, bonus or plain step"),
    ("verify-rejected", "rejected by verifier", "draft thrown away early by the intermediate verifier"),
    ("target-rejected", "rejected by full model", "rejected by the full model; everything after it was discarded"),
    ("discarded", "discarded", "dropped because generation stopped inside a block"),
)


@dataclass
class TraceToken:
    serial: int
    index: int
    token_id: int
    text: str
    origin: str
    state: S
    stage: str
    round: int
    born: S = S.DRAFTED  # the token's first state: how it entered the sequence
    history: list = field(default_factory=list)  # every (state, stage that decided it, round), in order
    cheap: bool = False  # written by a level in a cheaper format of the weights (full@q4, 4@q4)

    @property
    def css_class(self) -> str:
        if self.state in COMMITTED_STATES:
            if self.born is S.DRAFTED:  # proposed (copied or drafted at an exit), then accepted
                return "copied" if self.origin == "lookup" else "precision" if self.cheap else "accepted"
            return "verify-wrote" if self.born is S.VERIFY_WROTE else "target-wrote"
        if self.state in (S.TENTATIVE, S.VERIFY_WROTE):
            return "tentative"
        return self.state.value.replace("_", "-")

    @property
    def rejected(self) -> bool:
        return self.css_class in ("verify-rejected", "target-rejected", "discarded")


class Trace:
    def __init__(self):
        self.tokens: dict[int, TraceToken] = {}
        self.cheap_roles: set[str] = set()  # the roles of levels in a cheaper format (set_levels)

    def set_levels(self, levels) -> None:
        """The run's level list (settings' `levels`): tokens of its levels in a cheaper format get their
        own class, those already here included."""
        from hispec.engine.levels import levels_by_role

        roles = levels_by_role(tuple(levels or ()))
        self.cheap_roles = {role for role, level in roles.items() if "@" in str(level)}
        for token in self.tokens.values():
            token.cheap = token.origin in self.cheap_roles

    def add(self, ev: Event) -> None:
        if not isinstance(ev, TokenEvent):
            return
        token = self.tokens.get(ev.serial)
        if token is None:
            token = self.tokens[ev.serial] = TraceToken(ev.serial, ev.index, ev.token_id, ev.text, ev.origin,
                                                        ev.state, ev.stage, ev.round, ev.state,
                                                        cheap=ev.origin in self.cheap_roles)
        else:
            token.state, token.stage, token.round = ev.state, ev.stage, ev.round
        token.history.append((ev.state, ev.stage, ev.round))

    def __iter__(self):
        return iter(self.tokens.values())

    def at(self, index: int) -> list[TraceToken]:
        """Every token that held generated position `index`, in the order they came."""
        return [t for t in self if t.index == index]

    def counts(self) -> dict[str, int]:
        out = {cls: 0 for cls, _, _ in LEGEND}
        for token in self:
            out[token.css_class] += 1
        return out
