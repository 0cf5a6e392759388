"""A run told plan by plan: which plans ran, for how many rounds, what they committed, how long they
took and how often their drafts were accepted (from the run's events alone).

An adaptive run mixes plans (the lookup level's copy, drafts at one exit, the hierarchy, a plain
step; engine.policy); a fixed run is one plan throughout. Each plan's rounds are folded apart:
`rounds`, `new_tokens` committed in them, `seconds` of wall time (from the end of the previous
round to the end of this one: bookkeeping included), its share of the decode time (the prompt's
prefill apart), its per-token acceptance per level pair, and the lengths it used (the median
`count` and `verify_at`), which is what its prediction and break-even need.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from hispec.engine.config import recorded_lengths
from hispec.engine.events import DoneEvent, Event, PolicyEvent, RoundEvent, TokenEvent
from hispec.engine.levels import levels_by_role
from hispec.runs.metrics import StatsCollector

PLAIN = "plain"


@dataclass
class PlanRow:
    kind: str  # "plain", "lookup", "exit 4", "exit 2 -> exit 4"
    rounds: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    share: float = 0.0  # of the decode time (prefill apart)
    acceptance: dict[str, float | None] = field(default_factory=dict)  # per token, per level pair
    judged: dict[str, int] = field(default_factory=dict)  # tokens judged per pair (up to first rejections)
    count: int = 1  # median proposed tokens per round
    verify_at: int = 1  # median pending tokens that called the full model

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 else None


def fixed_kind(settings: dict) -> str:
    """The one plan a fixed run runs, named as the adaptive policy names its plans."""
    levels = tuple(settings.get("levels") or ())
    roles = levels_by_role(levels)  # exits by their layer, levels in a cheaper format by their spec ('full@q4')
    roles = {role: level if isinstance(level, str) else f"exit {level}" for role, level in roles.items()}
    if not roles:
        return "lookup" if "lookup" in levels else PLAIN
    kind = " -> ".join(roles[r] for r in ("draft", "verify") if r in roles)
    # with a level in a cheaper format the lookup level is named too ('lookup -> full@q4'); exact lists keep
    # the names their rounds always had ('exit 2 -> exit 4')
    cheap = any("@" in level for level in roles.values())
    return f"lookup -> {kind}" if cheap and "lookup" in levels else kind


def _lengths(choice: str) -> tuple[int, int]:
    """(count, verify_at) of a plan label: 'lookup 4', 'exit 2 x3', 'exit 2 x1 -> exit 4, full at 2'."""
    k, at = 1, 1
    for part in choice.replace(",", " ").split():
        if part.startswith("x") and part[1:].isdigit():
            k = int(part[1:])
    words = choice.split()
    if words and words[0] == "lookup" and len(words) > 1 and words[1].isdigit():
        k = int(words[1])
    if "full at" in choice:
        at = int(choice.rsplit("full at", 1)[1].split()[0])
    return k, at


def plan_rows(events: list[Event], settings: dict) -> list[PlanRow]:
    """One row per plan that ran, most time first."""
    choice_of: dict[int, str] = {ev.round: ev.choice for ev in events if isinstance(ev, PolicyEvent)}
    fixed = None if choice_of else fixed_kind(settings)
    if fixed is not None:  # fixed rounds: the settings' lengths every round
        k, at = recorded_lengths(settings)
    rows: dict[str, PlanRow] = {}
    collectors: dict[str, StatsCollector] = {}
    lengths: dict[str, list[tuple[int, int]]] = {}
    kind_of: dict[int, str] = {}
    prev_t, decode_s = 0.0, 0.0
    for ev in events:
        if isinstance(ev, RoundEvent) and ev.round == 0:
            prev_t = ev.t
            continue
        r = getattr(ev, "round", None)
        if r is None or r == 0 or isinstance(ev, DoneEvent):
            continue
        kind = kind_of.get(r)
        if kind is None:
            choice = choice_of.get(r)
            kind = fixed if fixed is not None else StatsCollector.choice_kind(choice) if choice else PLAIN
            kind_of[r] = kind
            lengths.setdefault(kind, []).append((k, at) if fixed is not None else _lengths(choice or PLAIN))
        row = rows.setdefault(kind, PlanRow(kind))
        collectors.setdefault(kind, StatsCollector()).add(ev)
        if isinstance(ev, RoundEvent):
            row.rounds += 1
            row.seconds += ev.t - prev_t
            decode_s += ev.t - prev_t
            prev_t = ev.t
        elif isinstance(ev, TokenEvent) and ev.state.value in ("accepted", "target_wrote"):
            row.new_tokens += 1
    for kind, row in rows.items():
        row.share = row.seconds / decode_s if decode_s > 0 else 0.0
        row.acceptance = collectors[kind].acceptance()
        row.judged = {key: n for key, (_, n) in collectors[kind].in_order.items()}
        ks, ats = zip(*lengths[kind])
        row.count, row.verify_at = int(statistics.median(ks)), int(statistics.median(ats))
    return sorted(rows.values(), key=lambda row: -row.seconds)
