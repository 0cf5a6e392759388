"""A round as a value: which level proposes and how many tokens, which levels judge, when the full model
runs, and whether the last judge drafts on. The policy plans one (``engine.planning.policy``), the decoder runs it,
the ``PolicyEvent`` carries it, and the statistics, the explanations and the page read it; nothing
downstream takes a label apart.

    policy.plan() -> Round --> PolicyEvent(plan=Round) --> stats / trace / why / what-if / page
                      ^ Round.rate(costs by lane, acceptance): one formula for the policy and the page

A round's ``kind`` leaves out its counts (who proposes, who judges, whether the judge drafts on): it is
what the statistics count rounds by and what the page explains plan by plan. Its ``key`` is the text a
kind is recorded under in JSON (``policy_choices``); ``kind_words`` is the one reader of such keys, for
artifacts. ``Round.label`` is the policy's short label, kept for traces; ``Round.from_label`` is the one
reader of labels, for traces recorded before rounds travelled as values.

The expected rate of a round, in committed tokens per second, is (1 + expected accepted) / expected
seconds: acceptance per token and in order (a geometric run, ``expected_run``), seconds from each lane's
cost model (``engine.planning.costs``; a level in a cheaper format runs in its own lane, so the exact model then
runs all L layers over what survived it), plus the engine's own work per pass (``CostModel.step``, the exact
lane's: one engine runs every lane's passes) times the passes the round makes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from hispec.engine.planning.costs import CostModel
from hispec.engine.levels import FULL, LOOKUP, Level, level_words

MAX_HIERARCHY_ROUNDS = 8  # rounds a hierarchy plan is expected to wait for its threshold at most: with a low
#                           draft->verify estimate the expected wait grows without bound; 8 rounds cap the estimate

PLAIN_KEY = "plain"
DRAFTS_ON = " (drafts on)"
# What "(drafts on)" means, wherever a plan kind is shown with it.
DRAFTS_ON_MEANS = ("(drafts on): the judging level, after checking lookup's copy, drafts further tokens itself in "
                   "the same round, and the full model checks all of them in one pass")


def expected_run(rate: float, k: float) -> float:
    """Expected accepted tokens among k proposals judged in order, each accepted with `rate`
    until the first rejection: rate + rate^2 + ... + rate^k (k may be fractional)."""
    if k <= 0:
        return 0.0
    if rate >= 1.0:
        return float(k)
    return rate * (1 - rate**k) / (1 - rate)


# ---- expected committed tokens per second of each shape of round ---------------------------
def plain_rate(c: CostModel, L: int) -> float:
    """A plain step: one pass of [0, L) and the final head over one token."""
    return 1.0 / (L * c.layer(1) + c.head(L, 1) + c.step)


def lookup_rate(c: CostModel, L: int, k: int, a: float) -> float:
    """k copied tokens verified by one pass of [0, L) over k + 1 tokens."""
    return (1 + expected_run(a, k)) / (L * c.layer(k + 1) + c.head(L, k + 1) + c.step)


def exit_rate(c: CostModel, L: int, e: int, k: int, a: float) -> float:
    """Single-exit self-speculation: k drafts at exit e, then [e, L) over k + 1 tokens."""
    seconds = (k + 1) * (e * c.layer(1)) + k * c.head(e, 1) + (L - e) * c.layer(k + 1) + c.head(L, k + 1)
    return (1 + expected_run(a, k)) / (seconds + (k + 1) * c.step)  # k drafts, the verification


def hierarchy_rate(c: CostModel, L: int, d: int, v: int, k: int, T: int, a_dv: float, a_vt: float,
                   top: CostModel | None = None, extra: float = 0.0) -> float:
    """The hierarchy: k drafts at d judged at v per round, the full model once T are tentative.
    `top`: the exact model's costs when d and v run in a cheaper format (their own lane, `c`): the full
    model then runs all L layers on the tentative tokens, not only [v, L)."""
    per_round = sum(a_dv**j for j in range(k))  # tentative tokens a round adds
    round_s = k * (d * c.layer(1) + c.head(d, 1)) + d * c.layer(1) + (v - d) * c.layer(k) + c.head(v, k)
    rounds = max(1, -(-T // max(per_round, 1e-9))) if per_round >= 1 else 1
    rounds = min(rounds, MAX_HIERARCHY_ROUNDS)
    t = int(round(rounds * per_round))
    tc, top_layers = (c, L - v) if top is None else (top, L)
    seconds = rounds * round_s + top_layers * tc.layer(t + 1) + tc.head(L, t + 1)
    seconds += (rounds * (k + 1) + 1) * tc.step + extra  # per round k drafts and the judge, then the full model
    return (1 + expected_run(a_vt, rounds * per_round)) / seconds


def lane_draft_rate(low: CostModel, top: CostModel, L: int, e: int, k: int, a: float, extra: float = 0.0) -> float:
    """k drafts at depth e in a cheaper format (e = L: the whole model in that format), then the exact
    model over k + 1 tokens; `extra`: seconds of the lane catching up first (Round.catch_up)."""
    seconds = k * (e * low.layer(1) + low.head(e, 1)) + L * top.layer(k + 1) + top.head(L, k + 1)
    return (1 + expected_run(a, k)) / (seconds + (k + 1) * top.step + extra)  # k drafts, the verification


def lookup_judged_rate(mid: CostModel, top: CostModel, L: int, e: int, k: int, a_lm: float, a_mt: float,
                       then: int = 0, top_layers: int | None = None, extra: float = 0.0) -> float:
    """k copied tokens judged by a level of depth e (one pass over k + 1 tokens): it keeps the agreeing
    prefix and writes its own token at the first mismatch; then, with `then`, it drafts that many more tokens
    itself (lookup copies for free, the judge checks the copy and goes on where the copy ends); then the
    exact model over what survived: all L layers when the judge runs in a cheaper format (its own lane,
    the default), [e, L) when it is an exact exit (`top_layers` = L - e). Pending after the judge: the kept
    run plus, unless all k were kept, the judge's token (and its drafts). `extra`: Round.catch_up."""
    judged = e * mid.layer(k + 1) + mid.head(e, k + 1)
    drafted = then * (e * mid.layer(1) + mid.head(e, 1))
    m = expected_run(a_lm, k) + (1 - a_lm**k) + then
    n = int(round(m)) + 1
    layers = L if top_layers is None else top_layers
    steps = (then + 2) * top.step  # the judge's pass, its drafts, the full model's
    return (1 + expected_run(a_mt, m)) / (judged + drafted + layers * top.layer(n) + top.head(L, n) + steps + extra)


# ---- the value --------------------------------------------------------------------------------
Acceptance = Callable[[Level, Level], "float | None"]  # (holder, judge) -> per-token acceptance; None: unknown


@dataclass(frozen=True)
class RoundKind:
    """What a round is, leaving out how many tokens: who proposes, who judges (bottom up), whether the last
    judge drafts on after judging. A plain step: the full model proposes, nobody judges."""

    proposer: Level
    judges: tuple[Level, ...] = ()
    drafts_on: bool = False

    @property
    def plain(self) -> bool:
        return self.proposer.kind == FULL and self.proposer.precision is None

    @property
    def key(self) -> str:
        """The kind as JSON records it ('plain', 'lookup', 'exit 4', 'exit 2 -> exit 4', 'full@q4',
        'lookup -> full@q4 (drafts on)'): the statistics' policy_choices keys."""
        if self.plain:
            return PLAIN_KEY
        body = " -> ".join(str(level) for level in (self.proposer, *self.judges))
        return body + (DRAFTS_ON if self.drafts_on else "")

    @property
    def words(self) -> str:
        return kind_words(self.key)

    def pairs(self, top: Level) -> list[tuple[Level, Level]]:
        """The level pairs this kind of round measures, bottom up: (holder, judge), the full model last."""
        chain = [self.proposer, *self.judges]
        return [] if self.plain else list(zip(chain, [*chain[1:], top]))


def kind_words(key: str) -> str:
    """A recorded kind key in words, bottom up with the full model at the top: 'exit 2 -> exit 4' ->
    'exit 2 → exit 4 → full model', 'lookup -> full@q4 (drafts on)' -> 'lookup → 4-bit full model → full model
    (drafts on)', 'plain' -> 'plain step (full model)'. The one reader of kind keys (old artifacts too)."""
    if key == PLAIN_KEY:
        return "plain step (full model)"
    parts = [_words(part).removeprefix("the ") for part in key_levels(key)]
    return " → ".join([*parts, "full model"]) + (DRAFTS_ON if key.endswith(DRAFTS_ON) else "")


def key_levels(key: str) -> tuple[str, ...]:
    """The levels below the full model a recorded kind key names, bottom up: 'lookup -> full@q4 (drafts on)'
    -> ('lookup', 'full@q4'); 'plain' -> ()."""
    if key == PLAIN_KEY:
        return ()
    return tuple(part.strip() for part in key.removesuffix(DRAFTS_ON).split("->"))


def event_kind(ev) -> str:
    """The kind key of a PolicyEvent's round; for a trace recorded before rounds travelled as values (no
    `plan`), read from its label ('exit 2 x1 -> exit 4, full at 4' -> 'exit 2 -> exit 4')."""
    if ev.plan is not None:
        return ev.plan.kind.key
    text, _, _ = ev.choice.partition(", full at ")
    text, plus, _ = text.partition(" +")
    if text == PLAIN_KEY:
        return PLAIN_KEY
    parts = [part.strip() for part in text.split("->")]
    first = "lookup" if parts[0].startswith("lookup") else parts[0].rpartition(" x")[0]
    return " -> ".join([first, *parts[1:]]) + (DRAFTS_ON if plus else "")


def _words(level: Level | str) -> str:
    """A level in words, from a Level or str(Level) ('exit 4@q4' -> 'exit 4 in 4-bit')."""
    text = str(level)
    return level_words(text.removeprefix("exit ") if text.startswith("exit ") else text)


@dataclass(frozen=True)
class Round:
    """One round's plan. `proposer` proposes `count` tokens (lookup: its copy; a level: drafts; the full
    model: a plain step, count 0); each of `judges` (bottom up) judges them; with `then`, the last judge
    drafts that many more itself; the full model `top` runs once `verify_at` tokens are pending."""

    proposer: Level
    top: Level
    count: int = 0
    judges: tuple[Level, ...] = ()
    verify_at: int = 1
    then: int = 0

    @classmethod
    def plain_step(cls, top: Level) -> Round:
        return cls(top, top)

    @property
    def plain(self) -> bool:
        return self.proposer == self.top

    @property
    def kind(self) -> RoundKind:
        return RoundKind(self.proposer, self.judges, self.then > 0)

    @property
    def label(self) -> str:
        """The policy's short label (traces, the estimates' keys): 'plain', 'lookup 4', 'exit 4 x2',
        'exit 2 x1 -> exit 4, full at 2', 'lookup 5 -> full@q4 +3'."""
        if self.plain:
            return PLAIN_KEY
        first = f"lookup {self.count}" if self.proposer.kind == LOOKUP else f"{self.proposer} x{self.count}"
        text = " -> ".join([first, *map(str, self.judges)]) + (f" +{self.then}" if self.then else "")
        # the hierarchy's label names its threshold even at 1 (the policy's labels always did)
        hierarchy = self.judges and self.proposer.kind != LOOKUP
        return text + (f", full at {self.verify_at}" if self.verify_at > 1 or hierarchy else "")

    @property
    def words(self) -> str:
        """The round in the page's words: 'lookup copies 5, the 4-bit full model judges them and drafts 3 more',
        'exit 2 drafts 2, exit 4 judges, the full model runs at 4 pending', 'plain step (full model)'."""
        if self.plain:
            return kind_words(PLAIN_KEY)
        copy = self.proposer.kind == LOOKUP
        parts = [f"lookup copies {self.count}" if copy else f"{_words(self.proposer)} drafts {self.count}"]
        for i, judge in enumerate(self.judges):
            last = i == len(self.judges) - 1
            more = f" and drafts {self.then} more" if last and self.then else ""
            parts.append(f"{_words(judge)} judges{' them' if copy else ''}{more}")
        if self.verify_at > 1:
            parts.append(f"the full model runs at {self.verify_at} pending")
        return ", ".join(parts)

    # ---- the expected rate ----------------------------------------------------------------
    def catch_up(self, costs: Mapping[str | None, CostModel], behind: Mapping[str, int] | None) -> float:
        """Seconds the round's first pass in a cheaper lane spends on positions that lane has not run yet:
        `behind` by lane (engine.lanes.Lanes.behind; 1 when it is up to date: the exact model's newest token,
        a row every formula counts). A lane left behind by plain steps and copies checked by the exact model
        runs them all in its next pass; its drafts then cost more than when it drafts round after round."""
        level = next((lv for lv in (self.proposer, *self.judges) if lv.kind != LOOKUP and lv.precision is not None),
                     None)
        c = None if level is None or not behind else costs.get(level.precision)
        extra = 0 if c is None else behind.get(level.precision, 1) - 1
        if extra <= 0:
            return 0.0
        rows = 1 if level == self.proposer else self.count + 1  # its first pass: a draft, or the judge's
        return level.layer * (c.layer(rows + extra) - c.layer(rows))

    def rate(self, costs: Mapping[str | None, CostModel], accept: Acceptance,
             behind: Mapping[str, int] | None = None) -> float | None:
        """Expected committed tokens per second: `costs` by lane (None: the exact format), `accept(holder,
        judge)` per pair, `behind`: the cheaper lanes' positions still to run (catch_up; None: up to date).
        None where no formula covers this shape (a copy judged by two levels, a copy judged by an exact exit
        that waits for more than one round) or a pair's acceptance is unknown."""
        c, L, p, judges = costs.get(None), self.top.layer, self.proposer, self.judges
        if c is None:
            return None
        if self.plain:
            return plain_rate(c, L)
        low = costs.get(p.precision)
        if low is None:
            return None
        chain = [p, *judges, self.top]
        rates = [accept(lo, hi) for lo, hi in zip(chain, chain[1:])]
        if any(a is None for a in rates):
            return None
        if not judges:
            if p.kind == LOOKUP:
                return lookup_rate(c, L, self.count, rates[0])
            if p.precision is None:
                return exit_rate(c, L, p.layer, self.count, rates[0])
            return lane_draft_rate(low, c, L, p.layer, self.count, rates[0], self.catch_up(costs, behind))
        if len(judges) != 1:
            return None
        j = judges[0]
        mid = costs.get(j.precision)
        if mid is None:
            return None
        if p.kind == LOOKUP:
            if j.precision is None and self.verify_at > 1:
                return None
            top_layers = None if j.precision is not None else L - j.layer
            return lookup_judged_rate(mid, c, L, j.layer, self.count, rates[0], rates[1], self.then, top_layers,
                                      self.catch_up(costs, behind))
        if p.precision == j.precision and not self.then:
            return hierarchy_rate(low, L, p.layer, j.layer, self.count, self.verify_at, rates[0], rates[1],
                                  None if p.precision is None else c, self.catch_up(costs, behind))
        return None

    def speedup(self, costs: Mapping[str | None, CostModel], accept: Acceptance) -> float | None:
        """The expected rate over a plain step's, on the same costs."""
        rate = self.rate(costs, accept)
        return None if rate is None or None not in costs else rate / plain_rate(costs[None], self.top.layer)

    # ---- as JSON (PolicyEvent in a trace) ---------------------------------------------------
    def to_dict(self) -> dict:
        level = lambda lv: [lv.kind, lv.layer, lv.name, lv.precision]  # noqa: E731
        return {"proposer": level(self.proposer), "top": level(self.top), "count": self.count,
                "judges": [level(j) for j in self.judges], "verify_at": self.verify_at, "then": self.then}

    @classmethod
    def from_dict(cls, data: dict) -> Round:
        return cls(Level(*data["proposer"]), Level(*data["top"]), data["count"],
                   tuple(Level(*j) for j in data["judges"]), data["verify_at"], data["then"])

    @classmethod
    def from_label(cls, label: str, levels: tuple[Level, ...]) -> Round:
        """The round a label names, its levels found in the run's list (the one reader of labels: traces
        recorded before rounds travelled as values). Raises ValueError for a label of no level in `levels`."""
        top = levels[-1]
        by_name = {str(lv): lv for lv in levels}
        text, _, at = label.partition(", full at ")
        verify_at = int(at) if at else 1
        text, plus, then = text.partition(" +")
        if text == PLAIN_KEY:
            return cls.plain_step(top)
        parts = [part.strip() for part in text.split("->")]
        first, judges = parts[0], parts[1:]
        if first.startswith("lookup"):
            proposer, count = by_name.get(LOOKUP), int(first.split()[1])
        else:
            name, _, count = first.rpartition(" x")
            proposer, count = by_name.get(name), int(count)
        found = [by_name.get(j) for j in judges]
        if proposer is None or None in found:
            raise ValueError(f"plan label {label!r} names a level not in {' -> '.join(map(str, levels))}")
        return cls(proposer, top, count, tuple(found), verify_at, int(then) if plus else 0)

