"""The embedded default model (SmolLM2-135M-Instruct from the packaged GGUF), offline."""


import pytest
import torch

from helpers import model_threads

from hispec.engine.config import preset
from hispec.model.loading import load_model
from hispec.runs.runner import run
from hispec.text import Detokenizer

pytestmark = pytest.mark.real_model

PROMPTS = {
    "chat": "What should I pack for a weekend hiking trip?",
    "code": "Write a Python function that checks whether a number is prime.",
    "math": "A baker has 24 muffins and sells 3 boxes of 4 muffins. How many muffins are left?",
}


@pytest.fixture(scope="module")
def lm():
    threads = torch.get_num_threads()
    torch.set_num_threads(model_threads())
    yield load_model("default", device="cpu")
    torch.set_num_threads(threads)


def test_default_model_shape(lm):
    assert lm.ee.num_layers == 30 and lm.ee.config.hidden_size == 576
    assert lm.dtype == "float32" and 2 in lm.eos_ids
    assert lm.model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("kind", PROMPTS)
def test_every_method_equals_generate(lm, kind):
    ids = lm.encode(PROMPTS[kind])
    ref = lm.model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                            attention_mask=torch.ones(1, len(ids), dtype=torch.long))[0, len(ids):].tolist()
    detok = Detokenizer(lm.tokenizer)
    for config in (preset("autoregressive", max_new_tokens=32),
                   preset("layerskip", max_new_tokens=32, policy="fixed"),
                   preset("hispec", max_new_tokens=32, policy="fixed"),
                   preset("hispec", draft_layer=8, verify_layer=20, draft_len=3, verify_threshold=3,
                                max_new_tokens=32, policy="fixed"),
                   preset("hispec", policy="auto", max_new_tokens=32),
                   preset("lookup", max_new_tokens=32),
                   preset("hispec", levels=("lookup", 4), max_new_tokens=32)):
        r = run(lm.ee, ids, config, eos_ids=lm.eos_ids, detok=detok)
        assert r.token_ids == ref, config
        assert r.text == lm.tokenizer.decode(ref, skip_special_tokens=True)


def test_cache_is_reused(lm):
    again = load_model("default", device="cpu")
    assert again.source == lm.source and again.load_s < 15


def test_recorded_acceptance_of_the_default_model_replays_its_own_verdicts(lm):
    """scripts/gpu/record_acceptance.py's recording on the real model and its shipped exit heads: the
    runs it writes reproduce the real verdicts when replayed with the same settings."""
    import sys
    from pathlib import Path

    from hispec.engine.config import DecodeConfig
    from hispec.engine.decoding import Decoder
    from hispec.runs.timing_only import RecordedAcceptance
    from hispec.training.heads.prompts import heldout_prompts

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts" / "gpu"))
    import record_acceptance

    prompt = next(iter(heldout_prompts(lm).values()))[0]
    config = DecodeConfig(max_new_tokens=24, **record_acceptance.PATTERNS["hispec"]).resolve_for(lm.ee)
    runs, tokens = record_acceptance.record(lm, [prompt], config)
    assert tokens > 0 and runs["verify"] and runs["target"]
    real = Decoder(lm.ee, lm.encode(prompt.text, chat=prompt.chat), config, eos_ids=lm.eos_ids)
    list(real.events())
    replay = Decoder(lm.ee, lm.encode(prompt.text, chat=prompt.chat), config, eos_ids=lm.eos_ids,
                     judge=RecordedAcceptance(runs, "test"))
    list(replay.events())
    assert replay.decisions == real.decisions
