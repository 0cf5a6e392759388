"""Settings left unset follow the model's trained exits' recommendation, else the depth rules."""

import pytest
from helpers import tiny_model

from hispec.engine.config import DecodeConfig, default_exits, preset, recommended_settings
from hispec.engine.decoding import Decoder
from hispec.model.early_exit import EarlyExitModel

REC = {"draft": 2, "verify": 5, "draft_len": 1, "verify_threshold": 3, "layerskip_exit": 3,
       "layerskip_draft_len": 2}


@pytest.fixture()
def ee():
    return EarlyExitModel(tiny_model("llama", layers=8))


def test_without_trained_exits_the_depth_rules_apply(ee):
    assert recommended_settings(ee) == {}
    c = Decoder(ee, [5, 6], preset("hispec")).config
    assert (c.preset.draft_layer, c.preset.verify_layer, *c.lengths) == (1, 2, 2, 4)
    assert (c.preset.draft_len, c.preset.verify_threshold) == c.lengths, "the preset describes the lengths it ran"
    c = Decoder(ee, [5, 6], preset("layerskip")).config
    assert (c.preset.draft_layer, c.lengths[0]) == (2, 4)


def test_the_manifest_recommendation_fills_what_is_unset(ee):
    ee.exit_info = {"default_layers": dict(REC)}
    c = Decoder(ee, [5, 6], preset("hispec")).config
    assert (c.preset.draft_layer, c.preset.verify_layer, *c.lengths) == (2, 5, 1, 3)
    c = Decoder(ee, [5, 6], preset("layerskip")).config
    assert (c.preset.draft_layer, c.lengths[0]) == (3, 2)
    # what the user sets wins; a draft layer of one's own does not inherit the recommended verifier
    c = Decoder(ee, [5, 6], preset("hispec", draft_layer=4, verify_threshold=6)).config
    assert (c.preset.draft_layer, c.preset.verify_layer, *c.lengths) == (4, 5, 1, 6)
    c = Decoder(ee, [5, 6], preset("hispec", draft_layer=1)).config
    assert (c.preset.draft_layer, c.preset.verify_layer) == (1, 2)


def test_an_impossible_recommendation_is_ignored(ee):
    ee.exit_info = {"default_layers": {"draft": 5, "verify": 3, "layerskip_exit": 8, "draft_len": True}}
    assert recommended_settings(ee) == {}
    c = Decoder(ee, [5, 6], preset("hispec")).config
    assert (c.preset.draft_layer, c.preset.verify_layer, c.lengths[0]) == (1, 2, 2)


def test_resolve_for_a_model_is_resolve_with_its_recommendation(ee):
    from hispec.engine.config import preset, recommended_settings as rec

    ee.exit_info = {"default_layers": dict(REC)}
    for config in (preset("hispec"), preset("layerskip"), preset("hispec", policy="fixed"),
                   DecodeConfig(levels=("lookup", 3, 6))):
        assert config.resolve_for(ee) == config.resolve(ee.num_layers, rec(ee))
    assert Decoder(ee, [5, 6], preset("hispec")).config == preset("hispec").resolve_for(ee)


def test_exits_by_role_follow_the_level_names():
    from hispec.engine.levels import build_levels, exits_by_role

    for spec, roles in [(("lookup", 2, 4), {"draft": 2, "verify": 4}), ((2, 4), {"draft": 2, "verify": 4}),
                        ((4,), {"draft": 4}), (("lookup", 4), {"verify": 4}), (("lookup",), {}), ((), {})]:
        assert exits_by_role(spec) == roles
        named = {level.name: level.layer for level in build_levels(spec, 8) if level.kind == "exit"}
        assert named == roles  # the same naming as the levels' own
    assert exits_by_role("lookup,exit2,exit5,full") == {"draft": 2, "verify": 5}


def test_a_resolved_configuration_reads_its_exits_by_role(ee):
    hispec = preset("hispec", policy="fixed").resolve_for(ee)
    assert (hispec.exit_layer("draft"), hispec.exit_layer("verify")) == (1, 2)
    auto = preset("hispec", draft_layer=3, verify_layer=6, policy="auto").resolve_for(ee)
    assert auto.levels == ("lookup", 3, 6) and (auto.exit_layer("draft"), auto.exit_layer("verify")) == (3, 6)
    single = preset("layerskip", draft_layer=4).resolve_for(ee)
    assert (single.exit_layer("draft"), single.exit_layer("verify")) == (4, None)
    under_lookup = DecodeConfig(levels=("lookup", 4)).resolve_for(ee)
    assert (under_lookup.exit_layer("draft"), under_lookup.exit_layer("verify")) == (None, 4)
    assert preset("autoregressive").resolve_for(ee).exit_layer("draft") is None
    assert preset("hispec").exit_layer("draft") is None  # unresolved: no level list yet


def test_one_default_policy_for_the_engine_and_the_cli():
    """The engine's and the CLI's defaults are the one DEFAULT_POLICY (auto: on held-out prompts,
    `bench` measured hispec/auto at 1.33x autoregressive and hispec/fixed at 1.08x, every output equal)."""
    from hispec.cli.parsers import build_parser
    from hispec.engine.planning.policy import DEFAULT_POLICY, POLICIES

    assert DEFAULT_POLICY == "auto" and DEFAULT_POLICY in POLICIES
    assert DecodeConfig().policy == DEFAULT_POLICY
    parser = build_parser()
    for command in (["generate", "--prompt", "x"], ["bench"]):
        assert parser.parse_args(command).policy == DEFAULT_POLICY


def test_hispec_auto_runs_the_precision_list_where_the_model_offers_its_4bit_copy(ee):
    """No exit named, auto policy, a model offering a 4-bit copy: lookup -> the 4-bit model -> the exact
    model (the engine's recommended list, which the page's Levels box starts from too), with int8
    activations (a8) where offered, else q4. Named exits, the fixed policy, other methods, and a model
    without the copy (or one that cannot build it) keep the exits."""
    from hispec.engine.config import PRECISION_LIST, recommended_levels

    ee.exit_info = {"default_layers": dict(REC)}
    assert preset("hispec").resolve_for(ee).levels == ("lookup", 2, 5)  # nothing offered: the exits
    ee.add_format("q4", lambda: None, "no 4-bit kernel here")  # offered with a reason: not offered
    assert recommended_levels(ee.formats()) is None and preset("hispec").resolve_for(ee).levels == ("lookup", 2, 5)
    ee.add_format("q4", lambda: None)  # built on first use: resolving builds nothing
    assert recommended_settings(ee)["levels"] == ("lookup", "full@q4")  # q4 alone: q4
    ee.add_format("a8", lambda: None, "no native route here")
    assert recommended_settings(ee)["levels"] == ("lookup", "full@q4")
    ee.add_format("a8", lambda: None)  # both offered: a8 (measured faster as the drafter)
    assert recommended_settings(ee)["levels"] == PRECISION_LIST == ("lookup", "full@a8")
    c = preset("hispec").resolve_for(ee)
    assert c.levels == ("lookup", "full@a8") and (c.preset.method, c.preset.draft_layer) == ("hispec", None)
    assert DecodeConfig().resolve_for(ee).levels == ("lookup", "full@a8")  # the default configuration
    assert preset("hispec", draft_layer=3).resolve_for(ee).levels == ("lookup", 3, 4)
    assert preset("hispec", verify_layer=6).resolve_for(ee).levels == ("lookup", 2, 6)
    assert preset("hispec", policy="fixed").resolve_for(ee).levels == (2, 5)
    assert preset("layerskip").resolve_for(ee).levels == (3,)
    assert preset("lookup").resolve_for(ee).levels == ("lookup",)
    # a seeded sampling run is planned fixed (reproducible): the paper's exits again
    assert preset("hispec", temperature=0.8, seed=1).resolve_for(ee).levels == (2, 5)


def test_a_4bit_model_itself_recommends_lookup_alone(ee):
    """A model whose own arithmetic is 4-bit (--weights q4 or a8) drafts with lookup alone under hispec's
    own list: its k-token passes cost more than float32's, and its exits did not pay (measured)."""
    from hispec.engine.config import recommended_levels

    assert ee.arithmetic is None  # float weights
    assert recommended_levels(("a8",), "q4") == recommended_levels((), "a8") == ("lookup",)
    assert recommended_levels((), None) is None


def test_a_recorded_run_names_its_preset_in_the_papers_terms():
    """Reports keep DecodeConfig.settings; their readers name a run by the preset it recorded."""
    from hispec.engine.config import DecodeConfig, Preset

    fixed = DecodeConfig(levels=(2, 4), policy="fixed", max_new_tokens=4).resolve(30)
    assert Preset.recorded(fixed.settings()).label() == "hispec (2, 4)"
    single = preset("layerskip", levels=(6,), policy="fixed").resolve(30)
    assert Preset.recorded(single.settings()).label() == "layerskip (exit 6)"
    assert Preset.recorded(preset("autoregressive").resolve(30).settings()).label() == "autoregressive"
    assert Preset.recorded({"method": "lookup"}).label() == "lookup"
    assert default_exits(30) == (4, 8) and default_exits(4) == (1, 2)
