"""The bench's peers (hispec/evaluation/peers.py) and llama.cpp among them (hispec/evaluation/llama_cpp/llamacpp.py),
without llama.cpp: a stand-in `llama_cpp` module records what the peer asks of it. Peers by name from one
table, the cache emptied before every prompt, the lookup peer's draft model and settings, malformed names
refused, and a peer that cannot run here refused once, before any model loads."""

import sys
import types

import pytest

from hispec.errors import ConfigError
from hispec.cli.main import main
from hispec.evaluation import bench, peers
from hispec.evaluation.llama_cpp import llamacpp
from hispec.evaluation.method import BenchMethod


class _Llama:
    made: list = []

    def __init__(self, **kwargs):
        self.kwargs, self.log = kwargs, []
        _Llama.made.append(self)

    def reset(self):
        self.log.append("reset")

    def generate(self, tokens, **kwargs):
        self.log.append(("generate", tuple(tokens)))
        yield from (5, 6, 7, 2)  # 2: end of text


class _Lookup:
    def __init__(self, max_ngram_size, num_pred_tokens):
        self.max_ngram_size, self.num_pred_tokens = max_ngram_size, num_pred_tokens


@pytest.fixture
def fake_llama(monkeypatch):
    root = types.ModuleType("llama_cpp")
    root.Llama, root.__version__ = _Llama, "0.0-test"
    spec = types.ModuleType("llama_cpp.llama_speculative")
    spec.LlamaPromptLookupDecoding = _Lookup
    monkeypatch.setitem(sys.modules, "llama_cpp", root)
    monkeypatch.setitem(sys.modules, "llama_cpp.llama_speculative", spec)
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    monkeypatch.setattr(llamacpp, "_models", {})
    monkeypatch.setattr("hispec.model.loading.default_gguf_path", lambda: "/nowhere/model.gguf")
    _Llama.made = []
    return _Llama


class _LM:
    name, eos_ids = "default", {2}


def typed(names: list[str]) -> list[BenchMethod]:
    return [BenchMethod.parse(n) for n in names]


def test_peers_by_name_and_their_drafts(monkeypatch):
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    names = ("llamacpp", "llamacpp_lookup", "llamacpp_lookup:4", "llamacpp2", "lookup", "hf_generate", "hf_lookup")
    with pytest.raises(ConfigError, match="unknown benchmark method 'llamacpp2'"):
        typed(["llamacpp2"])
    found = typed([m for m in names if m != "llamacpp2"])
    assert [m.peer is not None for m in found] == [True, True, True, False, True, True]
    assert [m.count for m in found[:3]] == [None, 10, 4]
    for bad in ("llamacpp_lookup:0", "llamacpp_lookup:x", "llamacpp_lookup:65"):
        with pytest.raises(ConfigError, match="llamacpp_lookup:N takes a whole number from 1 to 64"):
            typed(["autoregressive", bad])
    with pytest.raises(ConfigError, match="hf_generate takes no count"):
        typed(["hf_generate:3"])
    with pytest.raises(ConfigError, match="'llamacpp@q4': llamacpp runs its own file"):
        typed(["llamacpp@q4"])
    peers.check(typed(["llamacpp", "llamacpp_lookup", "llamacpp_lookup:2", "hf_lookup@q4"]))
    expanded = bench.expand_weights(typed(["autoregressive", "hf_generate", "llamacpp_lookup:2"]), ["fp32", "q4"])
    assert [m.key for m in expanded] == [
        "autoregressive@fp32", "hf_generate@fp32", "autoregressive@q4", "hf_generate@q4",
        "llamacpp_lookup:2"]  # transformers' peers run on the bench's weights; llama.cpp its own file


def test_a_peer_that_cannot_run_here_is_refused_once_before_any_model_loads(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(llamacpp, "available", lambda: False)
    with pytest.raises(ConfigError) as refused:
        peers.check(typed(["autoregressive", "llamacpp", "llamacpp_lookup:4", "hf_generate"]))
    message = str(refused.value)
    assert message.count("not installed") == 1 and message.startswith("llamacpp, llamacpp_lookup:4 cannot run here")
    assert "pip install -r requirements-llamacpp.txt" in message
    assert main(["bench", "--model", str(tmp_path / "no-such-model"), "--methods", "autoregressive,llamacpp"]) == 2
    err = capsys.readouterr().err
    assert "llamacpp cannot run here" in err and "no-such-model" not in err  # refused before the model loads
    monkeypatch.setattr(llamacpp, "available", lambda: True)
    with pytest.raises(ConfigError, match="llamacpp cannot run for this model: it runs the default model's GGUF"):
        peers.check(typed(["llamacpp"]), type("LM", (), {"name": "tiny"})())


def test_every_prompt_starts_from_an_empty_cache(fake_llama):
    first = llamacpp.run(_LM(), [1, 2, 3], 8)
    llamacpp.run(_LM(), [1, 2, 4], 8)
    (llm,) = fake_llama.made  # one model for the plain peer, kept between prompts
    assert llm.log == ["reset", ("generate", (1, 2, 3)), "reset", ("generate", (1, 2, 4))]
    assert first["token_ids"] == [5, 6, 7, 2] and "draft_model" not in llm.kwargs
    assert first["settings"] == {"engine": "llama-cpp-python 0.0-test", "threads": llm.kwargs["n_threads"],
                                 "cache": "reset per prompt"}


def test_the_lookup_peer_drafts_with_its_own_ngram_model(fake_llama):
    four, default = typed(["llamacpp_lookup:4", "llamacpp_lookup"])
    record = four.peer.run(_LM(), [1, 2, 3], 2, 4, four.count)
    (llm,) = fake_llama.made
    draft = llm.kwargs["draft_model"]
    assert llm.kwargs["logits_all"] is True and (draft.max_ngram_size, draft.num_pred_tokens) == (2, 4)
    assert record["token_ids"] == [5, 6] and record["settings"]["lookup"] == {"max_ngram_size": 2, "num_pred_tokens": 4}
    default.peer.run(_LM(), [1], 2, 4, default.count)
    assert fake_llama.made[-1].kwargs["draft_model"].num_pred_tokens == 10  # its defaults: another model
