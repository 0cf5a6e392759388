"""What each exit believes (hispec/explain/beliefs.py): one pass over a finished generation,
every exit's top candidates at the positions that predicted each generated token."""

import pytest
import torch
from helpers import char_tokenizer, ee_of, hf_greedy, tiny_model

from hispec.errors import ConfigError, HiSpecError
from hispec.explain.beliefs import exit_beliefs
from hispec.model.cache import LayerKVCache
from hispec.model.heads import make_heads

PROMPT = [5, 17, 42, 8, 63, 21]


@pytest.fixture(scope="module")
def generation():
    model = tiny_model("llama", seed=3)
    return model, hf_greedy(model, PROMPT, 10)


def _row(beliefs, kind, layer=None):
    return next(r for r, row in enumerate(beliefs["layers"])
                if row["kind"] == kind and (layer is None or row["layer"] == layer))


def test_the_full_model_row_is_the_greedy_generation(generation):
    model, tokens = generation
    beliefs = exit_beliefs(ee_of(model), PROMPT, tokens)
    assert [row["layer"] for row in beliefs["layers"]] == [2, 4, 6, 8]  # no trained heads: quarters + full
    assert [row["kind"] for row in beliefs["layers"]] == ["raw", "raw", "raw", "full"]
    assert beliefs["num_layers"] == 8
    full = _row(beliefs, "full")
    assert [t["token_id"] for t in beliefs["tokens"]] == tokens
    for tok in beliefs["tokens"]:
        cell = tok["cells"][full]
        assert cell["match"] and cell["top"][0][0] == tok["token_id"]
        assert cell["p"] == pytest.approx(cell["top"][0][2])
        assert tok["certain_at"] is not None and tok["certain_at"] <= 8
        row = tok["certain_row"]
        assert tok["cells"][row]["match"] and not any(c["match"] for c in tok["cells"][:row])
        assert tok["text"] == str(tok["token_id"])


def test_rows_read_the_hidden_state_that_predicted_each_token(generation):
    """Every row equals the transformers model's own states at the position before token i."""
    model, tokens = generation
    beliefs = exit_beliefs(ee_of(model), PROMPT, tokens, layers=[3, 5], top=4)
    ids = torch.tensor([PROMPT + tokens[:-1]])
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
    positions = torch.arange(len(PROMPT) - 1, len(PROMPT) - 1 + len(tokens))
    expected = {8: out.logits[0, positions]}
    with torch.no_grad():
        for layer in (3, 5):
            expected[layer] = model.lm_head(model.model.norm(out.hidden_states[layer][0, positions]))
    for r, row in enumerate(beliefs["layers"]):
        probs = torch.softmax(expected[row["layer"]].float(), -1)
        top_p, top_ids = probs.topk(4, -1)
        for i, tok in enumerate(beliefs["tokens"]):
            got = tok["cells"][r]["top"]
            assert [c[0] for c in got] == top_ids[i].tolist(), (row, i)
            assert [c[2] for c in got] == pytest.approx(top_p[i].tolist(), abs=1e-4)
            assert tok["cells"][r]["p"] == pytest.approx(float(probs[i, tokens[i]]), abs=1e-4)


def test_probabilities_are_sorted_and_bounded(generation):
    model, tokens = generation
    beliefs = exit_beliefs(ee_of(model), PROMPT, tokens, top=5)
    for tok in beliefs["tokens"]:
        for cell in tok["cells"]:
            probs = [c[2] for c in cell["top"]]
            assert len(probs) == 5
            assert all(0.0 <= p <= 1.0 for p in probs)
            assert probs == sorted(probs, reverse=True)
            assert sum(probs) <= 1.0 + 1e-5
            assert 0.0 <= cell["p"] <= 1.0


def test_trained_heads_get_their_own_row_beside_the_raw_exit(generation):
    model, tokens = generation
    ee = ee_of(model)
    heads = make_heads(ee, [2, 5])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for head in heads.values():
            head.proj.copy_(torch.randn(head.proj.shape, generator=g) * 0.5)
    raw_before = exit_beliefs(ee, PROMPT, tokens, layers=[2, 5])
    ee.attach_exit_heads(heads)
    beliefs = exit_beliefs(ee, PROMPT, tokens)
    assert [(r["layer"], r["kind"]) for r in beliefs["layers"]] == [
        (2, "raw"), (2, "trained"), (5, "raw"), (5, "trained"), (8, "full")]
    assert beliefs["layers"][1]["label"] == "exit 2 · trained" and "linear" in beliefs["layers"][1]["head"]
    for layer in (2, 5):
        raw, trained = _row(beliefs, "raw", layer), _row(beliefs, "trained", layer)
        raw_top = [t["cells"][raw]["top"] for t in beliefs["tokens"]]
        assert raw_top == [t["cells"][_row(raw_before, "raw", layer)]["top"] for t in raw_before["tokens"]]
        assert raw_top != [t["cells"][trained]["top"] for t in beliefs["tokens"]]


def test_reduced_vocabulary_heads_list_only_their_subset(generation):
    model, tokens = generation
    ee = ee_of(model)
    subset = torch.tensor(sorted(set(range(3, 20)) | set(tokens)))
    ee.attach_exit_heads(make_heads(ee, [4], vocab_ids=subset))
    beliefs = exit_beliefs(ee, PROMPT, tokens, top=len(subset) + 10)
    trained = _row(beliefs, "trained", 4)
    for tok in beliefs["tokens"]:
        cands = tok["cells"][trained]["top"]
        assert len(cands) == len(subset)  # never a token the head cannot write
        assert {c[0] for c in cands} == set(subset.tolist())
        assert len(tok["cells"][_row(beliefs, "raw", 4)]["top"]) == len(subset) + 10


def test_attention_heads_attend_causally_over_the_whole_sequence(generation):
    model, tokens = generation
    ee = ee_of(model)
    heads = make_heads(ee, [3], head_type="attention")
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        heads[3].attention.o.copy_(torch.randn(heads[3].attention.o.shape, generator=g))
    ee.attach_exit_heads(heads)
    beliefs = exit_beliefs(ee, PROMPT, tokens)
    row = _row(beliefs, "trained", 3)
    assert "note" in beliefs["layers"][row]
    # The engine's way: one position at a time through the head's own cache.
    ids = PROMPT + tokens[:-1]
    hidden = ee.run_layers(ee.embed(ids), 0, 3, ee.new_cache(len(ids)))
    cache = LayerKVCache(1, len(ids))
    with torch.inference_mode():
        attended = torch.cat([heads[3].attend(hidden[:, j:j + 1], cache, 0) for j in range(len(ids))], dim=1)
        probs = torch.softmax(heads[3](attended)[0].float(), -1)
    for i, tok in enumerate(beliefs["tokens"]):
        pos = len(PROMPT) - 1 + i
        got = tok["cells"][row]["top"]
        assert got[0][0] == int(probs[pos].argmax())
        assert got[0][2] == pytest.approx(float(probs[pos].max()), abs=1e-4)
    raw = _row(beliefs, "raw", 3)
    assert any(t["cells"][raw]["top"] != t["cells"][row]["top"] for t in beliefs["tokens"])


def test_token_text_comes_from_the_tokenizer():
    model = tiny_model("llama", seed=5, vocab=99)
    tok = char_tokenizer()
    prompt = tok.encode("Hello", add_special_tokens=False)
    tokens = hf_greedy(model, prompt, 6)
    beliefs = exit_beliefs(ee_of(model), prompt, tokens, layers=[4], tokenizer=tok)
    assert [t["text"] for t in beliefs["tokens"]] == [tok.decode([t]) for t in tokens]
    for t in beliefs["tokens"]:
        for cell in t["cells"]:
            assert all(isinstance(c[1], str) for c in cell["top"])


@pytest.mark.parametrize("kwargs, words", [
    ({"layers": [0]}, "exit layer 0 is impossible"),
    ({"layers": [8]}, "exit layer 8 is impossible"),
    ({"layers": [2, 12]}, "exit layer 12 is impossible"),
    ({"token_ids": []}, "token_ids is empty"),
    ({"prompt_ids": []}, "prompt is empty"),
    ({"top": 0}, "top must be"),
    ({"token_ids": [5, 100]}, "not a token id"),
])
def test_impossible_requests_are_refused_clearly(generation, kwargs, words):
    model, tokens = generation
    args = dict(prompt_ids=PROMPT, token_ids=tokens)
    args.update(kwargs)
    with pytest.raises(ConfigError, match=words) as err:
        exit_beliefs(ee_of(model), **args)
    assert isinstance(err.value, HiSpecError)


def test_a_cheaper_formats_full_model_gets_its_own_row_of_candidates():
    """Issue 56: the default run's 4-bit level acted, yet the candidates table had exit rows only. A format
    asked for gets a row before the full model's, from its own copy: on text the 4-bit model wrote greedily,
    its first choice is every committed token."""
    q4 = pytest.importorskip("hispec.model.formats.q4")
    if q4.q4_kernel.unavailable_reason():
        pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}")
    from hispec.engine.config import DecodeConfig
    from hispec.model.early_exit import EarlyExitModel
    from hispec.runs.runner import run

    model = tiny_model("llama", layers=8, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    written = run(ee.in_format("q4"), PROMPT, DecodeConfig(max_new_tokens=10)).token_ids  # plain 4-bit decoding
    beliefs = exit_beliefs(ee, PROMPT, written, formats=("q4",))
    kinds = [row["kind"] for row in beliefs["layers"]]
    assert kinds[-2:] == ["format", "full"] and beliefs["layers"][-2]["label"] == "4-bit full model", beliefs["layers"]
    row = len(kinds) - 2
    assert all(tok["cells"][row]["match"] for tok in beliefs["tokens"]), "the 4-bit row is the 4-bit model's own"
    with pytest.raises(HiSpecError, match="offers no other format"):
        exit_beliefs(ee_of(model), PROMPT, written, formats=("q4",))  # a model that offers no 4-bit copy
