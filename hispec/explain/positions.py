"""Acceptance by position in the block: for each pair of levels that judged, the share of its blocks whose
i-th token survived (runs.record.PairAcceptance.survival), beside the block length the run's plans gave that
pair, and one sentence on what the fall says about those lengths.

    RunRecord.pairs (by position) + RunRecord.plans (each round's lengths) --> falls() --> fall_sentence()

A token survives when it and every token before it in its block were kept: what falls with the position is
why a longer block stops paying (each further token is kept only as often as its survival).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hispec.engine.levels import Level
from hispec.engine.planning.round import Round
from hispec.runs.record import PairAcceptance, RunRecord

HALF = 0.5  # a block "pays" to the position where at least half of the blocks still survive


@dataclass(frozen=True)
class Fall:
    pair: PairAcceptance
    survival: tuple[float, ...]  # [i]: the share of blocks whose (i+1)-th token survived
    length: int | None  # the median block the run's plans gave the pair to judge; None: no plan named it

    @property
    def blocks(self) -> int:
        return self.pair.by_position[0][1]

    @property
    def reach(self) -> int:
        """How many leading positions at least half of the blocks survive."""
        return next((i for i, s in enumerate(self.survival) if s < HALF), len(self.survival))


def block_length(r: Round, low: Level, high: Level) -> int | None:
    """The tokens a round gives the pair (low, high) to judge at most: the proposer's count to the level above
    it, and to a judge below the full model; to the full model from a judge, what is pending when it runs (the
    threshold, or the judged block and what the judge drafted on). None: the round has no such pair."""
    if (low, high) not in r.kind.pairs(r.top):
        return None
    if low == r.proposer or high != r.top:
        return r.count
    return max(r.verify_at, r.count + r.then)


def falls(record: RunRecord) -> list[Fall]:
    """Each pair that judged, bottom first, with its survival by position and the median block its plans gave it."""
    out = []
    for pair in record.pairs:
        survival = tuple(pair.survival())
        if not survival:
            continue
        lengths = [n for r in record.plans.values() for n in [block_length(r, pair.low, pair.high)] if n]
        out.append(Fall(pair, survival, statistics.median_low(lengths) if lengths else None))
    return out


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _clause(f: Fall, chose: str) -> str:
    """One pair's fall in words, then the length its plans gave it set against the fall."""
    s, k = f.survival, len(f.survival)
    then = "" if f.length is None else f"; {chose} {f.length} a round"
    if f.reach == k:  # at least half of the blocks survive to the deepest position measured
        if k == 1:
            return f"the 1st token survives in {s[0]:.0%} of {f.blocks} blocks, none longer than one token{then}"
        return f"the {ordinal(k)} token still survives in {s[-1]:.0%} of {f.blocks} blocks, so long blocks pay{then}"
    cut = f.reach + 1  # the first position that fewer than half of the blocks reach
    said = f"the {ordinal(cut)} token survives in {s[cut - 1]:.0%} of {f.blocks} blocks"
    if cut > 1:
        said += f" (the 1st in {s[0]:.0%})"
    if f.length is None:
        return said
    if f.length <= cut:
        return f"{said}; {chose} {f.length} a round, no further than where most blocks are cut"
    return f"{said}, yet {chose} {f.length} a round: most of the tokens past the {ordinal(cut)} are thrown away"


def fall_sentence(found: list[Fall], adapts: bool) -> str:
    """One sentence on every pair's fall and the block lengths the run gave it ('' when no pair judged)."""
    if not found:
        return ""
    chose = "the policy chose" if adapts else "the fixed rounds gave it"
    return ("By position in the block: " + "; ".join(f"{f.pair.words}: {_clause(f, chose)}" for f in found)
            + ".")
