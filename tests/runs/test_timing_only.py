"""Timing-only acceptance judges (hispec/timing_only.py): fixed rates and recorded runs. They decide
how many pending tokens a stage accepts whatever the model predicted, and a run says so."""

import json

import pytest
from helpers import tiny_model

from hispec.engine.config import preset
from hispec.engine.decoding import Decoder
from hispec.model.early_exit import EarlyExitModel
from hispec.runs.runner import run
from hispec.runs.timing_only import RecordedAcceptance, SyntheticAcceptance


def test_synthetic_rates_one_and_zero_and_a_seeded_middle():
    assert [SyntheticAcceptance(1.0, 1.0)("verify", n) for n in (1, 3, 7)] == [1, 3, 7]
    assert [SyntheticAcceptance(0.0, 0.0)("target", n) for n in (1, 3, 7)] == [0, 0, 0]
    a, b = SyntheticAcceptance(0.5, 0.5, seed=3), SyntheticAcceptance(0.5, 0.5, seed=3)
    draws = [a("target", 4) for _ in range(200)]
    assert draws == [b("target", 4) for _ in range(200)] and 0 < sum(draws) < 800


def test_runs_are_counted_across_verdicts_and_replayed_across_other_block_sizes():
    decisions = [("verify", 3, 3), ("verify", 2, 1), ("target", 4, 0), ("verify", 4, 0), ("target", 2, 2)]
    runs = RecordedAcceptance.runs_from(decisions)
    assert runs == {"verify": [4, 0], "target": [0, 2]}  # the open target run ends with the generation
    judge = RecordedAcceptance({"target": [4, 0]})
    # blocks of 2: the run of 4 fills two blocks, then the rejection, then the run of 0; then again
    assert [judge("target", 2) for _ in range(6)] == [2, 2, 0, 0, 2, 2]
    assert judge.rates() == {"verify": None, "target": pytest.approx(4 / 6)}
    with pytest.raises(ValueError, match="no recorded runs for stage 'verify'"):
        judge("verify", 1)
    with pytest.raises(ValueError, match="negative"):
        RecordedAcceptance({"target": [1, -1]})


@pytest.mark.parametrize("config", [preset("layerskip", draft_layer=3, draft_len=3, policy="fixed"),
                                    preset("hispec", draft_layer=2, verify_layer=5, draft_len=2,
                                                 verify_threshold=3, policy="fixed")], ids=lambda c: c.method)
def test_replaying_a_recorded_generation_reproduces_its_verdicts_and_text(config, tmp_path):
    from dataclasses import replace

    ee = EarlyExitModel(tiny_model("llama", seed=4))
    config = replace(config, max_new_tokens=40)
    real = Decoder(ee, [7, 3, 19], config)
    real_ids = list(real.events())[-1].token_ids
    assert any(n_ok < n for _, n, n_ok in real.decisions), "the fixture should reject some tokens"
    pattern = RecordedAcceptance(RecordedAcceptance.runs_from(real.decisions), "a test run")
    path = tmp_path / "acc.json"
    path.write_text(json.dumps({"patterns": {config.method: pattern.to_dict()}}))
    replay = Decoder(ee, [7, 3, 19], config, judge=RecordedAcceptance.load(path, config.method))
    done = list(replay.events())[-1]
    assert replay.decisions == real.decisions and done.token_ids == real_ids
    assert "recorded acceptance from a test run" in done.settings["timing_only"]
    assert "output is not the model's" in done.settings["timing_only"]
    with pytest.raises(ValueError, match="no acceptance pattern 'beam'; it has: " + config.method):
        RecordedAcceptance.load(path, "beam")


def test_a_timing_only_run_writes_text_that_is_not_the_models():
    model = tiny_model("llama", seed=4)
    ee = EarlyExitModel(model)
    config = preset("layerskip", draft_layer=3, draft_len=4, max_new_tokens=30, policy="fixed")
    honest = run(ee, [7, 3, 19], config)
    forced = run(ee, [7, 3, 19], config, judge=SyntheticAcceptance(1.0, 1.0))
    assert forced.stats["acceptance"]["draft->target"] == 1.0 and "timing only" in forced.settings["timing_only"]
    assert forced.token_ids != honest.token_ids and "timing_only" not in honest.settings
