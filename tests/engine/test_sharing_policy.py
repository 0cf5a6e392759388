"""A policy that knows it shares: beside other visitors on the pass board (model.shared), a pass of the full model
carries their rows too, so a plan pays only what its own rows add (CostModel.beside), while a draft of a cheaper
lane is a call of its own; the plan says so, and nothing measured beside them is learned."""

import threading

import pytest
from helpers import ee_of, tiny_model

from hispec.engine.config import DecodeConfig
from hispec.engine.decoding import Decoder
from hispec.engine.levels import build_levels
from hispec.engine.planning.costs import BESIDE_FLOOR, CostLearner, CostModel
from hispec.engine.planning.policy import AutoPolicy, Plan, Policy
from hispec.engine.planning.round import Round
from hispec.model.shared import BOARD

L = 8
SIZES = (1, 2, 4, 8, 16)


def exact() -> CostModel:
    """A pass reads the weights once (1 ms a layer) and each row adds a tenth of that: wide passes are cheap."""
    return CostModel.given({n: 1e-3 * (1 + 0.1 * (n - 1)) for n in SIZES}, {(L, n): 5e-4 for n in SIZES})


def cheap() -> CostModel:
    return CostModel.given({n: 1e-3 / 3 * (1 + 0.1 * (n - 1)) for n in SIZES}, {(L, n): 5e-4 / 3 for n in SIZES})


def test_a_pass_beside_others_costs_what_its_rows_add():
    solo = exact()
    shared = solo.beside(3)
    assert shared.layer(1) == pytest.approx(solo.layer(4) - solo.layer(3))
    assert shared.layer(4) == pytest.approx(solo.layer(7) - solo.layer(3))
    assert shared.head(L, 2) == pytest.approx(BESIDE_FLOOR * solo.head(L, 2))  # a flat head: the floor, never free
    assert shared.step == solo.step and solo.layer(1) == pytest.approx(1e-3)  # the original is untouched
    assert solo.beside(0).layer(2) == pytest.approx(solo.layer(2))


def test_beside_other_visitors_the_policy_leaves_the_cheap_lanes_drafts_for_shared_passes():
    """Alone, the 4-bit copy's drafts (a third of the cost, 90% agreement) beat a plain step; beside three other
    visitors a plain step of the full model costs only its row in their pass, and the drafts' own calls do not
    pay: the plan is a plain step (or a copy checked in the shared pass), and its reason says why. The check
    can fail: alone, the same policy drafts."""
    levels = build_levels(("lookup", "full@a8"), L)
    priors = {("verify", "target"): 0.9, ("lookup:2", "verify"): 0.5, ("lookup:2", "target"): 0.5}
    plans = {}
    for others in (0, 3):
        policy = AutoPolicy(levels, {None: exact(), "a8": cheap()}, priors, lookup_len=8)
        policy.before_plan({"a8": 1}, others)
        plans[others] = policy.plan(room=50, pending=0, match=([11, 12, 13], 2))
    alone, shared = plans[0].round, plans[3].round
    assert alone.proposer.precision == "a8" or any(j.precision == "a8" for j in alone.judges), alone
    assert not shared.judges and shared.proposer.precision is None, shared  # a plain step or a checked copy
    assert "3 other visitors' rows" in plans[3].reason and plans[3].beside == 3
    assert "shared pass" not in plans[0].reason and plans[0].beside == 0


def test_nothing_measured_beside_others_is_learned():
    levels = build_levels(("full@a8",), L)
    policy = AutoPolicy(levels, {None: exact(), "a8": cheap()}, {("verify", "target"): 0.9}, lookup_len=8)
    shared = Plan(Round(levels[0], levels[-1], 4), rate=500.0, beside=2)
    for _ in range(6):
        policy.observe_round(shared, committed=1, seconds=0.05)  # slow: its time held the others' rows
    assert policy.held.tokens == {} and policy.realized.rounds == {}
    policy.observe_round(Plan(Round(levels[0], levels[-1], 4), rate=500.0), committed=1, seconds=0.05)
    assert policy.held.tokens and policy.realized.rounds  # the check can fail: alone, it is learned

    others = [2]
    learner = CostLearner({None: None}, build_levels((), L), adaptive=False, others=lambda: others[0])
    learner.lanes[None] = costs = exact()

    class Pass:  # engine.stack.StagePass, as much of it as the learner reads
        precision, start, end, serials, seconds = None, 0, L, (1,), 0.5

    learner.on_pass(Pass())
    learner.on_round(1.0)
    assert costs.layer(1) == pytest.approx(1e-3) and costs.step == 0.0
    others[0] = 0
    learner.on_pass(Pass())
    learner.on_round(1.0)
    assert costs.layer(1) > 1e-3 and costs.step > 0.0


class _Hears(Policy):
    """Plain steps only; it records how many visitors it heard beside it before each plan."""

    name, adapts, lookup_len = "fixed", False, 0

    def __init__(self, top):
        self.top, self.others = top, []

    def before_plan(self, behind, others=0):
        self.others.append(others)

    def plan(self, room, pending, match):
        return Plan(Round.plain_step(self.top))

    def observe(self, holder, judge, accepted):
        pass


def test_the_decoder_tells_the_policy_who_shares_its_passes():
    """A generation of a model on the native route (a tiny 4-bit copy), run as a member of the pass board while
    another member holds it, hears one other visitor before every plan; outside the board, none; and a model
    whose passes run alone (float weights, no native route) none either."""
    q4 = pytest.importorskip("hispec.model.formats.q4")
    if q4.q4_kernel.unavailable_reason():
        pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}")
    from hispec.model.early_exit import EarlyExitModel

    model = tiny_model("llama", layers=L, seed=2)
    ee = EarlyExitModel(q4.q4_copy(model))

    def generate(ee=ee):
        decoder = Decoder(ee, [5, 9, 14, 5, 9], DecodeConfig(levels=(), policy="fixed", max_new_tokens=6))
        decoder.policy = decoder.judge.policy = hears = _Hears(decoder.levels[-1])
        list(decoder.events())
        return hears.others

    held, leave = threading.Event(), threading.Event()

    def other_visitor():
        with BOARD.member():
            held.set()
            leave.wait(30)

    thread = threading.Thread(target=other_visitor, daemon=True)
    thread.start()
    assert held.wait(30)
    try:
        with BOARD.member():
            beside, alone = generate(), generate(ee_of(model))
    finally:
        leave.set()
        thread.join(30)
    assert beside and set(beside) == {1}, beside
    assert alone and set(alone) == {0}, alone
    assert set(generate()) == {0}


def test_a_plain_step_beside_others_is_chosen_again_without_a_search_until_something_changes(monkeypatch):
    """Beside other visitors, once the policy chose a plain step, the next rounds take it without searching the
    candidates (the search ran in Python between shared calls; nothing it reads changes beside others) until the
    count of visitors or the shape of lookup's match changes; every shortcut choice is the one a full search
    makes. The check can fail: without the shortcut every round searches."""
    levels = build_levels(("lookup", "full@a8"), L)
    priors = {("verify", "target"): 0.9, ("lookup:2", "verify"): 0.5, ("lookup:2", "target"): 0.5}
    policy = AutoPolicy(levels, {None: exact(), "a8": cheap()}, priors, lookup_len=8)
    searched = []
    original = AutoPolicy._candidates
    monkeypatch.setattr(AutoPolicy, "_candidates",
                        lambda self, *a: (searched.append(1) if self is policy else None) or original(self, *a))

    def plan(others, match=([], 0), behind=1):
        policy.before_plan({"a8": behind}, others)
        return policy.plan(room=50, pending=0, match=match)

    first = plan(3)
    assert first.round.plain and len(searched) == 1
    for behind in range(2, 8):  # the 4-bit lane falls further behind at each plain step
        again = plan(3, behind=behind)
        assert again is first and len(searched) == 1
        fresh = AutoPolicy(levels, {None: exact(), "a8": cheap()}, priors, lookup_len=8)
        fresh.before_plan({"a8": behind}, 3)
        assert fresh.plan(room=50, pending=0, match=([], 0)).round == again.round  # what a full search chooses
    plan(2)  # fewer visitors beside it: searched again
    assert len(searched) == 2
    copy = plan(2, match=([11, 12, 13], 2))  # a copy of another shape: searched again
    assert len(searched) == 3
    if copy.round.plain:  # the same shape of copy again: the same choice, not searched; another shape: searched
        assert plan(2, match=([21, 22, 23], 2)) is copy and len(searched) == 3
        plan(2, match=([21, 22], 2))
        assert len(searched) == 4
    n = len(searched)
    alone = plan(0)
    assert len(searched) == n + 1 and not alone.round.plain  # alone, it drafts again
    plan(0)
    assert len(searched) == n + 2  # alone, every round searches (costs and acceptance are learned between rounds)
