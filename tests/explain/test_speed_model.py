"""The cost model's prediction of a run's speed ("Why this speed"): hand-computed cases on flat
costs, the break-even point, and the policy's own score (a run's whole story: tests/evaluation/test_why.py)."""

import pytest

from hispec.engine.planning.costs import CostModel
from hispec.engine.planning.policy import AutoPolicy
from hispec.engine.levels import build_levels
from hispec.explain.speed_model import SliderModel
from hispec.runs.record import PairAcceptance, fixed_round


def fixed_plan(levels=(), count=1, verify_at=1, L=8):  # a fixed round of these levels
    return fixed_round(build_levels(tuple(levels), L), (count, verify_at))


def slider_model(costs, L):  # the sliders' model on the exact lane
    return SliderModel({None: costs}, L)


def pair(low, high, rate):
    return PairAcceptance(low, high, round(rate * 100), 100)


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
    model, r = slider_model(flat_costs(), 8), fixed_plan((2,), 1)
    assert model.speedup(r, 0.0, 1.0) == pytest.approx(8 * 2 / 10)
    assert model.speedup(r, 0.0, 0.0) == pytest.approx(8 * 1 / 10)
    # break-even: 8 (1 + a) / 10 = 1  ->  a = 0.25
    assert model.break_even(r) == pytest.approx(0.25, abs=1e-6)


def test_prediction_rises_with_acceptance_and_crosses_one_at_break_even():
    costs = flat_costs(head=0.05)
    for r in (fixed_plan((4,), 3), fixed_plan((2, 4), 2, 4)):
        model = slider_model(costs, 8)
        ys = [s for _, s in model.curve(r)]
        assert ys == sorted(ys) and ys[0] < 1 < ys[-1]
        a = model.break_even(r)
        assert 0 < a < 1 and model.speedup(r, a, a) == pytest.approx(1.0, abs=1e-6)


def test_a_round_that_cannot_pay_has_no_break_even():
    # exit 7 of 8 with a head that costs 5 layers: a round of one draft costs 2 x 7 + 5 + 1 = 20
    # layer-times for at most 2 tokens, a plain step 8 for one: it never pays, whatever the acceptance
    costs = flat_costs()
    costs._head.update({(7, n): 5.0 for n in (1, 2, 4, 8, 16)})
    model = slider_model(costs, 8)
    assert model.speedup(fixed_plan((7,), 1), 0, 1.0) == pytest.approx(8 * 2 / 20)
    assert model.break_even(fixed_plan((7,), 1)) is None
    assert model.speedup(fixed_plan(), 0.3, 0.3) == 1.0


def test_the_prediction_is_the_adaptive_policys_own_score():
    """One formula: the policy's value of the hierarchy plan over its plain step's value."""
    costs = flat_costs(head=0.02)
    levels = build_levels((2, 4), 8)
    policy = AutoPolicy(levels, costs, {("draft", "verify"): 0.7, ("verify", "target"): 0.6}, lookup_len=8)
    scored = {r.label: rate for rate, r in policy._candidates(room=16, match=([], 0))}
    label = next(k for k in scored if k.endswith("x2 -> exit 4, full at 4"))
    a_dv, a_vt = policy.acceptance.rate("draft", "verify"), policy.acceptance.rate("verify", "target")
    predicted = slider_model(costs, 8).speedup(fixed_plan((2, 4), 2, 4), a_dv, a_vt)
    assert predicted == pytest.approx(scored[label] / scored["plain"])


def test_lookup_by_hand_on_flat_costs():
    """k copied tokens, verified by one full pass over k + 1: (1 + a + a^2) / 8 layers on flat costs."""
    predicted = slider_model(flat_costs(), 8).speedup(fixed_plan(("lookup",), 2), 0.0, 0.5)
    assert predicted == pytest.approx((1 + 0.5 + 0.25) / 8 / (1 / 8))


def _precision_policy():
    levels = build_levels(("lookup", "full@q4"), 8)
    rows = (1, 4, 8, 16)
    exact = CostModel.given({1: 2e-3, 4: 2.4e-3, 8: 3e-3, 16: 4e-3}, {(8, n): 1e-3 * (1 + n / 8) for n in rows})
    cheap = CostModel.given({1: 0.6e-3, 4: 1.5e-3, 8: 2.6e-3, 16: 4.5e-3}, {(8, n): 0.5e-3 * (1 + n / 8) for n in rows})
    priors = {("verify", "target"): 0.95, ("lookup:3", "verify"): 0.5, ("lookup:3", "target"): 0.45}
    return levels, {None: exact, "q4": cheap}, AutoPolicy(levels, {None: exact, "q4": cheap}, priors, lookup_len=6)


def test_every_plan_of_the_precision_list_is_estimated_with_the_policys_own_formula():
    """The default list's plans (a copy, the 4-bit model drafting, a copy judged by the 4-bit model and
    drafted on): the explanation's estimate of each is the policy's own score over its plain step's, from
    the same lane costs and acceptance (Round.speedup, one formula)."""
    from hispec.engine.levels import LOOKUP
    from hispec.engine.planning.policy import lookup_prior

    levels, lanes, policy = _precision_policy()
    scored = list(policy._candidates(room=32, match=([11, 12, 13, 14], 3)))
    plain = next(rate for rate, r in scored if r.plain)

    def accept(low, high):  # as the policy weighs a 3-token match
        holder = "lookup:3" if low.kind == LOOKUP else low.name
        if low.kind == LOOKUP:
            return policy.acceptance.rate(holder, high.name, lookup_prior(policy.priors, 3, high.name))
        return policy.acceptance.rate(holder, high.name)

    kinds = set()
    for rate, r in scored:
        assert r.speedup(lanes, accept) == pytest.approx(rate / plain), r.label
        kinds.add(r.kind.key)
    assert {"plain", "lookup", "full@q4", "lookup -> full@q4", "lookup -> full@q4 (drafts on)"} <= kinds, kinds


def test_the_page_estimates_each_precision_plan_and_states_its_break_even():
    """explain_plans on rows of the default list's plans: a numeric estimate and break-even for every plan
    (none '–'), the break-even named by its pair; a plan whose lane kept no costs has none (said, not
    guessed)."""
    from hispec.explain.plans import PlanRow
    from hispec.explain.speed_model import explain_plans

    levels, lanes, policy = _precision_policy()
    lookup, q4, top = levels
    from hispec.engine.planning.round import RoundKind

    rows = [PlanRow(RoundKind(lookup, (q4,), True), top, rounds=5, new_tokens=30, seconds=0.1,
                    pairs=(pair(lookup, q4, 0.5), pair(q4, top, 0.97)), count=4, then=6),
            PlanRow(RoundKind(q4), top, rounds=3, new_tokens=20, seconds=0.1, pairs=(pair(q4, top, 0.97),), count=8),
            PlanRow(RoundKind(lookup), top, rounds=2, new_tokens=6, seconds=0.05, pairs=(pair(lookup, top, 0.6),),
                    count=3),
            PlanRow(RoundKind(top), top, rounds=4, new_tokens=4, seconds=0.1)]
    plans = explain_plans(rows, lanes, 8)
    for p in plans[:3]:
        assert p["predicted"] is not None and p["predicted"] > 0, p
        assert p["break_even"] is not None and 0 <= p["break_even"] <= 1, p
    assert plans[0]["break_even_pair"] == "lookup → 4-bit full model"
    assert plans[1]["break_even_pair"] == "4-bit full model → full model"
    assert plans[3]["predicted"] == 1.0 and plans[3]["break_even_pair"] is None
    # at its break-even the plan's estimate is a plain step's
    from hispec.explain.speed_model import measured_acceptance, swept_pair

    for row, p in zip(rows[:3], plans):
        r = row.round
        at = r.speedup(lanes, measured_acceptance(row.acceptance, swept_pair(r), p["break_even"]))
        if p["break_even"] > 0:  # the lowest acceptance that pays
            assert at == pytest.approx(1.0, abs=1e-6), p
        else:  # pays at any acceptance of its pair (a copy judged by the 4-bit model, which drafts on itself)
            assert at >= 1.0, p
    assert plans[1]["break_even"] > 0  # the 4-bit model's own drafts must be accepted often enough
    # without the 4-bit lane's costs: no estimate for its plans, the exact ones still estimated
    exact_only = explain_plans(rows, {None: lanes[None]}, 8)
    assert [p["predicted"] is None for p in exact_only] == [True, True, False, False]
