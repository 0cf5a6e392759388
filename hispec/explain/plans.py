"""A run told plan by plan: which plans ran, for how many rounds, what they committed, how long they
took and how often their drafts were accepted (from the run's events alone).

An adaptive run mixes plans (the lookup level's copy, drafts at one exit, the hierarchy, a plain
step; engine.planning.policy); a fixed run is one plan throughout. Each plan's rounds are folded apart:
`rounds`, `new_tokens` committed in them, `seconds` of wall time (from the end of the previous
round to the end of this one: bookkeeping included), its share of the decode time (the prompt's
prefill apart), its per-token acceptance per level pair, the lengths it used (the median `count`,
`verify_at` and `then`), which is what its prediction and break-even need, and the gain over a plain step
the adaptive policy expected when it chose it. Rounds are read as values (PolicyEvent.plan), never from
their labels (a trace recorded before that is read once, by runs.record).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hispec.engine.events import DoneEvent, RoundEvent, TokenEvent
from hispec.engine.levels import Level
from hispec.engine.planning.round import Round, RoundKind
from hispec.runs.metrics import StatsCollector
from hispec.runs.record import PairAcceptance, RunRecord, pairs_of

Pair = tuple[Level, Level]


@dataclass
class PlanRow:
    kind: RoundKind  # who proposed, who judged, whether the judge drafted on
    top: Level  # the run's full model
    rounds: int = 0
    new_tokens: int = 0
    seconds: float = 0.0
    share: float = 0.0  # of the decode time (prefill apart)
    pairs: tuple[PairAcceptance, ...] = ()  # per token, per level pair (in order up to first rejections)
    count: int = 1  # median proposed tokens per round
    verify_at: int = 1  # median pending tokens that called the full model
    then: int = 0  # median tokens the judge drafted on
    expected_gain: float | None = None  # median gain over a plain step the policy expected when it chose it

    @property
    def acceptance(self) -> dict[Pair, float | None]:
        return {(p.low, p.high): p.rate for p in self.pairs}

    @property
    def judged(self) -> dict[Pair, int]:
        return {(p.low, p.high): p.judged for p in self.pairs}

    @property
    def round(self) -> Round:
        """The plan's typical round: its kind at its median lengths."""
        return Round(self.kind.proposer, self.top, self.count, self.kind.judges, self.verify_at,
                     self.then if self.kind.drafts_on else 0)

    @property
    def tokens_per_s(self) -> float | None:
        return self.new_tokens / self.seconds if self.seconds > 0 else None


def plan_rows(record: RunRecord) -> list[PlanRow]:
    """One row per kind of plan that ran, most time first."""
    rows: dict[RoundKind, PlanRow] = {}
    collectors: dict[RoundKind, StatsCollector] = {}
    shapes: dict[RoundKind, list[tuple[int, int, int]]] = {}
    gains: dict[RoundKind, list[float]] = {}
    seen: set[int] = set()
    prev_t, decode_s = 0.0, 0.0
    for ev in record.events:
        if isinstance(ev, RoundEvent) and ev.round == 0:
            prev_t = ev.t
            continue
        r = getattr(ev, "round", None)
        if r is None or r == 0 or isinstance(ev, DoneEvent) or r not in record.plans:
            continue
        chosen = record.plans[r]
        kind = chosen.kind
        if r not in seen:
            seen.add(r)
            shapes.setdefault(kind, []).append((chosen.count, chosen.verify_at, chosen.then))
        if getattr(ev, "expected_gain", None) is not None:  # the PolicyEvent of an adaptive round
            gains.setdefault(kind, []).append(ev.expected_gain)
        row = rows.setdefault(kind, PlanRow(kind, record.top))
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
        row.pairs = pairs_of(collectors[kind], record.levels)
        ks, ats, thens = zip(*shapes[kind])
        row.count, row.verify_at, row.then = (int(statistics.median(x)) for x in (ks, ats, thens))
        if gains.get(kind):
            row.expected_gain = statistics.median(gains[kind])
    return sorted(rows.values(), key=lambda row: -row.seconds)
