"""The engine's own work per pass (CostModel.step): measured in generations, counted once per pass in every
shape of round, so a plan of many one-token drafts is not estimated cheaper than it runs."""

import time

import pytest

from hispec.engine.config import preset
from hispec.engine.decoding import Decoder
from hispec.engine.levels import build_levels
from hispec.engine.planning.costs import CostLearner, CostModel
from hispec.engine.planning.policy import AutoPolicy
from hispec.engine.planning.round import Round, lane_draft_rate, lookup_rate, plain_rate
from helpers import ee_of, identity_layer_model

L = 8


def costs(step: float = 0.0) -> CostModel:
    """A pass costs 1 ms a layer whatever its width, a head 0.5 ms; `step`: the engine's own seconds per pass."""
    return CostModel.given({n: 1e-3 for n in (1, 2, 4, 8, 16)},
                           {(L, n): 5e-4 for n in (1, 2, 4, 8, 16)}, step)


def test_each_shape_pays_the_step_once_per_pass():
    free, busy = costs(), costs(step=2e-3)
    assert 1 / plain_rate(busy, L) - 1 / plain_rate(free, L) == pytest.approx(2e-3)  # one pass
    # a copy of 5 verified in one pass: the step once, however many tokens it carries
    assert (1 + 0.5 + 0.25 + 0.125 + 0.0625 + 0.03125) / lookup_rate(busy, L, 5, 0.5) == pytest.approx(
        (1 + 0.5 + 0.25 + 0.125 + 0.0625 + 0.03125) / lookup_rate(free, L, 5, 0.5) + 2e-3)
    # k drafts in a cheaper lane, then the exact model: k + 1 passes (the lane's step is the exact lane's)
    k, run = 6, 1.0 + 6  # acceptance 1: every draft counts
    seconds = lambda top: run / lane_draft_rate(costs(), top, L, L, k, 1.0)  # noqa: E731
    assert seconds(busy) - seconds(free) == pytest.approx((k + 1) * 2e-3)


def test_a_step_turns_the_policy_from_one_token_drafts_to_plain_steps():
    """The 4-bit copy drafts at a third of the exact model's cost and agrees on 70% of tokens: without the
    engine's own work its drafts pay; with 4 ms of it per pass (half a plain step's layers) a plain step is
    faster, and the policy takes it. The same policy with step 0 drafts: the check can fail."""
    levels = build_levels(("full@a8",), L)
    low = CostModel.given({n: 1e-3 / 3 for n in (1, 2, 4, 8, 16)}, {(L, n): 5e-4 / 3 for n in (1, 2, 4, 8, 16)})
    choices = {}
    for step in (0.0, 4e-3):
        top = costs(step)
        policy = AutoPolicy(levels, {None: top, "a8": low}, {("draft", "target"): 0.7}, lookup_len=8)
        choices[step] = policy.plan(room=50, pending=0, match=([], 0))
    assert not choices[0.0].round.plain and choices[0.0].round.count >= 1, choices[0.0]
    assert choices[4e-3].round.plain, choices[4e-3]
    assert choices[4e-3].estimates["plain"] == pytest.approx(1 / (8e-3 + 5e-4 + 4e-3), rel=1e-3)


def test_a_round_learns_what_its_passes_did_not_take():
    learner = CostLearner({None: None}, build_levels((), L), adaptive=False)
    learner.lanes[None] = top = costs()

    class Pass:  # engine.stack.StagePass, as much of it as the learner reads
        def __init__(self, seconds):
            self.precision, self.start, self.end, self.serials, self.seconds = None, 0, L, (1,), seconds

    learner.on_pass(Pass(0.010))
    learner.on_pass(Pass(0.006))
    assert learner.on_round(0.020) == 0.020  # 4 ms outside the two passes: 2 ms each
    assert top.step == pytest.approx(2e-3)
    learner.on_pass(Pass(0.030))
    learner.on_round(0.020)  # a round faster than its passes (clock noise) counts as no work, never less
    assert top.step == pytest.approx(0.8 * 2e-3)
    assert top.figures_ms()["step"] == pytest.approx(1.6)
    assert CostModel.from_figures_ms(top.figures_ms()).step == pytest.approx(top.step)  # kept in a run's record
    assert "step" not in costs().figures_ms() and CostModel.from_figures_ms(costs().figures_ms()).step == 0.0


def test_a_generation_measures_the_engines_own_work(monkeypatch):
    """Work the engine does between passes (here: a slow token choice, 5 ms a round) is what the step measures."""
    ee = ee_of(identity_layer_model())
    decoder = Decoder(ee, [5, 9, 14], preset("hispec", policy="auto", max_new_tokens=12))
    plan = decoder._plan

    def slow_plan():
        time.sleep(0.005)
        return plan()

    monkeypatch.setattr(decoder, "_plan", slow_plan)
    list(decoder.events())
    top = decoder.costs.lanes[None]
    rounds = decoder.ledger.round
    assert rounds > 0 and top.step >= 0.005 / 4, (top.step, rounds)  # at most a few passes a round share it


def test_a_kind_that_runs_below_its_estimates_is_scaled_down_and_then_left():
    """The 4-bit copy drafts at a third of the exact model's cost, agreeing on 90%: expected well above a plain
    step, it is chosen. Its rounds then commit a third of what their estimates promised in the time they took:
    its estimates are scaled by what they held, a plain step wins, and the reason says why. A kind that holds
    its estimates is not scaled (the check can fail: without the rounds it drafts)."""
    from hispec.engine.planning.policy import HELD_NOTE

    levels = build_levels(("full@a8",), L)
    low = CostModel.given({n: 1e-3 / 3 for n in (1, 2, 4, 8, 16)}, {(L, n): 5e-4 / 3 for n in (1, 2, 4, 8, 16)})

    def fresh():
        return AutoPolicy(levels, {None: costs(), "a8": low}, {("draft", "target"): 0.9}, lookup_len=8)

    policy = fresh()
    first = policy.plan(room=100, pending=0, match=([], 0))
    assert not first.round.plain and first.rate == pytest.approx(first.estimates[first.choice], rel=1e-2)
    for _ in range(3):
        policy.observe_round(first, committed=2, seconds=6 / first.rate)  # 2 tokens where 6 were promised
    assert policy.held.share(first.round.kind) < HELD_NOTE
    after = policy.plan(room=100, pending=0, match=([], 0))
    assert after.round.plain and "full@a8's estimates scaled by 0.4" in after.reason, after
    honest = fresh()
    for _ in range(3):
        honest.observe_round(first, committed=6, seconds=6 / first.rate)  # held what it promised
    assert honest.held.share(first.round.kind) == pytest.approx(1.0)
    kept = honest.plan(room=100, pending=0, match=([], 0))
    assert not kept.round.plain and "scaled" not in kept.reason


def test_when_every_round_runs_below_its_estimate_the_shares_keep_the_faster_kind():
    """After a long prompt every round is slower than the cost model says, plain steps too (exit rounds 40
    tokens/s, plain steps 10, the model saying ~111 for plain): each kind's share falls with its own rounds,
    so the exit, faster here, keeps most rounds once plain steps have been measured."""
    levels = build_levels((2,), 8)
    flat = CostModel.given({n: 1e-3 for n in (1, 2, 4, 8, 16)}, {(8, n): 1e-3 for n in (1, 2, 4, 8, 16)})
    auto = AutoPolicy(levels, flat, {("draft", "target"): 0.9}, lookup_len=8)
    chosen = []
    for _ in range(40):
        plan = auto.plan(room=100, pending=0, match=([], 0))
        chosen.append(plan.choice)
        drafted = not plan.round.plain
        auto.observe_round(plan, committed=2 if drafted else 1, seconds=0.05 if drafted else 0.1)
    assert sum(c.startswith("exit 2") for c in chosen[10:]) >= 25, chosen
