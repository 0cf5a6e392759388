"""bench --visitors (hispec/evaluation/visitors.py) on tiny models: the report's shape, each visitor's token ids
against its solo run, the board's calls counted, the table, and the checks that come before any model loads."""

import pytest
from helpers import EOS, char_tokenizer, tiny_model

from hispec.cli.main import main
from hispec.engine.config import preset
from hispec.errors import HiSpecError
from hispec.evaluation import visitors
from hispec.evaluation.method import BenchMethod
from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats import q4_kernel
from hispec.model.formats.q4 import to_q4
from hispec.model.loading import LoadedModel

REASON = q4_kernel.unavailable_reason()


def _lm(q4: bool) -> LoadedModel:
    model = tiny_model("llama", layers=6, seed=3)
    model = to_q4(model) if q4 else model
    model.generation_config.eos_token_id = EOS
    return LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t")


@pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
def test_visitors_at_once_write_their_solo_token_ids_and_share_calls(tmp_path):
    lm = _lm(q4=True)
    prompts = [lm.encode(t, chat=False) for t in ("hello", "abc", "xyz xyz", "q")]
    methods = [BenchMethod.parse("autoregressive"), BenchMethod.parse("hispec/fixed")]
    base = preset("hispec", 2, 4, max_new_tokens=12)
    path = tmp_path / "v.json"
    report = visitors.visitors_bench({"q4": lm}, prompts, methods, base, [1, 3], "q4", json_path=str(path),
                                     host=False)
    assert path.exists() and report["complete"] and report["kind"] == "visitors"
    assert [(r["method"], r["visitors"]) for r in report["results"]] == [
        ("autoregressive", 1), ("autoregressive", 3), ("hispec/fixed", 1), ("hispec/fixed", 3)]
    for r in report["results"]:
        assert r["all_equal_to_solo"], r["differ"]
        assert len(r["alone"]["visitors"]) == len(r["together"]["visitors"]) == r["visitors"]
        assert r["alone"]["shared_calls"] == {}  # one after another: nothing went through the board
        assert r["together"]["tokens"] == r["alone"]["tokens"] > 0
    three = [r for r in report["results"] if r["visitors"] == 3]
    assert all(any(int(w) > 1 for w in r["together"]["shared_calls"]) for r in three)  # calls carried several
    text = visitors.table(report)
    assert "autoregressive" in text and "yes" in text


def test_a_visitor_whose_output_differs_is_reported(monkeypatch):
    """The check is not a formality: a together run that writes other ids is reported as NO, with its index."""
    lm = _lm(q4=False)
    prompts = [lm.encode("hello", chat=False), lm.encode("abc", chat=False)]
    real = visitors._series

    def spoiled(runs, together):
        out = real(runs, together)
        if together:
            out["visitors"][1]["token_ids"] = out["visitors"][1]["token_ids"][:-1] + [0]
        return out

    monkeypatch.setattr(visitors, "_series", spoiled)
    report = visitors.visitors_bench({"fp32": lm}, prompts, [BenchMethod.parse("autoregressive")],
                                     preset("hispec", 2, 4, max_new_tokens=8), [2], "fp32", host=False)
    (r,) = report["results"]
    assert not r["all_equal_to_solo"] and r["differ"] == [1]
    assert "NO [1]" in visitors.table(report)


def test_bad_visitor_counts_and_peers_are_refused_before_any_work():
    for bad in ("0", "1,1", "x", "", "40"):
        with pytest.raises(HiSpecError, match="visitor counts between 1 and 32"):
            visitors.visitor_counts(bad)
    assert visitors.visitor_counts("1, 2,8") == [1, 2, 8]
    with pytest.raises(HiSpecError, match="drop the peers"):
        visitors.visitors_bench({"fp32": None}, [[1]], [BenchMethod.parse("hf_generate")], preset(), [1], "fp32",
                                host=False)
    assert main(["bench", "--visitors", "0"]) == 2  # before the model loads (the default model is not touched)
