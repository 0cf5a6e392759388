"""Settings left unset follow the model's trained exits' recommendation, else the depth rules."""

import pytest
from helpers import tiny_model

from hispec.engine.decoding import DecodeConfig, Decoder, recommended_settings
from hispec.model.early_exit import EarlyExitModel

REC = {"draft": 2, "verify": 5, "draft_len": 1, "verify_threshold": 3, "layerskip_exit": 3,
       "layerskip_draft_len": 2}


@pytest.fixture()
def ee():
    return EarlyExitModel(tiny_model("llama", layers=8))


def test_without_trained_exits_the_depth_rules_apply(ee):
    assert recommended_settings(ee) == {}
    c = Decoder(ee, [5, 6], DecodeConfig("hispec")).config
    assert (c.draft_layer, c.verify_layer, c.draft_len, c.verify_threshold) == (1, 2, 2, 4)
    c = Decoder(ee, [5, 6], DecodeConfig("layerskip")).config
    assert (c.draft_layer, c.draft_len) == (2, 4)


def test_the_manifest_recommendation_fills_what_is_unset(ee):
    ee.exit_info = {"default_layers": dict(REC)}
    c = Decoder(ee, [5, 6], DecodeConfig("hispec")).config
    assert (c.draft_layer, c.verify_layer, c.draft_len, c.verify_threshold) == (2, 5, 1, 3)
    c = Decoder(ee, [5, 6], DecodeConfig("layerskip")).config
    assert (c.draft_layer, c.draft_len) == (3, 2)
    # what the user sets wins; a draft layer of one's own does not inherit the recommended verifier
    c = Decoder(ee, [5, 6], DecodeConfig("hispec", draft_layer=4, verify_threshold=6)).config
    assert (c.draft_layer, c.verify_layer, c.draft_len, c.verify_threshold) == (4, 5, 1, 6)
    c = Decoder(ee, [5, 6], DecodeConfig("hispec", draft_layer=1)).config
    assert (c.draft_layer, c.verify_layer) == (1, 2)


def test_an_impossible_recommendation_is_ignored(ee):
    ee.exit_info = {"default_layers": {"draft": 5, "verify": 3, "layerskip_exit": 8, "draft_len": True}}
    assert recommended_settings(ee) == {}
    c = Decoder(ee, [5, 6], DecodeConfig("hispec")).config
    assert (c.draft_layer, c.verify_layer, c.draft_len) == (1, 2, 2)
