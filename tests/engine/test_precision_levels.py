"""Levels are (depth, precision): the same weights in a cheaper format (4-bit) as levels below the exact
model, on a lane of the stage stack with caches of its own. Output stays the exact model's own greedy
output; the exact model's KV cache ends up as plain exact decoding leaves it; the cheap lane's caches keep
the frontier invariant; a model without the format is refused with what it offers."""

import pytest
import torch
from helpers import ee_of, hf_greedy, tiny_model

from hispec.engine.config import DecodeConfig, preset
from hispec.engine.decoding import Decoder
from hispec.engine.events import DoneEvent, RoundEvent, TokenEvent, TokenState
from hispec.engine.lanes import Lanes, lane_layout
from hispec.engine.levels import build_levels, describe_spec, levels_by_role, parse_levels
from hispec.engine.planning.policy import Plan, Policy
from hispec.engine.planning.round import Round
from hispec.errors import ConfigError
from hispec.runs.runner import run
from hispec.model.early_exit import EarlyExitModel

q4 = pytest.importorskip("hispec.model.formats.q4")
if q4.q4_kernel.unavailable_reason():
    pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}", allow_module_level=True)

LISTS = [("full@q4",), ("lookup", "full@q4"), ("3@q4",), ("2@q4", "full@q4"), ("lookup", "2@q4", "full@q4"),
         (2, "full@q4"), ("2@q4", 2), ("lookup", "5@q4", 5)]
PROMPTS = [[5, 17, 33, 5, 17, 33, 5, 9, 41], [70], [8, 9, 10, 11, 8, 9, 10]]


@pytest.fixture(scope="module")
def pair():
    """A tiny float32 model offering a 4-bit copy of itself (its weights quantised: agreement is partial)."""
    model = tiny_model("llama", layers=8, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    return model, ee


# ---- the vocabulary ---------------------------------------------------------------------------
def test_precision_levels_parse_and_name_their_roles():
    assert parse_levels("lookup,full@q4") == ("lookup", "full@q4")
    assert parse_levels("exit2@q4, full@q4, full") == ("2@q4", "full@q4")
    assert parse_levels(["lookup", "4@q4", 4]) == ("lookup", "4@q4", 4)
    levels = build_levels(parse_levels("lookup,full@q4"), 8)
    assert [(str(lv), lv.name, lv.precision) for lv in levels] == [
        ("lookup", "lookup", None), ("full@q4", "verify", "q4"), ("full", "target", None)]
    assert levels_by_role(("2@q4", "full@q4")) == {"draft": "2@q4", "verify": "full@q4"}
    assert describe_spec(("lookup", "full@q4")) == "lookup -> full@q4 -> full"


@pytest.mark.parametrize("spec, message", [
    ("full@q4,2", "deeper"),
    ("4,4@q4", "more precise"),
    ("full@q8", "unknown precision 'q8'.*choose from q4"),
    ("2@q4,full@q4,4", "at most two exit levels"),
    ("full@q4,full@q4", "each once"),
    ("quarter@q4", "unknown level"),
])
def test_bad_precision_lists_are_refused_with_what_is_allowed(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_levels(spec)


def test_a_model_without_the_format_is_refused_before_any_work():
    ee = ee_of(tiny_model("llama", layers=8))
    with pytest.raises(ConfigError, match="cannot run a level in q4: it offers no other format"):
        Decoder(ee, [1, 2], DecodeConfig(levels=("lookup", "full@q4")))
    ee.add_format("q4", lambda: None, "4-bit levels run the default model's own GGUF blocks")
    with pytest.raises(ConfigError, match="cannot run a level in q4: 4-bit levels run the default model's"):
        Decoder(ee, [1, 2], DecodeConfig(levels=("full@q4",)))


def test_the_lanes_of_a_list():
    layout, stops = lane_layout(build_levels(("lookup", "2@q4", "full@q4", ), 8))
    assert layout == {"q4": ((0, 2, 8), ("draft", "verify")), None: ((0, 8), ("target",))}
    assert stops == {1: ("q4", 1), 2: ("q4", 2), 3: (None, 1)}
    layout, stops = lane_layout(build_levels(("3@q4", 5), 8))  # a cheap lane that stops at an exit
    assert layout == {"q4": ((0, 3, 8), ("draft", "unused")), None: ((0, 5, 8), ("verify", "target"))}


# ---- exactness ---------------------------------------------------------------------------------
@pytest.mark.parametrize("levels", LISTS, ids=lambda x: "+".join(map(str, x)))
@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_every_precision_list_gives_the_exact_models_greedy_output(pair, levels, policy):
    model, ee = pair
    for prompt in PROMPTS:
        config = DecodeConfig(levels=levels, policy=policy, max_new_tokens=20, lengths=(3, 2))
        assert run(ee, prompt, config).token_ids == hf_greedy(model, prompt, 20), (levels, policy, prompt)


def _final_caches(ee, prompt, config, monkeypatch):
    """Run one generation; the exact lane's and each cheaper lane's KV cache as it ends (keys, values,
    lengths per layer), and the committed tokens."""
    seen = {}
    release = Lanes.release

    def keep(self):
        for precision, stack in self.stacks.items():
            cache = stack.cache
            seen[precision] = ([None if k is None else k.clone() for k in cache.keys],
                               [None if v is None else v.clone() for v in cache.values], list(cache.lengths))
        seen["frontiers"] = {p: list(s.frontier) for p, s in self.stacks.items()}
        release(self)

    monkeypatch.setattr(Lanes, "release", keep)
    events = list(Decoder(ee, prompt, config).events())
    done = events[-1]
    assert isinstance(done, DoneEvent)
    return seen, list(prompt) + list(done.token_ids), events


@pytest.mark.parametrize("levels", [("full@q4",), ("lookup", "full@q4"), ("2@q4", "full@q4"), (2, "full@q4")],
                         ids=lambda x: "+".join(map(str, x)))
def test_the_exact_cache_ends_as_plain_exact_decoding_leaves_it(pair, levels, monkeypatch):
    """A cheaper lane writes its own keys and values; the exact lane's cache for the committed tokens is
    bit for bit the cache of plain exact decoding of the same tokens (same kernel: the lean path gives a
    row the same bits whatever the number of rows in the pass)."""
    model, ee = pair
    prompt = PROMPTS[0]
    config = DecodeConfig(levels=levels, policy="fixed", max_new_tokens=20, lengths=(3, 2))
    spec, tokens, events = _final_caches(ee, prompt, config, monkeypatch)
    plain, plain_tokens, _ = _final_caches(ee, prompt, preset("autoregressive", max_new_tokens=20), monkeypatch)
    assert tokens == plain_tokens
    keys, values, lengths = spec[None]
    pkeys, pvalues, plengths = plain[None]
    held = min(min(lengths), min(plengths))
    assert held >= len(tokens) - 2  # all but the newest token or two, in every layer
    for layer in range(ee.num_layers):
        assert torch.equal(keys[layer][..., :held, :], pkeys[layer][..., :held, :]), layer
        assert torch.equal(values[layer][..., :held, :], pvalues[layer][..., :held, :]), layer
    # The cheaper lane wrote caches of its own after the prompt, and they differ from the exact ones
    # (other weights); the prompt's positions it started from the exact lane's (a copy: Lanes.seed_cheap_lanes).
    q4_keys, _, q4_lengths = spec["q4"]
    assert min(q4_lengths[: 2 if levels[0] == 2 else 8]) > 0 or levels[0] == 2
    last, n = ee.num_layers - 1, len(prompt)
    assert not torch.equal(q4_keys[last][..., n:held, :], keys[last][..., n:held, :])
    if levels[0] != 2:  # a lane holding the whole depth (no attention exit head): seeded with the prompt's
        assert torch.equal(q4_keys[last][..., :n, :], keys[last][..., :n, :])
        assert q4_keys[last].data_ptr() != keys[last].data_ptr()


@pytest.mark.parametrize("levels", [("lookup", "2@q4", "full@q4"), ("2@q4", 2)], ids=lambda x: "+".join(map(str, x)))
def test_every_lane_keeps_the_frontier_invariant_round_by_round(pair, levels, monkeypatch):
    """Within each lane, per-layer cache lengths never increase with depth; the exact lane never holds a
    position the exact model has not decided or is not deciding."""
    _, ee = pair
    lengths_seen = []
    original = Lanes.cache_lengths

    def spy(self, precision=None):
        lengths_seen.append({p: s.cache_lengths() for p, s in self.stacks.items()})
        return original(self, precision)

    monkeypatch.setattr(Lanes, "cache_lengths", spy)
    config = DecodeConfig(levels=levels, policy="fixed", max_new_tokens=24, lengths=(3, 3))
    events = list(Decoder(ee, PROMPTS[0], config).events())
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    assert len(lengths_seen) == len(rounds) > 3
    for snapshot in lengths_seen:
        for lane in snapshot.values():
            assert all(a >= b for a, b in zip(lane, lane[1:])), snapshot


def test_cheap_levels_write_and_judge_under_their_role_names(pair):
    """[lookup, full@q4, full]: lookup copies, the 4-bit model judges (tentative / verify_rejected, its own
    token verify_wrote), the exact model accepts or rejects; the events name the roles of the presets."""
    _, ee = pair
    config = DecodeConfig(levels=("lookup", "full@q4"), policy="fixed", max_new_tokens=24, lengths=(None, 2))
    tokens = [e for prompt in PROMPTS for e in Decoder(ee, prompt, config).events() if isinstance(e, TokenEvent)]
    deciders = {(e.state, e.stage) for e in tokens}
    # (which verdicts the 4-bit copy of a tiny random model gives is chance: it judges, under its role)
    assert deciders & {(TokenState.TENTATIVE, "verify"), (TokenState.VERIFY_REJECTED, "verify")}
    assert any(e.state == TokenState.VERIFY_WROTE and e.origin == e.stage == "verify" for e in tokens)
    assert any(e.state in (TokenState.ACCEPTED, TokenState.TARGET_REJECTED) and e.stage == "target" for e in tokens)
    assert {e.origin for e in tokens} >= {"lookup", "target"}


# ---- the three levels in one round: lookup copies, the cheap lane judges and drafts on -----------
class _DraftOn(Policy):
    """A policy that always takes the three-level round where it can: lookup's whole match judged by
    the 4-bit model, which then drafts `then` more tokens itself; the exact model verifies them all."""

    name, lookup_len = "fixed", 6

    def __init__(self, then, levels):
        self.then, self.plans, self.levels = then, [], levels

    def lookup_limit(self, room):
        return min(self.lookup_len, room)

    def plan(self, room, pending, match):
        tokens, (lookup, cheap, top) = tuple(match[0]), self.levels
        plan = (Plan(Round(lookup, top, len(tokens), (cheap,), 1, self.then), tokens=tokens) if tokens
                else Plan(Round(cheap, top, min(2, room))))
        self.plans.append(plan)
        return plan

    def observe(self, holder, judge, accepted):
        pass

    def observe_round(self, plan, committed, seconds):
        pass


@pytest.mark.parametrize("then", [1, 4])
@pytest.mark.parametrize("budget", [5, 20])
def test_lookup_judged_then_drafted_on_by_the_cheap_lane_is_exact(pair, monkeypatch, then, budget):
    """Round by round: lookup proposes, full@q4 keeps the agreeing prefix (or writes its own token) and
    drafts `then` more, the exact model decides. Output equals generate()'s; the drafts that go on after
    the copy are the 4-bit model's, in the rounds that copied; a small budget is never overrun."""
    import hispec.engine.decoding as decoding

    model, ee = pair
    policies = []

    def make(name, levels, *a, **k):
        policies.append(_DraftOn(then, levels))
        return policies[-1]

    monkeypatch.setattr(decoding, "make_policy", make)
    for prompt in PROMPTS:
        config = DecodeConfig(levels=("lookup", "full@q4"), policy="fixed", max_new_tokens=budget)
        events = list(Decoder(ee, prompt, config).events())
        assert list(events[-1].token_ids) == hf_greedy(model, prompt, budget), (prompt, then, budget)
        assert len(events[-1].token_ids) <= budget
    copied = [p for pol in policies for p in pol.plans if p.tokens]
    assert copied or budget < 20, "no prompt gave a lookup match: the test would not exercise the three-level round"
    # the rounds that copied: lookup's tokens first, then drafts by the 4-bit model in the same round
    tokens = [e for e in Decoder(ee, PROMPTS[0], DecodeConfig(levels=("lookup", "full@q4"), policy="fixed",
                                                            max_new_tokens=20)).events() if isinstance(e, TokenEvent)]
    by_round: dict[int, list[str]] = {}
    for e in tokens:
        if e.state == TokenState.DRAFTED:
            by_round.setdefault(e.round, []).append(e.origin)
    # full@q4 holds the verify role in [lookup, full@q4, full]: its drafts follow the copy in one round
    three = [r for r, origins in by_round.items() if origins[0] == "lookup" and origins[-1] == "verify"]
    assert three, f"the 4-bit model never drafted on after a copy: {by_round}"


def test_the_policy_plans_the_three_level_round_when_the_cheap_lane_agrees():
    """With the 4-bit full model agreeing with the exact one and a lookup match at hand, the adaptive
    policy's best plan copies, judges with full@q4 and drafts on (a 'lookup k -> full@q4 +m' round),
    and that kind is told apart from the plain judged copy for the drop rule."""
    from hispec.engine.planning.costs import CostModel
    from hispec.engine.planning.policy import AutoPolicy, plan_kind

    levels = build_levels(("lookup", "full@q4"), 30)
    rows = (1, 8, 16)
    exact = CostModel.given({1: 1e-3, 8: 1.4e-3, 16: 2.2e-3}, {(30, n): 0.3e-3 * (1 + n / 8) for n in rows})
    cheap = CostModel.given({1: 0.4e-3, 8: 1.0e-3, 16: 1.8e-3}, {(30, n): 0.3e-3 * (1 + n / 8) for n in rows})
    # keyed by the levels' role names: full@q4 is the verify level of [lookup, full@q4, full]
    priors = {("verify", "target"): 1.0, ("lookup:3", "verify"): 0.6, ("lookup:3", "target"): 0.6}
    policy = AutoPolicy(levels, {None: exact, "q4": cheap}, priors, lookup_len=6)
    plan = policy.plan(64, 0, ([11, 12, 13, 14], 3))
    assert plan.tokens and plan.round.judges == (levels[1],) and plan.round.then > 0, plan.choice
    assert plan.choice.startswith("lookup ") and "-> full@q4 +" in plan.choice
    assert plan_kind(plan) != plan_kind(Plan(Round(levels[0], levels[2], 4, (levels[1],)), tokens=(1, 2, 3, 4)))
