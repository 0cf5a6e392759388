"""A cheaper lane left behind (by plain steps and copies the exact model checked alone) runs every position it
missed in its next pass: the policy counts that pass (Round.catch_up, from Lanes.behind), and its search of
lookup's judged copies asks every copy length, then drafting on after the best one and the whole copy."""

import pytest
import torch
from helpers import ee_of, hf_greedy, tiny_model

from hispec.engine.config import DecodeConfig
from hispec.engine.decoding import Decoder
from hispec.engine.events import PassEvent
from hispec.engine.stack import StageStack
from hispec.engine.levels import build_levels
from hispec.engine.planning.costs import CostModel
from hispec.engine.planning.policy import THEN, AutoPolicy, Plan, Policy
from hispec.engine.planning.round import Round, lane_draft_rate, lookup_judged_rate

L = 8
SIZES = (1, 2, 4, 8, 16, 32, 64)


def exact() -> CostModel:
    """The exact model: 1 ms a layer for up to 8 rows, more beyond; its head 0.5 ms."""
    return CostModel.given({n: 1e-3 * max(1.0, n / 8) for n in SIZES}, {(L, n): 5e-4 for n in SIZES})


def cheap() -> CostModel:
    """The 4-bit copy: a third of a layer for one row, growing with every row (a lane catching up pays for it)."""
    return CostModel.given({n: 1e-3 / 3 * (1 + (n - 1) / 4) for n in SIZES}, {(L, n): 5e-4 / 3 for n in SIZES})


def test_catch_up_counts_the_rows_a_lane_missed_in_its_first_pass():
    top, low = exact(), cheap()
    lanes = {None: top, "a8": low}
    lookup, a8, full = build_levels(("lookup", "full@a8"), L)
    drafts = Round(a8, full, 4)
    assert drafts.catch_up(lanes, None) == 0.0 and drafts.catch_up(lanes, {"a8": 1}) == 0.0  # up to date
    # 9 positions behind: its first draft's pass runs 9 rows where the formula counts 1
    assert drafts.catch_up(lanes, {"a8": 9}) == pytest.approx(L * (low.layer(9) - low.layer(1)))
    assert drafts.rate(lanes, lambda lo, hi: 0.8, {"a8": 9}) == pytest.approx(
        lane_draft_rate(low, top, L, L, 4, 0.8, L * (low.layer(9) - low.layer(1))))
    assert drafts.rate(lanes, lambda lo, hi: 0.8, {"a8": 9}) < drafts.rate(lanes, lambda lo, hi: 0.8)
    # a copy of 3 judged by the lane: its judging pass runs 3 + 1 rows, and the 8 it missed before them
    judged = Round(lookup, full, 3, (a8,), 1, 2)
    extra = L * (low.layer(4 + 8) - low.layer(4))
    assert judged.catch_up(lanes, {"a8": 9}) == pytest.approx(extra)
    assert judged.rate(lanes, lambda lo, hi: 0.7, {"a8": 9}) == pytest.approx(
        lookup_judged_rate(low, top, L, L, 3, 0.7, 0.7, 2, None, extra))
    # rounds that never run the lane pay nothing for it
    assert Round(lookup, full, 3).catch_up(lanes, {"a8": 50}) == 0.0
    assert Round.plain_step(full).catch_up(lanes, {"a8": 50}) == 0.0


def test_a_lane_far_behind_is_left_for_a_copy_the_exact_model_checks():
    """Up to date, the lane's drafts are the best plan (0.97 agreement at a third of the cost); 60 positions
    behind, its first pass would run them all, and lookup's copy checked by the exact model alone wins. The
    check can fail: the same policy up to date takes the lane."""
    levels = build_levels(("lookup", "full@a8"), L)
    priors = {("verify", "target"): 0.97, ("lookup:3", "verify"): 0.4, ("lookup:3", "target"): 0.4}
    match = ([11, 12, 13, 14, 15], 3)
    chosen = {}
    for behind in (1, 60):
        policy = AutoPolicy(levels, {None: exact(), "a8": cheap()}, priors, lookup_len=8)
        policy.before_plan({"a8": behind})
        chosen[behind] = policy.plan(room=50, pending=0, match=match).round
    assert any(j.precision == "a8" for j in chosen[1].judges) or chosen[1].proposer.precision == "a8", chosen[1]
    assert chosen[60].proposer.kind == "lookup" and not chosen[60].judges, chosen[60]


def test_judged_copies_are_searched_in_two_stages():
    """Every copy length judged alone, then drafting on (THEN's counts) after the best length and after the
    whole copy: for a match of 8, 8 + 2 x 8 judged candidates where every pair made 8 x 9."""
    levels = build_levels(("lookup", "full@a8"), L)
    policy = AutoPolicy(levels, {None: exact(), "a8": cheap()}, {}, lookup_len=8)
    scored = list(policy._candidates(room=50, match=([1, 2, 3, 4, 5, 6, 7, 8], 2)))
    judged = [r for _, r in scored if r.judges and r.proposer.kind == "lookup"]
    alone = {r.count: rate for rate, r in scored if r in judged and not r.then}
    assert sorted(alone) == list(range(1, 9))
    best = max(alone, key=alone.get)
    on = {(r.count, r.then) for r in judged if r.then}
    assert on == {(k, t) for k in {best, 8} for t in THEN[1:]}, (best, sorted(on))
    assert len(scored) == 1 + 8 + 12 + len(judged)


class _Schedule(Policy):
    """Three plain steps, then two drafts of the 4-bit lane, over and over; it records what it hears."""

    name, adapts, lookup_len = "fixed", False, 0

    def __init__(self, levels):
        self.levels, self.heard, self.plans = levels, [], []

    def before_plan(self, behind, others=0):
        self.heard.append(dict(behind))

    def plan(self, room, pending, match):
        cheap, top = self.levels
        n = len(self.plans)
        plan = Plan(Round(cheap, top, min(2, room)) if n % 4 == 3 else Round.plain_step(top))
        self.plans.append(plan)
        return plan

    def observe(self, holder, judge, accepted):
        pass


def _decoder_with_a_q4_lane():
    q4 = pytest.importorskip("hispec.model.formats.q4")
    if q4.q4_kernel.unavailable_reason():
        pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}")
    from hispec.model.early_exit import EarlyExitModel

    model = tiny_model("llama", layers=L, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    decoder = Decoder(ee, [5, 17, 33, 5, 17, 33, 5, 9, 41], DecodeConfig(levels=("full@q4",), max_new_tokens=24))
    decoder.policy = decoder.judge.policy = schedule = _Schedule(decoder.levels[-2:])
    return decoder, schedule


def test_a_lane_left_behind_takes_the_exact_lanes_keys_and_values(monkeypatch):
    """Three plain steps, then the 4-bit lane drafts: it takes the keys and values of the positions it missed
    from the exact lane (copies, bit for bit) and runs only the newest token, so the policy hears it one
    position behind before every plan; the output is still the exact model's own."""
    decoder, schedule = _decoder_with_a_q4_lane()
    copied = []
    catch_up = StageStack.catch_up_from

    def spy(self, other, end):  # after each copy: the lane's keys and values of those positions are the exact lane's
        n = catch_up(self, other, end)
        if n:
            f = self.frontier[1]
            copied.append(n)
            assert all(torch.equal(self.cache.keys[i][..., f - n:f, :], other.cache.keys[i][..., f - n:f, :])
                       and torch.equal(self.cache.values[i][..., f - n:f, :], other.cache.values[i][..., f - n:f, :])
                       for i in range(L))
        return n

    monkeypatch.setattr(StageStack, "catch_up_from", spy)
    events = list(decoder.events())
    rows = [len(ev.serials) for ev in events if isinstance(ev, PassEvent) and ev.stage not in ("target", "prefill")]
    assert schedule.heard and all(b == {"q4": 1} for b in schedule.heard), schedule.heard
    assert rows and set(rows) == {1}, rows  # every pass of the lane ran one row: nothing twice, nothing missed
    assert copied and max(copied) >= 3, copied  # three plain steps' positions, and the correction's
    assert events[-1].token_ids == tuple(hf_greedy(decoder.ee.model, decoder.prompt_ids, 24))


def test_the_decoder_tells_the_policy_how_far_each_lane_is_behind(monkeypatch):
    """A lane that cannot take the exact lane's keys and values (here: told so) runs every position it missed:
    before every plan the policy hears how many; plain steps leave it one further behind each time, and a round
    that runs the lane brings it back to the exact model's newest tokens at most. (A policy on a schedule: the
    adaptive one's choices depend on this machine's timings.)"""
    monkeypatch.setattr(StageStack, "copyable_from", lambda self, other: self.frontier[1])
    decoder, schedule = _decoder_with_a_q4_lane()
    list(decoder.events())
    heard, plans = schedule.heard, schedule.plans
    assert len(heard) == len(plans) >= 8 and heard[0] == {"q4": 1}  # seeded with the prompt: its first token is new
    for before, after, p in zip(heard, heard[1:], plans):
        if p.round.plain:
            assert after["q4"] == before["q4"] + 1, (before, after)
        else:
            assert after["q4"] <= 2, (p.round.label, after)
    assert max(b["q4"] for b in heard) >= 4  # three plain steps in a row: it missed four positions or more
