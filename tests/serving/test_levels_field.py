"""/generate's `levels` field: a level list in the engine's words (lookup, exits, levels in a cheaper
format such as full@q4), checked at the edge with what is allowed, and run exactly."""

import pytest
from helpers import EOS, char_tokenizer, hf_greedy, tiny_model

from hispec.engine.config import DecodeConfig
from hispec.errors import ConfigError
from hispec.model.early_exit import EarlyExitModel
from hispec.model.loading import LoadedModel
from hispec.serving.api import GenerateRequest, api_signature
from hispec.runs.runner import run
from hispec.serving.limits import Limits


def parse(**raw):
    return GenerateRequest.parse({"prompt": "hi", **raw}, Limits())


def test_levels_are_read_in_the_engines_words_and_left_out_means_the_methods_own():
    assert parse().levels is None and parse(levels="").levels is None and parse(levels="  ").levels is None
    assert parse(levels="lookup, 2, 4").levels == "lookup,2,4"
    assert parse(levels="lookup,full@q4").levels == "lookup,full@q4"
    assert parse(levels="exit2,exit4,full").levels == "2,4"
    assert parse(levels="lookup,full@q4").decode_config().levels == ("lookup", "full@q4")
    assert "levels" in api_signature().parameters and api_signature().parameters["levels"].default is None
    assert parse(lengths=" 2, 4").lengths == "2,4" and parse(lengths="2,4").decode_config().lengths == (2, 4)
    assert parse(lengths="").lengths is None and api_signature().parameters["lengths"].default is None


@pytest.mark.parametrize("raw, message", [
    ({"levels": "lookup,full@q8"}, "unknown precision 'q8' in level 'full@q8': choose from q4"),
    ({"levels": "4,2"}, "exit layers must increase from the bottom level up"),
    ({"levels": "2,lookup"}, "the lookup level can appear once, at the bottom"),
    ({"levels": "1,2,3"}, "at most two exit levels"),
    ({"levels": ["lookup"]}, "levels must be text"),
    ({"levels": "lookup," * 40}, "levels is 280 characters, over this server's limit of 64"),
    ({"levels": "lookup,4", "method": "layerskip"}, "levels apply to the hispec method only"),
    ({"lengths": "2"}, "lengths are two whole numbers 'k,t' from 1 to 64"),
    ({"lengths": [2, 4]}, "lengths are two whole numbers 'k,t' from 1 to 64"),
    ({"lengths": "2,0"}, r"lengths' t \(tentative tokens\) must be from 1 to 64 \(got 0\)"),
    ({"lengths": "2,4", "verify_threshold": 4}, "lengths and verify_threshold say the same thing twice"),
])
def test_bad_levels_are_refused_naming_what_is_allowed(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse(**raw)


@pytest.mark.parametrize("levels", ["²", "٣", "４", "exit٣", "lookup,²", "2,４@q4"])
def test_a_layer_number_is_ascii_digits_only(levels):
    """Issue 57: "²" got "Could not read this request (ValueError...)" and a traceback (str.isdigit took it,
    int() refused it), while "٣" and "４" were taken as layers 3 and 4. Each is named as wrong, with what is
    allowed, and the request is refused before any work."""
    from helpers import tiny_server

    from hispec.serving.caller import LOCAL

    with pytest.raises(ConfigError, match=r"unknown level '.+': .*its number in the digits 0-9"):
        parse(levels=levels)
    last = list(tiny_server().submit(LOCAL, GenerateRequest, {"prompt": "hi", "levels": levels}))[-1]
    assert last.outcome == "refused" and "digits 0-9" in last.message, last


def test_a_level_list_runs_and_gives_the_models_greedy_output():
    """Through the request's own path (prepare, then its work): lookup and exit 4 under the full model."""
    import threading

    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    lm = LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t")
    request = parse(prompt="abab abab ab", levels="lookup,4", max_new_tokens=12, chat=False, policy="fixed")
    work = request.prepare(lm, Limits())
    out = list(work(threading.Event(), lambda *_: None))
    prompt_ids = out[0]["prompt_ids"]
    done = out[-1]
    assert done.settings["levels"] == ["lookup", 4] or tuple(done.settings["levels"]) == ("lookup", 4)
    assert list(done.token_ids) == hf_greedy(model, prompt_ids, 12, eos=EOS)


def test_a_levels_request_and_its_preset_equivalent_give_the_same_tokens_and_settings():
    """levels '2,5' and lengths '2,3' in fixed rounds are the paper's hispec with draft layer 2, verify layer 5,
    draft_len 2 and verify_threshold 3."""
    import threading

    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    lm = LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t")
    common = dict(prompt="hello there", max_new_tokens=16, chat=False, policy="fixed")
    runs = []
    for raw in ({"levels": "2,5", "lengths": "2,3"}, {"draft_layer": 2, "verify_layer": 5, "draft_len": 2,
                                                      "verify_threshold": 3}):
        work = parse(**common, **raw).prepare(lm, Limits())
        runs.append(list(work(threading.Event(), lambda *_: None))[-1])
    by_levels, by_preset = runs
    assert list(by_levels.token_ids) == list(by_preset.token_ids)
    assert tuple(by_levels.settings["levels"]) == tuple(by_preset.settings["levels"]) == (2, 5)
    assert tuple(by_levels.settings["lengths"]) == tuple(by_preset.settings["lengths"]) == (2, 3)
    # the engine's own words give the same: levels and lengths, no preset
    direct = run(lm.ee, lm.encode("hello there", chat=False),
                 DecodeConfig(levels=(2, 5), lengths=(2, 3), policy="fixed", max_new_tokens=16), eos_ids=lm.eos_ids)
    assert list(direct.token_ids) == list(by_preset.token_ids) and direct.settings["lengths"] == (2, 3)
    assert (direct.settings["draft_len"], direct.settings["verify_threshold"]) == (2, 3), "described as the preset"


@pytest.mark.parametrize("raw", [{"levels": "lookup,2,5"}, {"draft_layer": 2, "verify_layer": 5}, {}])
def test_a_served_request_checks_and_resolves_its_configuration_once(monkeypatch, raw):
    """From the raw fields to the last token: DecodeConfig.validate runs once (at the edge, before any
    work), the preset-to-levels resolution once (in prepare, with the model); the Decoder takes it as it is."""
    import threading

    from hispec.engine.config import DecodeConfig

    counts = {"validate": 0, "resolve": 0}
    validate, resolve = DecodeConfig.validate, DecodeConfig.resolve

    def counted_validate(self):
        counts["validate"] += 1
        return validate(self)

    def counted_resolve(self, *args, **kwargs):
        if not (self.resolved is not None and self.levels is not None):  # a real resolution, not a pass-through
            counts["resolve"] += 1
        return resolve(self, *args, **kwargs)

    monkeypatch.setattr(DecodeConfig, "validate", counted_validate)
    monkeypatch.setattr(DecodeConfig, "resolve", counted_resolve)
    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    lm = LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t")
    request = parse(prompt="hello there", max_new_tokens=8, chat=False, policy="fixed", **raw)
    assert counts == {"validate": 1, "resolve": 0}  # the edge: checked, nothing resolved yet
    done = list(request.prepare(lm, Limits())(threading.Event(), lambda *_: None))[-1]
    assert done.token_ids and counts == {"validate": 1, "resolve": 1}
