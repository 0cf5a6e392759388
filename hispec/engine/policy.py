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

from hispec.engine.costs import CostModel
from hispec.engine.levels import LOOKUP, Level

POLICIES = ("fixed", "auto")

# ---- the adaptive policy's constants, each with why ---------------------------------------------
# A level pair's prior is what its model ships, measured (engine.priors.acceptance_priors: acceptance in
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
THRESHOLDS = (1, 2, 4, 6)  # tentative tokens before the full model runs, for the hierarchy's candidates: the
#                            tuning sweep's best (1), the paper's 4 and their neighbours (README, Design space)
# A plan that does worse than plain decoding on this machine, now, is dropped for a while, whatever its
# estimate says (a busy machine moves costs faster than the cost model follows):
EVIDENCE_ROUNDS = 4  # rounds of a kind of plan before its measured speed counts against it
WORSE_THAN_PLAIN = 0.9  # dropped when its measured tokens/s over its recent rounds is below this share of plain's
DROP_ROUNDS = 24  # rounds it stays dropped; then it is tried again (costs and text may have changed)
RECENT_ROUNDS = 8  # the recent rounds a kind's measured speed is taken over
MIN_GAIN = 1.15  # a plan is chosen over a plain step only when expected to beat it by this much: an estimate is
#                 optimistic (the best of many noisy candidates, picked after the rounds that flattered it, and
#                 the engine's own work between passes left out). Measured, the tuning split, 3 prompts a set,
#                 128 tokens (scripts/plan_realized.py): exit plans realized 0.77-0.87 of their expected speed
#                 over plain, the hierarchy 0.82, in both formats; lookup 0.96 (4-bit) to 1.28 (float32).
#                 Without the margin, exits expected at 1.07-1.12x realized 0.82-0.95x plain in 4-bit.
LOOKUP_MIN_GAIN = 1.05  # the margin for a lookup copy checked by the full model alone: its estimate held (realized
#                        0.96-1.28 of it, above), and a copy costs no drafting, so the exits' margin turned away copies
#                        that would have paid (hispec/auto@q4 then chose plain steps in three rounds of four)
MAX_HIERARCHY_ROUNDS = 8  # rounds a hierarchy plan is expected to wait for its threshold at most: with a low
#                           draft->verify estimate the expected wait grows without bound; 8 rounds cap the estimate


def lookup_prior(priors: dict[tuple[str, str], float], n: int, judge: str = "target") -> float:
    """The prior of a lookup copy after a match of n tokens, judged by `judge`: measured if the model ships
    it; for another judge than the full model, the full model's measured figure (a full-depth level in a
    cheaper format agrees with the exact model nearly always); else a guess."""
    measured = priors.get((f"lookup:{n}", judge), priors.get((f"lookup:{n}", "target")))
    return measured if measured is not None else LOOKUP_UNMEASURED.get(n, LOOKUP_UNMEASURED[max(LOOKUP_UNMEASURED)])


# The default of the engine, the CLI, the page and the API alike: measured faster than every fixed
# setting on held-out prompts, and on the report split no tuning saw (README, Results: the headline).
DEFAULT_POLICY = "auto"


@dataclass(frozen=True)
class Plan:
    proposer: int  # index of the proposing level (the full level: a plain step)
    count: int  # tokens to propose (0 for a plain step)
    judges: tuple[int, ...]  # intermediate levels that judge this round's proposals, bottom up
    verify_at: int  # run the full model once this many tokens are pending (1: every round)
    choice: str = ""  # short label, e.g. "lookup 4", "exit 2 x1 -> exit 4", "plain"
    reason: str = ""
    estimates: dict = field(default_factory=dict)  # choice -> expected tokens per second (auto)
    tokens: tuple[int, ...] = ()  # the lookup level's proposal, when it proposes
    then: int = 0  # tokens the last judge drafts on after judging (lookup's copy, then a cheap lane goes on)


def expected_run(rate: float, k: float) -> float:
    """Expected accepted tokens among k proposals judged in order, each accepted with `rate`
    until the first rejection: rate + rate^2 + ... + rate^k (k may be fractional)."""
    if k <= 0:
        return 0.0
    if rate >= 1.0:
        return float(k)
    return rate * (1 - rate**k) / (1 - rate)


# ---- expected committed tokens per second of one kind of round -----------------------------
# The policy scores its candidates with these; explain.speed_model draws the same formulas
# as curves against acceptance (the app's "Why this speed").

def plain_rate(c: CostModel, L: int) -> float:
    """A plain step: one pass of [0, L) and the final head over one token."""
    return 1.0 / (L * c.layer(1) + c.head(L, 1))


def lookup_rate(c: CostModel, L: int, k: int, a: float) -> float:
    """k copied tokens verified by one pass of [0, L) over k + 1 tokens."""
    return (1 + expected_run(a, k)) / (L * c.layer(k + 1) + c.head(L, k + 1))


def exit_rate(c: CostModel, L: int, e: int, k: int, a: float) -> float:
    """Single-exit self-speculation: k drafts at exit e, then [e, L) over k + 1 tokens."""
    seconds = (k + 1) * (e * c.layer(1)) + k * c.head(e, 1) + (L - e) * c.layer(k + 1) + c.head(L, k + 1)
    return (1 + expected_run(a, k)) / seconds


def hierarchy_rate(c: CostModel, L: int, d: int, v: int, k: int, T: int, a_dv: float, a_vt: float,
                   top: CostModel | None = None) -> float:
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
    return (1 + expected_run(a_vt, rounds * per_round)) / seconds


# ---- rounds with a level in a cheaper format (its own lane: the exact model runs all L layers) ----
def lane_draft_rate(low: CostModel, top: CostModel, L: int, e: int, k: int, a: float) -> float:
    """k drafts at depth e in a cheaper format (e = L: the whole model in that format), then the exact
    model over k + 1 tokens."""
    seconds = k * (e * low.layer(1) + low.head(e, 1)) + L * top.layer(k + 1) + top.head(L, k + 1)
    return (1 + expected_run(a, k)) / seconds


def lookup_judged_rate(mid: CostModel, top: CostModel, L: int, e: int, k: int, a_lm: float, a_mt: float,
                       then: int = 0) -> float:
    """k copied tokens judged by a level of depth e in a cheaper format (one pass over k + 1 tokens): it
    keeps the agreeing prefix and writes its own token at the first mismatch; then, with `then`, it drafts
    that many more tokens itself (the three levels in one round: lookup copies for free, the cheap level
    checks the copy and goes on where the copy ends); then the exact model over what survived. Pending
    after the judge: the kept run plus, unless all k were kept, the judge's token (and its drafts)."""
    judged = e * mid.layer(k + 1) + mid.head(e, k + 1)
    drafted = then * (e * mid.layer(1) + mid.head(e, 1))
    m = expected_run(a_lm, k) + (1 - a_lm**k) + then
    n = int(round(m)) + 1
    return (1 + expected_run(a_mt, m)) / (judged + drafted + L * top.layer(n) + top.head(L, n))


class Policy(ABC):
    """The decode loop's seam: once per round it asks for a plan, and it reports every judged token.

    ``plan(room, pending, match)``: `room` tokens may still be generated, `pending` are proposed and
    not yet decided by the full model, `match` is the lookup level's proposal (tokens, n-gram length;
    empty without a lookup level or a match). ``observe(holder, judge, accepted)``: the level that
    proposed or last wrote a token, the level that judged it, and its verdict, in order up to the
    first rejection. A policy changes only what runs when, never what is committed: exactness holds
    for every plan."""

    name: str
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


class FixedPolicy(Policy):
    name = "fixed"

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
            return Plan(top, 0, (), 1, "plain")
        judges = tuple(range(proposer + 1, top))
        if self.levels[proposer].kind == LOOKUP:
            return Plan(proposer, len(match[0]), judges, verify_at, f"lookup {len(match[0])}", tokens=tuple(match[0]))
        return Plan(proposer, min(self.count, room), judges, verify_at, f"{self.levels[proposer]} x{self.count}")

    def observe(self, holder: str, judge: str, accepted: bool) -> None:
        pass


class Acceptance:
    """Per-token acceptance by (proposer, judge), measured in this generation, smoothed towards a
    prior (measured: engine.priors.acceptance_priors; else UNKNOWN_PRIOR) worth `weight` observations."""

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


def plan_kind(plan: Plan) -> tuple:
    """What a plan is, leaving out how many tokens: (proposer, judges, whether the last judge drafts on);
    a plain step is (top, (), False)."""
    return (plan.proposer, plan.judges, plan.then > 0)


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

    name = "auto"
    MAX_DRAFT = MAX_DRAFT
    THRESHOLDS = THRESHOLDS

    def __init__(self, levels: tuple[Level, ...], costs: CostModel | dict, priors: dict[tuple[str, str], float],
                 lookup_len: int):
        """`costs`: the exact model's cost model, or one per number format ({None: exact, 'q4': ...})."""
        lanes = costs if isinstance(costs, dict) else {None: costs}
        self.levels, self.costs, self.lane_costs, self.lookup_len = levels, lanes[None], lanes, lookup_len
        self.priors = priors
        self.acceptance = Acceptance(priors)
        self.L = levels[-1].layer
        self._sticky: Plan | None = None  # a hierarchy plan waiting for its threshold
        self.realized = Realized()
        self._notes: list[str] = []  # kinds dropped since the last plan, for its reason
        self._suspect: tuple | None = None  # a kind below the cost model's plain rate, judged once plain is measured
        self._probes = 0  # plain rounds still to run to measure plain decoding for that judgement

    def observe(self, holder: str, judge: str, accepted: bool) -> None:
        self.acceptance.add(holder, judge, accepted)

    def observe_round(self, plan: Plan, committed: int, seconds: float) -> None:
        """Measured speed per kind of plan; a kind measured below plain decoding's is dropped for a while.
        Plain's speed is measured in this generation: a kind that measures below the cost model's plain
        rate is a suspect, and plain steps run first (a probe) to measure plain decoding here, now. (The
        model's one-token cost is calibrated on a short context; after a long prompt every plan is slower
        than that figure, plain decoding too, and the plan would be dropped for what the context costs.)"""
        kind = plan_kind(plan)
        self.realized.add(kind, committed, seconds)
        plain_kind = plan_kind(Plan(len(self.levels) - 1, 0, (), 1))
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

    def _drop_if_below(self, kind: tuple, plan: Plan, plain: float) -> None:
        why = self.realized.judge(kind, plain)
        if why:
            named = " -> ".join(str(self.levels[i]) for i in (plan.proposer, *plan.judges))
            self._notes.append(f"{named} dropped for {DROP_ROUNDS} rounds ({why})")

    # ---- the candidates -----------------------------------------------------------------
    def _candidates(self, room: int, match: tuple[list[int], int]):
        """(tokens per second, label, plan) for each candidate."""
        c, L, top = self.costs, self.L, len(self.levels) - 1
        yield plain_rate(c, L), "plain", Plan(top, 0, (), 1, "plain")
        tokens, n = match
        if tokens and self.levels[0].kind == LOOKUP:
            a = self.acceptance.rate(f"lookup:{n}", "target", lookup_prior(self.priors, n))
            for k in range(1, len(tokens) + 1):
                yield lookup_rate(c, L, k, a), f"lookup {k}", Plan(0, k, (), 1, f"lookup {k}", tokens=tuple(tokens[:k]))
        middle = [(i, lv) for i, lv in enumerate(self.levels[:-1]) if lv.kind != LOOKUP]
        for i, lv in middle:  # one level drafts, the full model verifies
            a, low = self.acceptance.rate(lv.name, "target"), self.lane_costs[lv.precision]
            most = self.MAX_DRAFT if lv.precision is None else MAX_LANE_DRAFT
            for k in range(1, min(most, room) + 1):
                rate = (exit_rate(c, L, lv.layer, k, a) if lv.precision is None
                        else lane_draft_rate(low, c, L, lv.layer, k, a))
                yield rate, f"{lv} x{k}", Plan(i, k, (), 1, f"{lv} x{k}")
        yield from self._judged_lookup(room, match, middle)
        if len(middle) == 2 and middle[0][1].precision == middle[1][1].precision:
            # the hierarchy: draft at d, judge at v, full once T are tentative (d, v in one format)
            (i_d, d_lv), (i_v, v_lv) = middle
            a_dv = self.acceptance.rate(d_lv.name, v_lv.name)
            beta = self.acceptance.rate(v_lv.name, "target")
            low, top = self.lane_costs[d_lv.precision], (None if d_lv.precision is None else c)
            for k in range(1, min(self.MAX_DRAFT, room) + 1):
                for T in self.THRESHOLDS:
                    label = f"{d_lv} x{k} -> {v_lv}, full at {T}"
                    yield (hierarchy_rate(low, L, d_lv.layer, v_lv.layer, k, T, a_dv, beta, top), label,
                           Plan(i_d, k, (i_v,), T, label))

    def _judged_lookup(self, room: int, match: tuple[list[int], int], middle):
        """Lookup's copy judged by a level in a cheaper format, then the exact model: the cheap level keeps
        the copy's agreeing prefix and writes its own token at the first mismatch, so a wrong copy still
        yields a token the exact model is likely to accept. (Only for levels in a cheaper format: with exact
        exits below the full model, the measured defaults stay as they were tuned.)"""
        tokens, n = match
        if not tokens or self.levels[0].kind != LOOKUP:
            return
        for i, lv in middle:
            if lv.precision is None:
                continue
            a_lm = self.acceptance.rate(f"lookup:{n}", lv.name, lookup_prior(self.priors, n, lv.name))
            a_mt = self.acceptance.rate(lv.name, "target")
            low = self.lane_costs[lv.precision]
            for k in range(1, len(tokens) + 1):
                for then in range(0, max(0, min(MAX_LANE_DRAFT, room - k)) + 1):
                    label = f"lookup {k} -> {lv}" + (f" +{then}" if then else "")
                    rate = lookup_judged_rate(low, self.costs, self.L, lv.layer, k, a_lm, a_mt, then)
                    yield rate, label, Plan(0, k, (i,), 1, label, tokens=tuple(tokens[:k]), then=then)

    def _margin(self, plan: Plan) -> float:
        """How much better than a plain step a plan must be expected to be (1 for the plain step itself)."""
        if plan.proposer == len(self.levels) - 1:
            return 1.0
        if self.levels[plan.proposer].kind == "lookup" and not plan.judges:
            return LOOKUP_MIN_GAIN
        return MIN_GAIN

    def plan(self, room: int, pending: int, match: tuple[list[int], int]) -> Plan:
        if pending and self._sticky is not None:  # a hierarchy plan still piling up tentative tokens
            return self._sticky
        if self._probes > 0 and not pending:
            self._probes -= 1
            named = " -> ".join(str(self.levels[i]) for i in (self._suspect[1].proposer, *self._suspect[1].judges))
            return Plan(len(self.levels) - 1, 0, (), 1, "plain",
                        f"measuring plain decoding here before judging {named}, which ran below the cost model's "
                        "plain rate")
        scored = sorted(self._candidates(room, match), key=lambda x: -x[0])
        plain_rate = next(rate for rate, name, _ in scored if name == "plain")
        scored = [x for x in scored if x[1] == "plain" or not self.realized.is_dropped(plan_kind(x[2]))]
        # The best plan that clears its own margin over a plain step (not worth the risk otherwise): it may be
        # a copy ranked below an exit plan that did not clear the exits' larger margin.
        best_rate, label, plan = next(x for x in scored if x[0] >= self._margin(x[2]) * plain_rate)
        short = label == "plain" and scored[0][1] != "plain"
        shown = {}
        for rate, name, _ in scored:  # the best few, and the plain step for reference
            if len(shown) < 4 or name == "plain":
                shown[name] = round(rate, 2)
        reason = (f"the best, {scored[0][1]}, is expected at only {scored[0][0] / plain_rate:.2f}x a plain step "
                  f"(a plan must be expected to beat it by {self._margin(scored[0][2]):.2f}x)" if short else
                  "nothing is expected to beat a plain step" if label == "plain" else
                  f"expected {best_rate / plain_rate:.2f}x a plain step")
        if self._notes:
            reason, self._notes = "; ".join([reason, *self._notes]), []
        plan = Plan(plan.proposer, plan.count, plan.judges, plan.verify_at, label, reason, shown, plan.tokens,
                    plan.then)
        self._sticky = plan if plan.verify_at > 1 else None
        return plan


def make_policy(name: str, levels, config, costs: CostModel | None, priors: dict) -> Policy:
    if name == "fixed":
        return FixedPolicy(levels, config.lengths or (1, 1), config.lookup_len)
    if name == "auto":
        return AutoPolicy(levels, costs, priors, config.lookup_len)
    raise ValueError(f"unknown policy '{name}'")
