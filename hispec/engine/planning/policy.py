"""Who proposes, how much, who judges, and when the full model runs: one plan per round.

Two policies implement ``Policy``, the decode loop's seam (`plan` per round, `observe` per judged token):

- ``FixedPolicy``: the same round every time, from the configuration's ``lengths`` (k, t). The bottom
  level proposes (lookup: its whole match up to ``lookup_len``; an exit: k tokens; when lookup has no
  match the level above drafts instead), every intermediate level above the proposer judges, and the
  full model runs once t tokens are pending (at once when the list has no intermediate level).
- ``AutoPolicy``: per round, the plan with the most expected committed tokens per second, from
  acceptance measured in this generation (smoothed towards the exits' held-out agreement) and
  per-pass costs measured on this machine (``costs.CostModel``). Plain full-model steps are
  always a candidate, so speculation is used only where it is expected to pay.

Every plan says why (``Plan.reason``, ``Plan.estimates``); the decoder turns it into a
``PolicyEvent`` so that the CLI, stats and app can show each decision.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from hispec.engine.planning.costs import CostModel
from hispec.engine.levels import LOOKUP, Level
from hispec.engine.planning.round import Round, RoundKind, plain_rate

POLICIES = ("fixed", "auto")
ADAPTS = {"fixed": False, "auto": True}  # whether a policy plans each round from what it measures


def adapts(name: str) -> bool:
    """Whether the policy of this name adapts (plans from measured acceptance and costs: it then needs a
    calibrated cost model, and its plans are events); raises ValueError for an unknown name."""
    if name not in ADAPTS:
        raise ValueError(f"unknown policy '{name}'; choose from {', '.join(POLICIES)}")
    return ADAPTS[name]

# ---- the adaptive policy's constants, each with why ---------------------------------------------
# A level pair's prior is what its model ships, measured (engine.planning.priors.acceptance_priors: acceptance in
# generations on the tuning split, else the heads' own agreement); these constants are what the policy
# falls back on where nothing was measured, and how it weighs what it measures.
UNKNOWN_PRIOR = 0.3  # a pair with nothing measured (raw exits, no manifest): between raw exits' 4-10% agreement
#                      and trained heads' 39-46%, so the pair is tried in a round or two, and the evidence decides
LOOKUP_UNMEASURED = {1: 0.25, 2: 0.5, 3: 0.5}  # a lookup copy with no measured prior, by n-gram length: a longer
#                      match is likelier to continue; guesses, used only where a model ships no lookup priors
PRIOR_WEIGHT = 4.0  # a prior counts as this many judged tokens: two or three one-token rounds outweigh it, so a
#                     text unlike the held-out prompts moves the estimate at once, while one unlucky token does not
MAX_DRAFT = 6  # most drafts per round a candidate considers: at the ~40% per-token acceptance of the shipped
#                heads a 7th draft adds 0.4^7 < 0.002 expected tokens while it costs a pass of [0, e) and a head
MAX_LANE_DRAFT = 12  # ... for a level in a cheaper format of the same weights: at the ~99% per-token agreement
#                     measured for the 4-bit copy (policy_priors), the 12th draft still adds ~0.9 expected tokens
THEN = (0, 1, 2, 3, 4, 6, 8, 10, 12)  # how many more a judge of lookup's copy may draft on: every count up to 4, then
#                                    a coarser step. Searched in two stages (AutoPolicy._judged_lookup): every copy
#                                    length without drafting on, then these counts after the best length and the
#                                    whole copy. Every (length, count) pair made about 90 candidates per copy, and a
#                                    plan of the default list took 1.1 ms a round with a match, an eighth of a plain
#                                    step on an AVX-512 host; the two stages ask about 26.
THRESHOLDS = (1, 2, 4, 6)  # tentative tokens before the full model runs, for the hierarchy's candidates: the
#                            tuning sweep's best (1), the paper's 4 and their neighbours (docs/benchmarks.md, Results)
# A plan that does worse than plain decoding on this machine, now, is dropped for a while, whatever its
# estimate says (a busy machine moves costs faster than the cost model follows):
EVIDENCE_ROUNDS = 4  # rounds of a kind of plan before its measured speed counts against it
WORSE_THAN_PLAIN = 0.9  # dropped when its measured tokens/s over its recent rounds is below this share of plain's
DROP_ROUNDS = 24  # rounds it stays dropped; then it is tried again (costs and text may have changed)
RECENT_ROUNDS = 8  # the recent rounds a kind's measured speed is taken over
MIN_GAIN = 1.15  # a plan is chosen over a plain step only when expected to beat it by this much: an estimate is
#                 optimistic (the best of many noisy candidates, picked after the rounds that flattered it; the
#                 engine's own work between passes, left out when this was measured, is now counted: CostModel.step,
#                 and the margin was kept, not tuned again). Measured, the tuning split, 3 prompts a set,
#                 128 tokens (scripts/plan_realized.py, removed in a52c47b: every plan's expected gain is now in
#                 its PolicyEvent, beside what it realized in explain.why.plan_table): exit plans realized 0.77-0.87 of their expected speed
#                 over plain, the hierarchy 0.82, in both formats; lookup 0.96 (4-bit) to 1.28 (float32).
#                 Without the margin, exits expected at 1.07-1.12x realized 0.82-0.95x plain in 4-bit.
HELD_NOTE = 0.9  # a plan's reason says when its kind's estimates were scaled down below this
HELD_PRIOR = 4.0  # a kind's held share starts at 1 (its estimates believed) worth this many expected tokens: two or
#                  three rounds of a kind that runs slower than estimated scale its estimates down (class Held)
SHARED_ROWS = 1  # rows each other visitor is taken to put in a shared pass of the full model: a plain step's one (the
#                 plans this policy makes beside others: their drafts, when they pay, add more; a guess, not measured)
# Beside other visitors (model.shared's board), the policy plans for the whole shared pass's goodput: a pass of
# the full model that carries their rows costs a plan only what its own rows add (CostModel.beside), while a draft
# of a cheaper lane is a call of its own, which every visitor waits for; with others waiting a draft row displaces
# a row that is certain to count. Nothing measured beside them (realized speed, held shares, costs) is learned.
LOOKUP_MIN_GAIN = 1.05  # the margin for a lookup copy checked by the full model alone: its estimate held (realized
#                        0.96-1.28 of it, above), and a copy costs no drafting, so the exits' margin turned away copies
#                        that would have paid (hispec/auto@q4 then chose plain steps in three rounds of four)


def lookup_prior(priors: dict[tuple[str, str], float], n: int, judge: str = "target") -> float:
    """The prior of a lookup copy after a match of n tokens, judged by `judge`: measured if the model ships
    it; for another judge than the full model, the full model's measured figure (a full-depth level in a
    cheaper format agrees with the exact model nearly always); else a guess."""
    measured = priors.get((f"lookup:{n}", judge), priors.get((f"lookup:{n}", "target")))
    return measured if measured is not None else LOOKUP_UNMEASURED.get(n, LOOKUP_UNMEASURED[max(LOOKUP_UNMEASURED)])


# The default of the engine, the CLI, the page and the API alike: measured faster than every fixed
# setting on held-out prompts (docs/benchmarks.md, Results; which runs touched which split: The prompt splits).
DEFAULT_POLICY = "auto"


@dataclass(frozen=True)
class Plan:
    """A round (engine.planning.round.Round) as the policy chose it, with why: its reason, the best few candidates'
    expected committed tokens per second (by label, the plain step's among them), the gain over a plain step
    it was expected to bring when chosen, and lookup's copied tokens when lookup proposes."""

    round: Round
    reason: str = ""
    estimates: dict = field(default_factory=dict)  # label -> expected tokens per second (auto)
    tokens: tuple[int, ...] = ()  # the lookup level's proposal, when it proposes
    expected_gain: float | None = None  # expected tokens/s over a plain step's at choice time (auto)
    rate: float | None = None  # its expected committed tokens per second as chosen (auto; the held share applied)
    beside: int = 0  # other visitors whose rows shared the exact model's passes when it was planned (auto)

    @property
    def choice(self) -> str:
        """The round's label (traces, the estimates' keys)."""
        return self.round.label


class Policy(ABC):
    """The decode loop's seam: once per round it asks for a plan, and it reports every judged token.

    ``plan(room, pending, match)``: `room` tokens may still be generated, `pending` are proposed and
    not yet decided by the full model, `match` is the lookup level's proposal (tokens, n-gram length;
    empty without a lookup level or a match). ``observe(holder, judge, accepted)``: the level that
    proposed or last wrote a token, the level that judged it, and its verdict, in order up to the
    first rejection. A policy changes only what runs when, never what is committed: exactness holds
    for every plan."""

    name: str
    adapts: bool  # plans from what it measures (see `adapts`)
    lookup_len: int

    def lookup_limit(self, room: int) -> int:
        """At most this many tokens from the lookup level this round."""
        return min(self.lookup_len, room)

    @abstractmethod
    def plan(self, room: int, pending: int, match: tuple[list[int], int]) -> Plan:
        """This round's plan."""

    @abstractmethod
    def observe(self, holder: str, judge: str, accepted: bool) -> None:
        """One judged token (see the class docstring)."""

    def observe_round(self, plan: Plan, committed: int, seconds: float) -> None:
        """A round of this plan ended: it committed this many tokens in this many seconds of compute."""

    def before_plan(self, behind: dict[str, int], others: int = 0) -> None:
        """Before a plan: the positions each cheaper lane would run first (engine.lanes.Lanes.behind), and how
        many other visitors' generations share this one's passes now (model.shared's board)."""


class FixedPolicy(Policy):
    name, adapts = "fixed", False

    def __init__(self, levels: tuple[Level, ...], lengths: tuple[int, int], lookup_len: int):
        (self.count, self.verify_at), self.levels, self.lookup_len = lengths, levels, lookup_len
        middle = [level for level in levels[:-1] if level.kind != LOOKUP]  # levels that run layers, below the top
        self._has_intermediate = len(middle) >= 2 or (levels[0].kind == LOOKUP and len(middle) >= 1)

    def plan(self, room: int, pending: int, match: tuple[list[int], int]) -> Plan:
        top = len(self.levels) - 1
        proposer = 0
        if self.levels[0].kind == LOOKUP and not match[0]:
            proposer = 1  # no match: the level above drafts instead (the full model: a plain step)
        verify_at = self.verify_at if self._has_intermediate else 1
        if proposer == top:
            return Plan(Round.plain_step(self.levels[top]))
        judges = tuple(self.levels[proposer + 1 : top])
        lookup = self.levels[proposer].kind == LOOKUP
        count = len(match[0]) if lookup else min(self.count, room)
        return Plan(Round(self.levels[proposer], self.levels[top], count, judges, verify_at),
                    tokens=tuple(match[0]) if lookup else ())

    def observe(self, holder: str, judge: str, accepted: bool) -> None:
        pass


class Acceptance:
    """Per-token acceptance by (proposer, judge), measured in this generation, smoothed towards a
    prior (measured: engine.planning.priors.acceptance_priors; else UNKNOWN_PRIOR) worth `weight` observations."""

    def __init__(self, priors: dict[tuple[str, str], float], weight: float = PRIOR_WEIGHT):
        self.priors, self.weight = priors, weight
        self.counts: dict[tuple[str, str], list[int]] = {}

    def add(self, holder: str, judge: str, accepted: bool) -> None:
        pair = self.counts.setdefault((holder, judge), [0, 0])
        pair[0] += accepted
        pair[1] += 1

    def rate(self, holder: str, judge: str, default: float = UNKNOWN_PRIOR) -> float:
        ok, n = self.counts.get((holder, judge), (0, 0))
        prior = self.priors.get((holder, judge), default)
        return (ok + prior * self.weight) / (n + self.weight)


class Held:
    """How far each kind of plan (who proposes, who judges) held its estimates in this generation: the tokens
    its rounds committed over the tokens its estimated rate promised in the time they took, smoothed towards 1
    (HELD_PRIOR). The policy scales a kind's estimates by it. What the formulas leave out (a pass slower in a
    generation than when calibrated, caches cold after another lane ran, work between passes beyond the
    measured step) is then learned for the kind that suffers it, in the generation that suffers it: exit plans
    realized 0.77-0.87 of their expected speed while lookup's held theirs (MIN_GAIN's measurements), and the
    4-bit model's drafts, chosen as expected to beat plain steps by the margin, ran below them (full@a8/auto at
    0.93x plain decoding on the tuning split, assets/bench/f32_default_tune_avx512.json)."""

    def __init__(self, prior: float = HELD_PRIOR):
        self.prior = prior
        self.tokens: dict[RoundKind, list[float]] = {}  # kind -> [committed, promised]

    def add(self, kind: RoundKind, committed: int, seconds: float, rate: float | None) -> None:
        if rate and seconds > 0:
            row = self.tokens.setdefault(kind, [0.0, 0.0])
            row[0] += committed
            row[1] += rate * seconds

    def share(self, kind: RoundKind) -> float:
        committed, promised = self.tokens.get(kind, (0.0, 0.0))
        return (committed + self.prior) / (promised + self.prior)


class Realized:
    """Measured tokens per second of each kind of plan (who proposes, who judges) in this generation, over
    its recent rounds, and which kinds are dropped for doing worse than plain decoding."""

    def __init__(self):
        self.rounds: dict[tuple, list[tuple[int, float]]] = {}
        self.dropped: dict[tuple, int] = {}  # kind -> the round from which it is tried again
        self.round = 0

    def add(self, kind: tuple, committed: int, seconds: float) -> None:
        self.round += 1
        recent = self.rounds.setdefault(kind, [])
        recent.append((committed, seconds))
        del recent[:-RECENT_ROUNDS]

    def rate(self, kind: tuple) -> float | None:
        """Tokens per second over the kind's recent rounds (None before EVIDENCE_ROUNDS of them)."""
        recent = self.rounds.get(kind, [])
        seconds = sum(s for _, s in recent)
        return sum(n for n, _ in recent) / seconds if len(recent) >= EVIDENCE_ROUNDS and seconds > 0 else None

    def below(self, kind: tuple, plain: float) -> bool:
        """`kind` measured below WORSE_THAN_PLAIN of `plain` tokens/s over its recent rounds."""
        rate = self.rate(kind)
        return rate is not None and rate < WORSE_THAN_PLAIN * plain

    def judge(self, kind: tuple, plain: float) -> str | None:
        """Drop `kind` if it measured below WORSE_THAN_PLAIN of `plain` tokens/s; why, when dropped."""
        if not self.below(kind, plain):
            return None
        rate = self.rate(kind)
        self.dropped[kind] = self.round + DROP_ROUNDS
        self.rounds.pop(kind, None)  # when it is tried again, new evidence decides
        return f"{rate / plain:.2f}x plain over its last rounds"

    def is_dropped(self, kind: tuple) -> bool:
        return self.dropped.get(kind, 0) > self.round


def plan_kind(plan: Plan) -> RoundKind:
    """What a plan is, leaving out how many tokens (engine.planning.round.RoundKind)."""
    return plan.round.kind


class AutoPolicy(Policy):
    """Maximise expected committed tokens per second, round by round.

    Candidates: a plain step; the lookup level's match (first k tokens, any k) verified by the
    full model; drafting k tokens at each exit, verified by the full model; and, with two exits,
    drafting at the lower one, judging at the upper one, and calling the full model once T
    tentative tokens piled up (the hierarchy). With a level in a cheaper format: drafting there,
    the lookup match judged by it, and that judged match followed by its own drafts in the same
    round (``Plan.then``). A candidate's value is (1 + expected accepted tokens) / expected seconds,
    where acceptance is per token and in order (``expected_run``).
    """

    name, adapts = "auto", True
    MAX_DRAFT = MAX_DRAFT
    THRESHOLDS = THRESHOLDS

    def __init__(self, levels: tuple[Level, ...], costs: CostModel | dict, priors: dict[tuple[str, str], float],
                 lookup_len: int):
        """`costs`: the exact model's cost model, or one per number format ({None: exact, 'q4': ...})."""
        lanes = costs if isinstance(costs, dict) else {None: costs}
        self.levels, self.costs, self.lane_costs, self.lookup_len = levels, lanes[None], lanes, lookup_len
        self.priors = priors
        self.acceptance = Acceptance(priors)
        self.L, self.top = levels[-1].layer, levels[-1]
        self._sticky: Plan | None = None  # a hierarchy plan waiting for its threshold
        self.realized = Realized()
        self.held = Held()
        self._notes: list[str] = []  # kinds dropped since the last plan, for its reason
        self._suspect: tuple[RoundKind, Plan] | None = None  # a kind below the cost model's plain rate, judged once plain is measured
        self._probes = 0  # plain rounds still to run to measure plain decoding for that judgement
        self._behind: dict[str, int] = {}  # the cheaper lanes' positions still to run (before_plan)
        self._others = 0  # other visitors sharing the passes now (before_plan)
        self._quiet: tuple[tuple, Plan] | None = None  # a plain step chosen beside others, and for what (plan)

    def observe(self, holder: str, judge: str, accepted: bool) -> None:
        self.acceptance.add(holder, judge, accepted)

    def before_plan(self, behind: dict[str, int], others: int = 0) -> None:
        self._behind, self._others = dict(behind), others

    def observe_round(self, plan: Plan, committed: int, seconds: float) -> None:
        """Measured speed per kind of plan; a kind measured below plain decoding's is dropped for a while.
        Plain's speed is measured in this generation: a kind that measures below the cost model's plain
        rate is a suspect, and plain steps run first (a probe) to measure plain decoding here, now. (The
        model's one-token cost is calibrated on a short context; after a long prompt every plan is slower
        than that figure, plain decoding too, and the plan would be dropped for what the context costs.)"""
        if plan.beside:  # its time held other visitors' rows: no measure of what the plan does alone
            return
        kind = plan_kind(plan)
        self.realized.add(kind, committed, seconds)
        self.held.add(kind, committed, seconds, plan.rate)
        plain_kind = Round.plain_step(self.top).kind
        plain = self.realized.rate(plain_kind)
        if kind != plain_kind:
            if plain is None:
                if self._suspect is None and self.realized.below(kind, plain_rate(self.costs, self.L)):
                    self._suspect = (kind, plan)
                    self._probes = EVIDENCE_ROUNDS - len(self.realized.rounds.get(plain_kind, []))
                return
            self._drop_if_below(kind, plan, plain)
        elif self._suspect is not None and plain is not None:  # the probe has measured plain decoding
            (suspect, suspect_plan), self._suspect, self._probes = self._suspect, None, 0
            self._drop_if_below(suspect, suspect_plan, plain)

    def _drop_if_below(self, kind: RoundKind, plan: Plan, plain: float) -> None:
        why = self.realized.judge(kind, plain)
        if why:
            named = " -> ".join(str(level) for level in (kind.proposer, *kind.judges))
            self._notes.append(f"{named} dropped for {DROP_ROUNDS} rounds ({why})")

    # ---- the candidates -----------------------------------------------------------------
    def _accept(self, n: int):
        """Acceptance per (holder, judge) as this policy estimates it now; a lookup copy by its n-gram length."""
        known: dict[tuple[Level, Level], float] = {}  # one plan asks each pair for every candidate: once is enough

        def accept(low: Level, high: Level) -> float:
            if (low, high) not in known:
                known[low, high] = (self.acceptance.rate(f"lookup:{n}", high.name, lookup_prior(self.priors, n, high.name))
                                    if low.kind == LOOKUP else self.acceptance.rate(low.name, high.name))
            return known[low, high]
        return accept

    def _candidates(self, room: int, match: tuple[list[int], int]):
        """(tokens per second, round) for each candidate: the one formula of engine.planning.round, Round.rate."""
        top, tokens, n = self.top, *match
        accept = self._accept(n)
        lanes = {fmt: None if c is None else c.frozen() for fmt, c in self.lane_costs.items()}
        if self._others:  # the full model's passes carry others' rows: a plan pays what its rows add (SHARED_ROWS)
            lanes[None] = self.costs.beside(self._others * SHARED_ROWS)
        rounds = [Round.plain_step(top)]
        lookup = self.levels[0] if tokens and self.levels[0].kind == LOOKUP else None
        if lookup is not None:
            rounds += [Round(lookup, top, k) for k in range(1, len(tokens) + 1)]
        middle = [lv for lv in self.levels[:-1] if lv.kind != LOOKUP]
        for lv in middle:  # one level drafts, the full model verifies
            most = self.MAX_DRAFT if lv.precision is None else MAX_LANE_DRAFT
            rounds += [Round(lv, top, k) for k in range(1, min(most, room) + 1)]
        if len(middle) == 2 and middle[0].precision == middle[1].precision:
            # the hierarchy: draft at d, judge at v, full once T are tentative (d, v in one format)
            d, v = middle
            rounds += [Round(d, top, k, (v,), T) for k in range(1, min(self.MAX_DRAFT, room) + 1)
                       for T in self.THRESHOLDS]
        shares: dict[RoundKind, float] = {}

        def scored(r: Round) -> tuple[float | None, Round]:
            rate, kind = r.rate(lanes, accept, self._behind), r.kind
            if kind not in shares:
                shares[kind] = self.held.share(kind)
            return (None if rate is None else rate * shares[kind]), r

        yield from map(scored, rounds)
        if lookup is not None:
            yield from self._judged_lookup(lookup, room, len(tokens), middle, scored)

    def _judged_lookup(self, lookup: Level, room: int, matched: int, middle, scored) -> list:
        """Lookup's copy judged by a level in a cheaper format, then the exact model: the cheap level keeps
        the copy's agreeing prefix and writes its own token at the first mismatch, so a wrong copy still
        yields a token the exact model is likely to accept; it may then draft on (`then`) in the same round.
        (Only for levels in a cheaper format: with exact exits below the full model, the measured defaults
        stay as they were tuned.) Searched in two stages (THEN says why): every copy length judged alone,
        then drafting on after the best of those lengths and after the whole copy; `scored(round)` is
        (its value, the round)."""
        out, whole = [], min(matched, room)
        for lv in middle:
            if lv.precision is None:
                continue
            alone = [scored(Round(lookup, self.top, k, (lv,), 1)) for k in range(1, whole + 1)]
            valued = [x for x in alone if x[0] is not None]
            best = max(valued, key=lambda x: x[0])[1].count if valued else whole
            out += alone
            out += [scored(Round(lookup, self.top, k, (lv,), 1, then)) for k in sorted({best, whole})
                    for then in THEN[1:] if then <= min(MAX_LANE_DRAFT, room - k)]
        return out

    def _margin(self, r: Round) -> float:
        """How much better than a plain step a round must be expected to be (1 for the plain step itself)."""
        if r.plain:
            return 1.0
        if r.proposer.kind == LOOKUP and not r.judges:
            return LOOKUP_MIN_GAIN
        return MIN_GAIN

    def plan(self, room: int, pending: int, match: tuple[list[int], int]) -> Plan:
        if pending and self._sticky is not None:  # a hierarchy plan still piling up tentative tokens
            return self._sticky
        if self._probes > 0 and not pending:
            self._probes -= 1
            kind = self._suspect[0]
            named = " -> ".join(str(level) for level in (kind.proposer, *kind.judges))
            return Plan(Round.plain_step(self.top),
                        f"measuring plain decoding here before judging {named}, which ran below the cost model's "
                        "plain rate")
        # Beside other visitors, a plain step is chosen again at once while as many visitors share and lookup's
        # match has the same shape (its length and the n-gram it matched): nothing is learned beside them
        # (observe_round), plain rounds judge no draft, the cheaper lanes only fall further behind and the room
        # only shrinks, so the search would rank the same (a search cost about a tenth of a shared step, in Python
        # the visitors' threads take turns to run)
        shape = (self._others, len(match[0]), match[1])
        if self._quiet is not None and self._quiet[0] == shape:
            return self._quiet[1]
        scored = sorted(self._candidates(room, match), key=lambda x: -x[0])
        plain_rate = next(rate for rate, r in scored if r.plain)
        scored = [x for x in scored if x[1].plain or not self.realized.is_dropped(x[1].kind)]
        # The best plan that clears its own margin over a plain step (not worth the risk otherwise): it may be
        # a copy ranked below an exit plan that did not clear the exits' larger margin.
        best_rate, chosen = next(x for x in scored if x[0] >= self._margin(x[1]) * plain_rate)
        short = chosen.plain and not scored[0][1].plain
        shown = {}
        for rate, r in scored:  # the best few, and the plain step for reference
            if len(shown) < 4 or r.plain:
                shown[r.label] = round(rate, 2)
        reason = (f"the best, {scored[0][1].label}, is expected at only {scored[0][0] / plain_rate:.2f}x a plain step "
                  f"(a plan must be expected to beat it by {self._margin(scored[0][1]):.2f}x)" if short else
                  "nothing is expected to beat a plain step" if chosen.plain else
                  f"expected {best_rate / plain_rate:.2f}x a plain step")
        if self._notes:
            reason, self._notes = "; ".join([reason, *self._notes]), []
        named = chosen if not chosen.plain else next((r for _, r in scored if not r.plain), None)
        held = 1.0 if named is None else self.held.share(named.kind)
        if held < HELD_NOTE:  # the plan chosen, or the best one a plain step was chosen over, was scaled down
            reason += (f" ({named.kind.key}'s estimates scaled by {held:.2f}: the share of them its rounds held so "
                       "far)")
        if self._others:
            reason += (f"; priced for the whole shared pass: {self._others} other visitor"
                       f"{'s' if self._others > 1 else ''}' rows ride in the full model's passes, so a row there costs "
                       "only what it adds, while a draft of a cheaper lane runs a call of its own")
        tokens = tuple(match[0][: chosen.count]) if chosen.proposer.kind == LOOKUP else ()
        plan = Plan(chosen, reason, shown, tokens, best_rate / plain_rate, best_rate, self._others)
        self._sticky = plan if chosen.verify_at > 1 else None
        self._quiet = (shape, plan) if self._others and chosen.plain else None
        return plan


def make_policy(name: str, levels, config, costs: CostModel | None, priors: dict) -> Policy:
    if adapts(name):
        return AutoPolicy(levels, costs, priors, config.lookup_len)
    return FixedPolicy(levels, config.lengths or (1, 1), config.lookup_len)
