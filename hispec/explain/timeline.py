"""A run's passes on one clock: one lane per level of its list, each pass of that level's layers a block
(from the run's PassEvents), beside plain decoding's pace as its timing pairs measured it.

A PassEvent carries its length (`seconds`) and its round, not its start: a round's passes are laid end to end
in their order from the round's start (the end of the round before; round 0's, the prompt's prefill, at 0), at
their measured lengths, so the gap before the next round is the round's other work (exit heads, token choice,
the engine's bookkeeping). A level's lane holds the passes through its own layers, from the level below it in
its number format up to its own exit (lane_layout's stages): a plain step runs through every exact lane. Lookup
runs no layers: its lane marks each round's copy instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from hispec.engine.events import PassEvent, RoundEvent, TokenEvent, TokenState
from hispec.engine.lanes import lane_layout
from hispec.engine.levels import LOOKUP, Level
from hispec.runs.record import RunRecord, words


@dataclass(frozen=True)
class Block:
    start: float  # seconds since the start of generation (the run's clock)
    seconds: float
    round: int
    layers: tuple[int, int]  # [start, end)
    tokens: int
    prefill: bool = False  # the prompt's prefill (round 0)
    beside: int = 0  # other visitors' passes in the call that carried it (a shared pass; 0: alone)
    beside_rows: int = 0  # their rows in that call


@dataclass(frozen=True)
class Lane:
    words: str  # 'exit 2 (layers 0–2)', '4-bit full model (layers 0–30)', 'lookup (no layers)', 'plain decoding'
    level: Level | None  # None: plain decoding's lane, or a stage no level of the list names
    blocks: tuple[Block, ...] = ()
    copies: tuple[tuple[float, int, int], ...] = ()  # lookup's: (when, round, tokens copied)


@dataclass(frozen=True)
class Timeline:
    lanes: tuple[Lane, ...]  # the run's levels bottom first, then plain decoding's when its pairs measured it
    passes: int  # the PassEvents laid out (every one of the run's)

    @property
    def timed(self) -> bool:
        return self.passes > 0

    @property
    def shared(self) -> tuple[tuple[Lane, Block], ...]:
        """The run's passes that other visitors' passes shared a call with, each with its lane."""
        return tuple((lane, b) for lane in self.lanes if lane.level is not None for b in lane.blocks if b.beside)


def plain_pace(plain: Mapping | None) -> tuple[float, float] | None:
    """Plain decoding as the run's timing pairs measured it: (seconds to its first token, the pairs' median
    prefill; tokens/s after it, their median decode rate). None without a measured pair."""
    rates = [r for r in (plain or {}).get("plain_decode_tokens_per_s") or [] if r]
    if not rates or not (plain or {}).get("runs"):
        return None
    return float(plain.get("prefill_s") or 0.0), sorted(rates)[len(rates) // 2]


def _ranges(levels: tuple[Level, ...]) -> dict[int, tuple[int, int]]:
    """Each level that runs layers (by its index in the list): the layers its stage holds."""
    layout, stops = lane_layout(levels)
    return {j: (layout[p][0][i - 1], layout[p][0][i]) for j, (p, i) in stops.items()}


def _lane_words(level: Level, layers: tuple[int, int] | None) -> str:
    name = words(level).removeprefix("the ")
    return f"{name} (no layers)" if layers is None else f"{name} (layers {layers[0]}–{layers[1]})"


def _starts(events) -> dict[int, float]:
    """Each round's start on the run's clock: the end of the round before (round 1's: the prompt's first token)."""
    ends = {ev.round: ev.t for ev in events if isinstance(ev, RoundEvent)}
    first = [ev.t for ev in events if isinstance(ev, TokenEvent) and ev.round == 0]
    if 0 not in ends and first:
        ends[0] = min(first)
    rounds = sorted({ev.round for ev in events if isinstance(ev, PassEvent)} | set(ends))
    starts, last = {}, 0.0
    for r in rounds:
        starts[r] = ends.get(r - 1, last) if r else 0.0
        last = ends.get(r, starts[r])
    return starts


def timeline_of(record: RunRecord) -> Timeline:
    """The run's passes, lane by level (Timeline.timed is False when its events hold no pass)."""
    levels = record.levels
    ranges = _ranges(levels)
    by_stage = {lv.name: j for j, lv in enumerate(levels)}
    exact_by_end = {ranges[j]: j for j, lv in enumerate(levels) if j in ranges and lv.precision is None}
    blocks: dict[int | str, list[Block]] = {j: [] for j in range(len(levels))}
    starts, clock, passes = _starts(record.events), {}, 0
    for ev in record.events:
        if not isinstance(ev, PassEvent):
            continue
        passes += 1
        at = clock.get(ev.round, starts.get(ev.round, 0.0))
        clock[ev.round] = at + ev.seconds
        prefill = ev.stage == "prefill"
        where = exact_by_end.get((ev.start, ev.end)) if prefill else by_stage.get(ev.stage)
        blocks.setdefault(ev.stage if where is None else where, []).append(
            Block(at, ev.seconds, ev.round, (ev.start, ev.end), len(ev.serials), prefill, ev.beside, ev.beside_rows))
    copies: dict[int, list[float]] = {}
    for ev in record.events:
        if isinstance(ev, TokenEvent) and ev.state is TokenState.DRAFTED and ev.origin == LOOKUP:
            copies.setdefault(ev.round, []).append(ev.t)
    lanes = []
    for j, level in enumerate(levels):
        marks = tuple((min(ts), r, len(ts)) for r, ts in sorted(copies.items())) if level.kind == LOOKUP else ()
        lanes.append(Lane(_lane_words(level, ranges.get(j)), level, tuple(blocks[j]), marks))
    for stage in (key for key in blocks if isinstance(key, str)):  # a stage no level names (a lane's unused tail)
        lanes.append(Lane(f"{stage} layers", None, tuple(blocks[stage])))
    pace = plain_pace(record.vs_plain)
    if pace is not None and record.token_ids:
        first, rate = pace
        steps = [Block(first + (i - 1) / rate, 1 / rate, i, (0, record.num_layers), 1)
                 for i in range(1, len(record.token_ids))]
        prompt = Block(0.0, first, 0, (0, record.num_layers), len(record.prompt_ids), prefill=True)
        lanes.append(Lane("plain decoding (measured pace)", None, (prompt, *steps)))
    return Timeline(tuple(lanes), passes)
