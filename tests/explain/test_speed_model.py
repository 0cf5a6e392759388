"""The cost model's prediction of a run's speed ("Why this speed"): hand-computed cases on flat
costs, the break-even point, and the policy's own score (a run's whole story: tests/evaluation/test_why.py)."""

import pytest

from hispec.engine.costs import CostModel
from hispec.engine.policy import AutoPolicy
from hispec.explain.speed_model import RoundShape, SpeedModel


def flat_costs(layer=1.0, head=0.0) -> CostModel:
    """Every layer costs `layer` whatever the number of tokens; heads cost `head`."""
    c = CostModel()
    c._layer = {n: layer for n in (1, 2, 4, 8, 16)}
    c._head = {(e, n): head for e in (1, 2, 4, 6, 8) for n in (1, 2, 4, 8, 16)}
    c.calibrated = True
    return c


def test_layerskip_by_hand_on_flat_costs():
    # L = 8, exit 2, one draft: a round costs 2 draft passes of 2 layers + 6 layers = 10 layer-times
    # and commits 1 + a tokens; a plain step commits 1 token per 8 layer-times.
    model, r = SpeedModel(flat_costs(), 8), RoundShape((2,), 1)
    assert model.speedup(r, 0.0, 1.0) == pytest.approx(8 * 2 / 10)
    assert model.speedup(r, 0.0, 0.0) == pytest.approx(8 * 1 / 10)
    # break-even: 8 (1 + a) / 10 = 1  ->  a = 0.25
    assert model.break_even(r) == pytest.approx(0.25, abs=1e-6)


def test_prediction_rises_with_acceptance_and_crosses_one_at_break_even():
    costs = flat_costs(head=0.05)
    for r in (RoundShape((4,), 3), RoundShape((2, 4), 2, 4)):
        model = SpeedModel(costs, 8)
        ys = [s for _, s in model.curve(r)]
        assert ys == sorted(ys) and ys[0] < 1 < ys[-1]
        a = model.break_even(r)
        assert 0 < a < 1 and model.speedup(r, a, a) == pytest.approx(1.0, abs=1e-6)


def test_a_round_that_cannot_pay_has_no_break_even():
    # exit 7 of 8 with a head that costs 5 layers: a round of one draft costs 2 x 7 + 5 + 1 = 20
    # layer-times for at most 2 tokens, a plain step 8 for one: it never pays, whatever the acceptance
    costs = flat_costs()
    costs._head.update({(7, n): 5.0 for n in (1, 2, 4, 8, 16)})
    model = SpeedModel(costs, 8)
    assert model.speedup(RoundShape((7,), 1), 0, 1.0) == pytest.approx(8 * 2 / 20)
    assert model.break_even(RoundShape((7,), 1)) is None
    assert model.speedup(RoundShape(), 0.3, 0.3) == 1.0


def test_the_prediction_is_the_adaptive_policys_own_score():
    """One formula: the policy's value of the hierarchy plan over its plain step's value."""
    from hispec.engine.levels import build_levels

    costs = flat_costs(head=0.02)
    levels = build_levels((2, 4), 8)
    policy = AutoPolicy(levels, costs, {("draft", "verify"): 0.7, ("verify", "target"): 0.6}, lookup_len=8)
    scored = {label: rate for rate, label, _ in policy._candidates(room=16, match=([], 0))}
    label = next(k for k in scored if k.endswith("x2 -> exit 4, full at 4"))
    a_dv, a_vt = policy.acceptance.rate("draft", "verify"), policy.acceptance.rate("verify", "target")
    predicted = SpeedModel(costs, 8).speedup(RoundShape((2, 4), 2, 4), a_dv, a_vt)
    assert predicted == pytest.approx(scored[label] / scored["plain"])


def test_lookup_by_hand_on_flat_costs():
    """k copied tokens, verified by one full pass over k + 1: (1 + a + a^2) / 8 layers on flat costs."""
    predicted = SpeedModel(flat_costs(), 8).speedup(RoundShape(("lookup",), 2), 0.0, 0.5)
    assert predicted == pytest.approx((1 + 0.5 + 0.25) / 8 / (1 / 8))
