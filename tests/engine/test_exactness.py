"""Greedy output of every method equals transformers' own greedy generate() in float32."""

import pytest
from helpers import EOS, ee_of, hf_greedy, tiny_model

from hispec.engine.config import preset
from hispec.runs.runner import run

SETTINGS = [
    dict(method="autoregressive"),
    dict(method="layerskip", draft_layer=1, draft_len=1, policy="fixed"),
    dict(method="layerskip", draft_layer=4, draft_len=4, policy="fixed"),
    dict(method="layerskip", draft_layer=7, draft_len=3, policy="fixed"),
    dict(method="hispec", policy="fixed"),
    dict(method="hispec", draft_layer=1, verify_layer=2, draft_len=1, verify_threshold=1, policy="fixed"),
    dict(method="hispec", draft_layer=2, verify_layer=6, draft_len=3, verify_threshold=2, policy="fixed"),
    dict(method="hispec", draft_layer=3, verify_layer=7, draft_len=4, verify_threshold=6, policy="fixed"),
    dict(method="hispec", draft_layer=6, verify_layer=7, draft_len=2, verify_threshold=5, policy="fixed"),
]
PROMPTS = [[5, 17, 33, 2, 9, 41], [70]]


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "mistral"])
def arch_model(request):
    return tiny_model(request.param, seed=3)


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
@pytest.mark.parametrize("prompt", PROMPTS, ids=["six", "one"])
def test_greedy_equals_transformers_generate(arch_model, settings, prompt):
    ref = hf_greedy(arch_model, prompt, 40)
    result = run(ee_of(arch_model), prompt, preset(max_new_tokens=40, **settings))
    assert result.token_ids == ref
    assert result.stats["new_tokens"] == 40


@pytest.mark.parametrize("method", ["autoregressive", "layerskip", "hispec"])
def test_greedy_with_eos_stops_where_generate_stops(method):
    # A model whose greedy path hits EOS: find a prompt for which generate() stops early.
    model = tiny_model("llama", seed=11, vocab=12)
    ee = ee_of(model)
    stopped = 0
    for first in range(3, 12):
        prompt = [first, (first * 7) % 12]
        ref = hf_greedy(model, prompt, 30, eos=EOS)
        result = run(ee, prompt, preset(method=method, max_new_tokens=30, draft_layer=2,
                                              verify_layer=5 if method == "hispec" else None, policy="fixed"),
                     eos_ids=[EOS])
        assert result.token_ids == ref
        if ref and ref[-1] == EOS and len(ref) < 30:
            stopped += 1
            assert result.stats["finish_reason"] == "eos"
    assert stopped >= 2, "the fixture should exercise EOS for several prompts"
