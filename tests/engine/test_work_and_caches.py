"""Work accounting and cache invariants, checked from the event stream after every round."""

from collections import defaultdict

import pytest
import torch
from helpers import ee_of

from hispec.engine.config import preset
from hispec.engine.decoding import Decoder
from hispec.engine.events import COMMITTED_STATES, PassEvent, RoundEvent, TokenEvent
from hispec.engine.stack import StageStack
from hispec.model.cache import LayerKVCache

CASES = [
    preset("layerskip", draft_layer=3, draft_len=3, max_new_tokens=30, policy="fixed"),
    preset("hispec", draft_layer=1, verify_layer=4, draft_len=2, verify_threshold=3,
                 max_new_tokens=30, policy="fixed"),
    preset("hispec", draft_layer=5, verify_layer=6, draft_len=4, verify_threshold=2,
                 max_new_tokens=30, policy="fixed"),
]


@pytest.mark.parametrize("config", CASES, ids=lambda c: f"{c.method}-{c.preset and c.preset.draft_layer}-{c.preset and c.preset.verify_layer}")
def test_no_token_runs_through_a_layer_twice_and_caches_shrink_with_depth(tiny_llama, config):
    ee = ee_of(tiny_llama)
    evals = defaultdict(lambda: [0] * ee.num_layers)
    fate, rounds = {}, 0
    for ev in Decoder(ee, [3, 14, 15, 92, 65], config).events():
        if isinstance(ev, PassEvent):
            for serial in ev.serials:
                for layer in range(ev.start, ev.end):
                    evals[serial][layer] += 1
        elif isinstance(ev, TokenEvent):
            fate[ev.serial] = ev.state
        elif isinstance(ev, RoundEvent):
            rounds += 1
            lengths = ev.cache_lengths
            assert all(a >= b for a, b in zip(lengths, lengths[1:])), lengths
            # the deepest layers hold exactly the prompt + committed tokens but the newest
            assert lengths[-1] == 5 + ev.committed - 1
    assert rounds > 3
    assert all(max(counts) <= 1 for counts in evals.values()), "a token ran through a layer twice"
    committed = [s for s, st in fate.items() if st in COMMITTED_STATES]
    assert len(committed) == 30
    # every committed token but the last went through every layer exactly once
    for serial in committed[:-1]:
        assert evals[serial] == [1] * ee.num_layers


def test_stats_split_useful_and_wasted_work(tiny_llama):
    ee = ee_of(tiny_llama)
    from hispec.runs.runner import run

    r = run(ee, [3, 14, 15], preset("hispec", 2, 4, max_new_tokens=24, policy="fixed"))
    work = r.stats["layer_tokens"]
    # 23 tokens after the prefill token went through all 8 layers; the last one is never run.
    assert work["useful"] == 23 * 8
    assert work["wasted"] > 0
    assert work["prefill"] == 3 * 8
    assert sum(s["useful"] + s["wasted"] for s in work["by_stage"].values()) == work["useful"] + work["wasted"]


def test_stats_time_each_stages_layer_passes(tiny_llama):
    ee = ee_of(tiny_llama)
    from hispec.runs.runner import run

    passes = defaultdict(float)

    def seen(ev):
        if isinstance(ev, PassEvent):
            passes[ev.stage] += ev.seconds

    s = run(ee, [3, 14, 15], preset("hispec", 2, 4, max_new_tokens=24, policy="fixed"), on_event=seen).stats
    assert set(s["stage_s"]) == {"prefill", "draft", "verify", "target"}
    assert all(v > 0 for v in s["stage_s"].values())
    assert s["stage_s"] == pytest.approx(dict(passes))
    assert 0 < s["layers_share"] <= 1 and sum(s["stage_s"].values()) <= s["wall_s"]
    ar = run(ee, [3, 14, 15], preset("autoregressive", max_new_tokens=5)).stats
    assert set(ar["stage_s"]) == {"prefill", "target"}


def test_stage_stack_split_equals_one_full_pass(tiny_llama):
    ee = ee_of(tiny_llama)
    tokens = [4, 8, 15, 16, 23, 42, 7, 9]
    full = StageStack(ee, (0, 8), ("target",), 16)
    split = StageStack(ee, (0, 2, 5, 8), ("draft", "verify", "target"), 16)
    for t in tokens:
        full.append(t)
        split.append(t)
    h_full = full.run_to(1, 8)
    split.run_to(1, 6)  # the draft stage runs ahead
    split.run_to(2, 3)
    h3 = split.run_to(3, 8)
    assert split.frontier == [0, 8, 8, 8]
    # chunking changes fp32 rounding only (hidden values reach ~100 in this model)
    torch.testing.assert_close(h3, h_full, rtol=1e-4, atol=2e-3)
    split.truncate(5)
    assert split.frontier == [0, 5, 5, 5] and split.cache_lengths() == [5] * 8 and len(split) == 5


def test_truncate_cuts_each_stage_back_to_what_it_holds(tiny_llama):
    ee = ee_of(tiny_llama)
    stack = StageStack(ee, (0, 2, 5, 8), ("draft", "verify", "target"), 4)
    for t in range(10, 20):
        stack.append(t)
    stack.run_to(3, 4)
    stack.run_to(2, 7)
    stack.run_to(1, 9)
    assert stack.cache_lengths() == [9, 9, 7, 7, 7, 4, 4, 4]
    stack.truncate(6)
    assert stack.cache_lengths() == [6, 6, 6, 6, 6, 4, 4, 4]
    h = stack.run_to(3, 6)  # resumes from the saved hidden states at layer 5
    assert h.shape[1] == 2 and stack.cache_lengths() == [6] * 8


def test_layer_cache_grows_and_crops_per_layer():
    cache = LayerKVCache(3, capacity=2)
    k = torch.randn(1, 2, 3, 4)
    keys, values = cache.update(k, k + 1, 1)
    assert keys.shape[-2] == 3 and cache.lengths == [0, 3, 0]
    keys, _ = cache.update(k[..., :1, :], k[..., :1, :], 1)
    torch.testing.assert_close(keys, torch.cat([k, k[..., :1, :]], dim=-2))
    cache.crop(1, 2)
    assert cache.lengths == [0, 2, 0]
    keys, _ = cache.update(k, k, 1)
    torch.testing.assert_close(keys[..., :2, :], k[..., :2, :])
    torch.testing.assert_close(keys[..., 2:, :], k)
    with pytest.raises(ValueError):
        cache.crop(0, -1)
