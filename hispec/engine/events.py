"""The engine's event vocabulary: one stream feeds the UI, the CLI and the benchmarks.

A token's life (see docs/DESIGN.md):

    drafted -> tentative (accepted by the intermediate verifier) | verify_rejected
    tentative -> accepted (by the target, committed) | target_rejected
    verify_wrote: the verifier's own token replacing a rejected draft (then tentative)
    target_wrote: the target's own token (correction, bonus, or an autoregressive step)
    discarded: dropped because generation ended inside a block (stop string)

``origin`` says which level wrote the token: "lookup", "draft", "verify" or "target" (see
hispec.engine.levels for the role names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from hispec.engine.planning.round import Round


class TokenState(str, Enum):
    DRAFTED = "drafted"
    TENTATIVE = "tentative"
    VERIFY_REJECTED = "verify_rejected"
    VERIFY_WROTE = "verify_wrote"
    ACCEPTED = "accepted"
    TARGET_REJECTED = "target_rejected"
    TARGET_WROTE = "target_wrote"
    DISCARDED = "discarded"


COMMITTED_STATES = (TokenState.ACCEPTED, TokenState.TARGET_WROTE)
REJECTED_STATES = (TokenState.VERIFY_REJECTED, TokenState.TARGET_REJECTED, TokenState.DISCARDED)


@dataclass(frozen=True)
class TokenEvent:
    state: TokenState
    serial: int  # unique per token instance (a re-drafted position gets a new serial)
    index: int  # position among generated tokens, 0 = first new token
    token_id: int
    text: str
    origin: str  # stage that wrote the token
    stage: str  # stage that decided this state
    round: int
    t: float  # seconds since the start of generation


@dataclass(frozen=True)
class PassEvent:
    """One stage ran layers [start, end) over some tokens (prefill included)."""

    stage: str
    start: int
    end: int
    serials: tuple[int, ...]
    seconds: float
    round: int
    # other visitors' generations in the call that carried it, and their rows (a pass shared on the model's pass
    # board, hispec.model.shared); 0 and 0 for a pass that ran alone
    beside: int = 0
    beside_rows: int = 0

    @property
    def layer_tokens(self) -> int:
        return (self.end - self.start) * len(self.serials)


@dataclass(frozen=True)
class RoundEvent:
    """End of a round: the state of the caches and buffers after it."""

    round: int
    committed: int
    tentative: int
    cache_lengths: tuple[int, ...]
    t: float


@dataclass(frozen=True)
class PolicyEvent:
    """The policy's plan for a round (every round, fixed or adaptive): the round as a value
    (engine.planning.round.Round), and, from the adaptive policy, the estimate behind it."""

    round: int
    choice: str  # the round's label (Round.label), e.g. "plain", "lookup 4", "exit 2 x1 -> exit 4, full at 2"
    count: int  # tokens proposed
    verify_at: int  # pending tokens that trigger the full model
    reason: str
    estimates: dict  # candidate label -> expected committed tokens per second (the best few, and plain)
    t: float
    plan: Round | None = None  # the round itself; None in traces recorded before rounds travelled as values
    expected_gain: float | None = None  # expected tokens/s over a plain step's when chosen (adaptive)
    adaptive: bool = True  # planned by an adaptive policy (False: a fixed round, the same every time)


@dataclass(frozen=True)
class DoneEvent:
    reason: str  # max_new_tokens | eos | stop_string | stopped
    token_ids: tuple[int, ...]
    text: str
    prompt_len: int
    t: float
    settings: dict = field(default_factory=dict)
    host_syncs: int = 0  # device-to-host transfers of decisions over the whole generation
    # the exact model's pass costs as the policy had them at the end (CostModel.figures_ms; {}: none kept):
    # the run is explained with these, frozen with it, whatever later runs teach the model's cost model
    costs_ms: dict = field(default_factory=dict)


Event = TokenEvent | PassEvent | RoundEvent | PolicyEvent | DoneEvent


# ---- the JSON trace: events as plain dicts (the app's API, replays of a finished run) -------
_TYPES = {"token": TokenEvent, "pass": PassEvent, "round": RoundEvent, "policy": PolicyEvent, "done": DoneEvent}
_TYPE_OF = {cls: name for name, cls in _TYPES.items()}


def event_to_dict(ev: Event) -> dict:
    """A JSON-ready dict of one event, with its kind under "type"."""
    out = {"type": _TYPE_OF[type(ev)]}
    for name in ev.__dataclass_fields__:
        value = getattr(ev, name)
        out[name] = (value.value if isinstance(value, TokenState) else list(value) if isinstance(value, tuple)
                     else value.to_dict() if isinstance(value, Round) else value)
    return out


def event_from_dict(data: dict) -> Event:
    """The event written by event_to_dict (unknown keys are an error, not ignored)."""
    kind = data.get("type")
    if kind not in _TYPES:
        raise ValueError(f"unknown event type {kind!r}; expected one of {', '.join(_TYPES)}")
    cls = _TYPES[kind]
    fields = {k: v for k, v in data.items() if k != "type"}
    unknown = set(fields) - set(cls.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{kind} event has unknown fields: {', '.join(sorted(unknown))}")
    if kind == "token":
        fields["state"] = TokenState(fields["state"])
    if kind == "policy" and isinstance(fields.get("plan"), dict):
        fields["plan"] = Round.from_dict(fields["plan"])
    for name in ("serials", "cache_lengths", "token_ids"):
        if name in fields:
            fields[name] = tuple(fields[name])
    if kind == "done" and isinstance(fields.get("settings"), dict):  # the config's tuples (levels) came back as lists
        fields["settings"] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields["settings"].items()}
    return cls(**fields)
