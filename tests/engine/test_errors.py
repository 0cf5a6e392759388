"""Bad input gets a clear error naming what is wrong and what is allowed."""

import pytest
from helpers import ee_of, tiny_model

from hispec.engine.config import DecodeConfig, preset
from hispec.engine.decoding import Decoder
from hispec.errors import ConfigError, ModelLoadError
from hispec.model.loading import load_model


def make(ee, prompt=(1, 2, 3), **kw):
    return Decoder(ee, list(prompt), preset(**kw))


@pytest.mark.parametrize("kw, message", [
    (dict(method="hispec", draft_layer=4, verify_layer=4), "draft layer 4 must be below verify layer 4"),
    (dict(method="hispec", draft_layer=5, verify_layer=3), "must be below verify layer 3"),
    (dict(method="hispec", draft_layer=2, verify_layer=8), "verify layer 8 is impossible: this model has 8 layers"),
    (dict(method="hispec", draft_layer=0, verify_layer=3), "draft layer 0 is impossible"),
    (dict(method="hispec", draft_layer=-1), "draft layer -1 is impossible"),
    (dict(method="layerskip", draft_layer=8), "draft layer 8 is impossible"),
    (dict(method="hispec", draft_len=0), "draft_len must be at least 1 (got 0)"),
    (dict(method="hispec", verify_threshold=0), "verify_threshold must be at least 1 (got 0)"),
    (dict(method="hispec", max_new_tokens=-1), "max_new_tokens must be 0 or more (got -1)"),
    (dict(method="hispec", max_new_tokens=1000), "exceeds the model's context of 256 tokens"),
    (dict(method="beam"), "unknown method 'beam'; choose from autoregressive, layerskip, hispec"),
    (dict(method="hispec", draft_len=1.5), "draft_len must be a whole number"),
])
def test_bad_settings_are_refused_with_a_clear_message(tiny_llama, kw, message):
    with pytest.raises(ConfigError) as err:
        make(ee_of(tiny_llama), **kw)
    assert message in str(err.value)


@pytest.mark.parametrize("lengths", [(0, 4), (2,), (2, 4, 6), (2.5, 4), "2,4", (True, 4)])
def test_bad_lengths_name_what_they_are(tiny_llama, lengths):
    with pytest.raises(ConfigError) as err:
        Decoder(ee_of(tiny_llama), [1, 2, 3], DecodeConfig(levels=(2, 4), lengths=lengths))
    assert "lengths are two whole numbers >= 1, e.g. (2, 4): tokens drafted per fixed round, and tentative " \
           "tokens that call the full model" in str(err.value) and repr(tuple(lengths) if not isinstance(
               lengths, str) else lengths) in str(err.value)


def test_empty_prompt(tiny_llama):
    with pytest.raises(ConfigError, match="the prompt is empty"):
        make(ee_of(tiny_llama), prompt=[])


def test_model_too_shallow_for_hispec():
    with pytest.raises(ConfigError, match="0 < draft layer < verify layer < 2"):
        make(ee_of(tiny_model("llama", layers=2)), method="hispec")


def test_unsupported_architecture_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    from hispec.model.early_exit import EarlyExitModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50))
    with pytest.raises(ModelLoadError, match="architecture 'gpt2' is not supported; supported: llama, qwen2"):
        EarlyExitModel(model)


def test_unreachable_model_id_offline():
    with pytest.raises(ModelLoadError) as err:
        load_model("facebook/layerskip-llama3.2-1B", device="cpu")
    text = str(err.value)
    assert "could not load model 'facebook/layerskip-llama3.2-1B'" in text
    assert "not reachable" in text and "'default'" in text


@pytest.mark.parametrize("name, message", [
    ("", "no model given"),
    ("   ", "no model given"),
])
def test_blank_model_name(name, message):
    with pytest.raises(ModelLoadError, match=message):
        load_model(name)


def test_bad_device_and_dtype():
    with pytest.raises(ModelLoadError, match="unknown device 'tpu'"):
        load_model("default", device="tpu")
    with pytest.raises(ModelLoadError, match="unknown dtype 'int3'"):
        load_model("default", device="cpu", dtype="int3")
