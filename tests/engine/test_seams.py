"""The engine's named seams: the Policy interface both policies implement, the Verdict a level's
judgement returns, and the typed point mass a lookup proposal is drawn from."""

import pytest
import torch

from hispec.engine.planning.costs import CostModel
from hispec.engine.config import DecodeConfig
from hispec.engine.levels import build_levels
from hispec.engine.planning.policy import AutoPolicy, FixedPolicy, Plan, Policy, make_policy
from hispec.engine.sampling import PointMass, SamplingParams, Selector, Verdict, residual

COSTS = CostModel.given({1: 1e-3, 8: 1.2e-3}, {(e, n): 1e-4 for e in (2, 4, 8) for n in (1, 8)})


def test_both_policies_implement_the_policy_interface():
    levels = build_levels(("lookup", 2, 4), 8)
    fixed = make_policy("fixed", levels, DecodeConfig(lengths=(2, 4)), None, {})
    auto = make_policy("auto", levels, DecodeConfig(), COSTS, {})
    assert isinstance(fixed, FixedPolicy) and isinstance(auto, AutoPolicy)
    for policy in (fixed, auto):
        assert isinstance(policy, Policy) and policy.lookup_limit(3) == 3 and policy.lookup_limit(50) == 8
        plan = policy.plan(room=10, pending=0, match=([7, 8], 2))
        assert isinstance(plan, Plan)
        policy.observe("lookup:2", "target", True)
    with pytest.raises(TypeError):  # the interface itself cannot plan
        Policy()


def test_a_verdict_has_named_fields():
    greedy = Selector(SamplingParams())
    logits = torch.nn.functional.one_hot(torch.tensor([4, 6, 9]), 12).float()  # rows predict 4, 6, 9
    verdict = greedy.judge([4, 7], [None, None], logits)
    assert verdict == Verdict(accepted=1, token=6, dist=None, dists=(None, None, None))
    assert greedy.judge([4, 6], [None, None], logits).token == 9  # all accepted: the bonus token
    with pytest.raises(AttributeError):
        verdict.accepted = 2  # frozen


def test_a_point_mass_is_the_distribution_of_a_copied_token():
    mass = PointMass(3)
    q = mass.over(torch.zeros(6))
    assert q.tolist() == [0, 0, 0, 1, 0, 0]
    p = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0, 0.0])
    assert torch.allclose(residual(p, q), torch.tensor([1, 2, 3, 0, 0, 0]) / 6)  # p without the copied token
    sampler = Selector(SamplingParams(temperature=1.0), seed=0)
    certain = torch.log(torch.tensor([[1e-9, 1e-9, 1e-9, 1.0, 1e-9, 1e-9]] * 2))
    assert sampler.judge([3], [mass], certain).accepted == 1  # p(x) / q(x) = 1: always accepted
