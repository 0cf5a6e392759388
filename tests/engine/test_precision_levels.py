"""Levels are (depth, precision): the same weights in a cheaper format (4-bit) as levels below the exact
model, on a lane of the stage stack with caches of its own. Output stays the exact model's own greedy
output; the exact model's KV cache ends up as plain exact decoding leaves it; the cheap lane's caches keep
the frontier invariant; a model without the format is refused with what it offers."""

import pytest
import torch
from helpers import ee_of, hf_greedy, tiny_model

from hispec.engine.decoding import DecodeConfig, Decoder
from hispec.engine.events import DoneEvent, RoundEvent, TokenEvent, TokenState
from hispec.engine.lanes import Lanes, lane_layout
from hispec.engine.levels import build_levels, describe_spec, levels_by_role, parse_levels
from hispec.errors import ConfigError
from hispec.evaluation.runner import run
from hispec.model.early_exit import EarlyExitModel

q4 = pytest.importorskip("hispec.model.q4")
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
        config = DecodeConfig(levels=levels, policy=policy, max_new_tokens=20, draft_len=3, verify_threshold=2)
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
    config = DecodeConfig(levels=levels, policy="fixed", max_new_tokens=20, draft_len=3, verify_threshold=2)
    spec, tokens, events = _final_caches(ee, prompt, config, monkeypatch)
    plain, plain_tokens, _ = _final_caches(ee, prompt, DecodeConfig("autoregressive", max_new_tokens=20), monkeypatch)
    assert tokens == plain_tokens
    keys, values, lengths = spec[None]
    pkeys, pvalues, plengths = plain[None]
    held = min(min(lengths), min(plengths))
    assert held >= len(tokens) - 2  # all but the newest token or two, in every layer
    for layer in range(ee.num_layers):
        assert torch.equal(keys[layer][..., :held, :], pkeys[layer][..., :held, :]), layer
        assert torch.equal(values[layer][..., :held, :], pvalues[layer][..., :held, :]), layer
    # The cheaper lane wrote caches of its own, and they differ from the exact ones (other weights).
    q4_keys, _, q4_lengths = spec["q4"]
    assert min(q4_lengths[: 2 if levels[0] == 2 else 8]) > 0 or levels[0] == 2
    last = ee.num_layers - 1
    assert not torch.equal(q4_keys[last][..., :held, :], keys[last][..., :held, :])


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
    config = DecodeConfig(levels=levels, policy="fixed", max_new_tokens=24, draft_len=3, verify_threshold=3)
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
    config = DecodeConfig(levels=("lookup", "full@q4"), policy="fixed", max_new_tokens=24, verify_threshold=2)
    tokens = [e for e in Decoder(ee, PROMPTS[0], config).events() if isinstance(e, TokenEvent)]
    deciders = {(e.state, e.stage) for e in tokens}
    assert (TokenState.TENTATIVE, "verify") in deciders
    assert any(e.state in (TokenState.ACCEPTED, TokenState.TARGET_REJECTED) and e.stage == "target" for e in tokens)
    assert {e.origin for e in tokens} >= {"lookup", "target"}
