"""Greedy drafts kept on the device (the accelerator path, forced here on CPU): the same output,
and one host-device transfer per verification decision instead of one per drafted token."""

import pytest
from helpers import EOS, hf_greedy, tiny_model

from hispec.engine.config import preset
from hispec.engine.decoding import Decoder
from hispec.model.early_exit import EarlyExitModel
from hispec.engine.events import RoundEvent, TokenEvent, TokenState
from hispec.runs.metrics import StatsCollector

SETTINGS = [
    preset("layerskip", draft_layer=3, draft_len=4, policy="fixed"),
    preset("layerskip", draft_layer=1, draft_len=1, policy="fixed"),
    preset("hispec", draft_layer=2, verify_layer=5, draft_len=3, verify_threshold=4, policy="fixed"),
    preset("hispec", draft_layer=1, verify_layer=2, draft_len=1, verify_threshold=1, policy="fixed"),
]


def _run(ee, prompt, config, defer, eos=()):
    decoder = Decoder(ee, prompt, config, eos_ids=eos, defer_sync=defer)
    stats = StatsCollector(config.method)
    events = list(decoder.events())
    for ev in events:
        stats.add(ev)
    return decoder, events, stats.summary()


@pytest.mark.parametrize("config", SETTINGS, ids=lambda c: f"{c.method}-{c.preset and c.preset.draft_layer}-{c.preset and c.preset.draft_len}")
def test_deferred_drafts_give_the_same_greedy_output(config):
    from dataclasses import replace

    model = tiny_model("llama", seed=4)
    ee = EarlyExitModel(model)
    config = replace(config, max_new_tokens=40)
    ref = hf_greedy(model, [7, 3, 19], 40)
    for defer in (False, True):
        decoder, events, summary = _run(ee, [7, 3, 19], config, defer)
        assert list(events[-1].token_ids) == ref, f"defer_sync={defer}"


def test_one_transfer_per_verification_decision():
    model = tiny_model("llama", seed=4)
    ee = EarlyExitModel(model)
    config = preset("layerskip", draft_layer=3, draft_len=4, max_new_tokens=40, policy="fixed")
    eager, _, eager_stats = _run(ee, [7, 3, 19], config, False)
    deferred, events, stats = _run(ee, [7, 3, 19], config, True)
    rounds = sum(isinstance(e, RoundEvent) for e in events)
    # layerskip: the prefill's token, then one verdict per round (the drafts travel with it).
    assert stats["host_syncs"] == 1 + rounds
    assert eager_stats["host_syncs"] == 1 + rounds + eager_stats["drafted"]
    hispec = preset("hispec", draft_layer=2, verify_layer=5, draft_len=3, verify_threshold=4, max_new_tokens=40,
                          policy="fixed")
    _, events, stats = _run(ee, [7, 3, 19], hispec, True)
    rounds = sum(isinstance(e, RoundEvent) for e in events)
    # hispec: one verdict per round at the verifier, plus one per full verification.
    assert stats["host_syncs"] == 1 + rounds + stats["full_passes"]


def test_eos_drafted_mid_block_cuts_the_block():
    """An EOS inside a device-held block is found at the transfer; the drafts after it are
    discarded, and the output still stops where generate() stops."""
    model = tiny_model("llama", seed=11, vocab=12)
    ee = EarlyExitModel(model)
    cut = 0
    for first in range(3, 12):
        prompt = [first, (first * 7) % 12]
        ref = hf_greedy(model, prompt, 30, eos=EOS)
        for config in (preset("layerskip", draft_layer=2, draft_len=5, max_new_tokens=30, policy="fixed"),
                       preset("hispec", draft_layer=2, verify_layer=5, draft_len=4, max_new_tokens=30,
                                    policy="fixed")):
            _, events, _ = _run(ee, prompt, config, True, eos=[EOS])
            assert list(events[-1].token_ids) == ref
            drafted_eos = {e.serial for e in events if isinstance(e, TokenEvent) and e.state is TokenState.DRAFTED
                           and e.token_id == EOS}
            cut += any(isinstance(e, TokenEvent) and e.state is TokenState.DISCARDED and e.stage == "draft"
                       for e in events) and bool(drafted_eos)
    assert cut >= 1, "the fixture should draft EOS in the middle of a block at least once"
