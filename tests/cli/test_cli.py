"""The CLI contract on a local model folder (tiny random model, character tokenizer)."""

import json
import subprocess
import sys

import pytest
from helpers import save_tiny_folder

from hispec.cli.main import main


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return str(save_tiny_folder(tmp_path_factory.mktemp("tiny") / "model"))


def test_json_lines_contract(folder, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hello", "id": "a"}\n\n{"prompt": "raw text", "chat": false}\n')
    code = main(["generate", "--model", folder, "--method", "autoregressive,layerskip,hispec",
                 "--prompts", str(prompts), "--max-new-tokens", "12", "--json",
                 "--draft-layer", "2", "--verify-layer", "5", "--policy", "fixed"])
    assert code == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["id"], r["method"]) for r in records] == [
        ("a", "autoregressive"), ("a", "layerskip"), ("a", "hispec"),
        ("3", "autoregressive"), ("3", "layerskip"), ("3", "hispec")]
    for r in records:
        assert set(r) >= {"id", "method", "prompt_token_ids", "token_ids", "text", "settings", "stats"}
        assert len(r["token_ids"]) == r["stats"]["new_tokens"] <= 12
        assert {"new_tokens", "wall_s", "tokens_per_s", "acceptance"} <= set(r["stats"])
        assert r["settings"]["dtype"] == "float32" and r["settings"]["device"] == "cpu"
    by = {(r["id"], r["method"]): r for r in records}
    assert set(by["a", "hispec"]["stats"]["acceptance"]) == {"draft->verify", "verify->target"}
    assert set(by["a", "layerskip"]["stats"]["acceptance"]) == {"draft->target"}
    assert by["a", "hispec"]["settings"]["draft_layer"] == 2 and by["a", "hispec"]["settings"]["verify_layer"] == 5
    for pid in ("a", "3"):
        assert by[pid, "hispec"]["token_ids"] == by[pid, "autoregressive"]["token_ids"] == by[pid, "layerskip"]["token_ids"]
    # chat prompts go through the chat template; raw ones do not
    assert by["a", "hispec"]["prompt_token_ids"] != by["3", "hispec"]["prompt_token_ids"]
    assert len(by["3", "hispec"]["prompt_token_ids"]) == len("raw text")


def test_auto_policy_and_level_lists_keep_the_json_contract(folder, capsys):
    code = main(["generate", "--model", folder, "--method", "autoregressive,hispec,hispec/fixed,lookup+4",
                 "--prompt", "abcabcabcabc", "--max-new-tokens", "16", "--json", "--draft-layer", "2",
                 "--verify-layer", "5"])
    assert code == 0
    by = {r["method"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}
    assert list(by) == ["autoregressive", "hispec", "hispec/fixed", "lookup+4"]
    for r in by.values():
        assert set(r) >= {"id", "method", "prompt_token_ids", "token_ids", "text", "settings", "stats"}
        assert r["token_ids"] == by["autoregressive"]["token_ids"]
    auto = by["hispec"]
    assert auto["settings"]["policy"] == "auto" and auto["settings"]["levels"] == ["lookup", 2, 5]
    assert sum(auto["stats"]["policy_choices"].values()) == auto["stats"]["rounds"]
    assert set(auto["stats"]["acceptance"]) <= {"lookup->target", "draft->target", "verify->target", "draft->verify"}
    assert by["hispec/fixed"]["settings"]["policy"] == "fixed" and by["hispec/fixed"]["stats"]["policy_choices"] == {}
    assert by["lookup+4"]["settings"]["levels"] == ["lookup", 4]


def test_text_output_and_comparison(folder, capsys):
    code = main(["generate", "--model", folder, "--method", "autoregressive,hispec", "--prompt", "hi",
                 "--max-new-tokens", "8", "--show-rejected", "--no-color"])
    out = capsys.readouterr().out
    assert code == 0
    assert "== prompt 0 · hispec ==" in out and "tok/s" in out
    assert "same output as autoregressive" in out and "NO" not in out.split("same output as")[-1]


def test_one_runs_stats_name_its_plans_in_words_and_its_set_up_apart(folder, capsys, monkeypatch):
    """The default model's first CLI run read '24 tokens in 1.70 s = 14.09 tok/s', 1.4 s of it the adaptive
    policy's one-off timing, and 'adaptive plans (rounds) full@q4 2' in the engine's names."""
    import time

    from hispec.engine.planning import costs
    from hispec.runs.metrics import stats_rows

    calibrate = costs.CostModel.calibrate

    def slow_calibrate(self, *args, **kwargs):  # the one-off timing, made long enough to be said
        time.sleep(0.5)
        return calibrate(self, *args, **kwargs)

    monkeypatch.setattr(costs.CostModel, "calibrate", slow_calibrate)
    code = main(["generate", "--model", folder, "--method", "hispec", "--prompt", "abcabcabcabc",
                 "--max-new-tokens", "12", "--no-color", "--draft-layer", "2", "--verify-layer", "5"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("-- "))
    assert code == 0 and "s set-up: the adaptive policy times this machine's passes once per process" in line, line
    assert main(["generate", "--model", folder, "--method", "hispec", "--prompt", "abc", "--max-new-tokens", "4",
                 "--json"]) == 0
    stats = json.loads(capsys.readouterr().out.splitlines()[0])["stats"]
    # which plans the policy picks follows this machine's timings: the words are checked on given choices
    rows = dict(stats_rows({**stats, "policy_choices": {"exit 2 -> exit 5": 3, "lookup": 2, "plain": 1}}))
    assert rows["adaptive plans (rounds)"] == ("exit 2 → exit 5 → full model: 3, lookup → full model: 2, "
                                               "plain step (full model): 1")


@pytest.mark.parametrize("argv, message", [
    (["--method", "beam"], "unknown method 'beam'"),
    (["--method", "hispec/greedy"], "unknown policy 'greedy'"),
    (["--levels", "4,lookup"], "the lookup level can appear once, at the bottom"),
    (["--levels", "lookup,2,40"], "exit layer 40 is impossible"),
    (["--lookup-len", "0"], "lookup_len must be a whole number >= 1"),
    (["--draft-len", "0"], "draft_len must be at least 1"),
    (["--lengths", "2,4", "--verify-threshold", "3"], "lengths and verify_threshold say the same thing twice"),
    (["--max-new-tokens", "-3"], "max_new_tokens must be 0 or more"),
    (["--draft-layer", "6", "--verify-layer", "3"], "draft layer 6 must be below verify layer 3"),
    (["--max-new-tokens", "100000"], "exceeds the model's context"),
    (["--prompt", "   "], "is empty"),
    pytest.param(["--cuda-graphs", "--device", "cpu"], "CUDA graphs need the model on a CUDA device; it is on cpu"),
])
def test_cli_errors_are_messages_not_tracebacks(folder, capsys, argv, message):
    base = ["generate", "--model", folder, "--prompt", "hi"]
    code = main(base + argv)
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Traceback" not in err


def test_lengths_in_the_engines_words_run_as_the_papers(folder, capsys):
    """--levels 2,5 --lengths 1,3 is the paper's --draft-layer 2 --verify-layer 5 --draft-len 1 --verify-threshold 3."""
    runs = []
    for argv in (["--levels", "2,5", "--lengths", "1,3"],
                 ["--draft-layer", "2", "--verify-layer", "5", "--draft-len", "1", "--verify-threshold", "3"]):
        assert main(["generate", "--model", folder, "--prompt", "abcabc", "--max-new-tokens", "10", "--json",
                     "--method", "hispec/fixed", *argv]) == 0
        runs.append(json.loads(capsys.readouterr().out.splitlines()[0]))
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    assert [r["settings"]["lengths"] for r in runs] == [[1, 3], [1, 3]]
    with pytest.raises(SystemExit) as bad:  # argparse's own usage error
        main(["generate", "--model", folder, "--prompt", "hi", "--lengths", "2"])
    assert bad.value.code == 2 and "expected two whole numbers >= 1 as K,T" in capsys.readouterr().err


def test_bad_prompts_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    assert main(["generate", "--prompts", str(bad)]) == 2
    assert "bad.jsonl:2: each line must be an object with a string 'prompt'" in capsys.readouterr().err


def test_help_explains_options():
    out = subprocess.run([sys.executable, "-m", "hispec", "generate", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for option in ("--draft-layer", "--verify-layer", "--draft-len", "--verify-threshold", "--raw", "--json",
                   "--prompts", "--max-new-tokens", "--levels", "--lengths", "--policy", "--lookup-len"):
        assert option in out.stdout


def test_sampling_flags_are_seeded_and_checked(folder, capsys):
    argv = ["generate", "--model", folder, "--prompt", "hi", "--max-new-tokens", "10", "--json",
            "--method", "hispec", "--draft-layer", "2", "--verify-layer", "5",
            "--temperature", "0.9", "--top-k", "20", "--top-p", "0.95", "--seed", "3"]
    assert main(argv) == 0 and main(argv) == 0
    first, second = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert first["token_ids"] == second["token_ids"]
    assert first["settings"]["temperature"] == 0.9 and first["settings"]["seed"] == 3
    assert main(["generate", "--model", folder, "--prompt", "hi", "--top-p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err


def test_ratio_table_warms_up_balances_the_order_and_says_so(folder, capsys, monkeypatch):
    """generate --method a,b,c: a warm-up run of each method, then the order balanced from run to run
    (evaluation.order, as bench, sweep and compare order theirs);
    every run starts from one calibrated cost model; the table says how its ratios were taken."""
    from hispec.runs import runner

    order, starts = [], []
    real = runner.run

    def run(ee, ids, config, **kw):
        order.append((config.method, config.policy, config.max_new_tokens))
        starts.append(ee.cost_model.figures_ms() if config.policy == "auto" else None)
        return real(ee, ids, config, **kw)

    monkeypatch.setattr(runner, "run", run)
    code = main(["generate", "--model", folder, "--method", "autoregressive,hispec/auto,layerskip/fixed",
                 "--prompt", "hi", "--max-new-tokens", "10", "--repeats", "3", "--no-color",
                 "--draft-layer", "2", "--verify-layer", "5"])
    out = capsys.readouterr().out
    assert code == 0
    names = [m for m, _, _ in order]
    assert [n for _, _, n in order[:3]] == [8, 8, 8] and names[:3] == ["autoregressive", "hispec", "layerskip"]
    assert names[3:] == ["autoregressive", "hispec", "layerskip", "layerskip", "hispec", "autoregressive",
                         "hispec", "layerskip", "autoregressive"]
    assert all(policy == "fixed" for m, policy, _ in order if m == "autoregressive")
    assert len({str(s) for s in starts if s is not None}) == 1  # every auto run from the same calibration
    assert "after a warm-up run of each method; 3 runs each, the order balanced from run to run" in out
    assert out.count("== prompt 0 ·") == 3  # each method's text once


def test_single_runs_say_so(folder, capsys):
    assert main(["generate", "--model", folder, "--method", "autoregressive,hispec", "--prompt", "hi",
                 "--max-new-tokens", "6", "--no-color"]) == 0
    assert "1 run each, in the order given (single warm runs: --repeats N for medians)" in capsys.readouterr().out


def test_a_repository_tool_asked_of_the_package_says_where_it_is(capsys):
    from hispec.cli.main import main

    assert main(["figures"]) == 2
    err = capsys.readouterr().err
    assert "python scripts/figures.py" in err and "not a command of the package" in err


@pytest.mark.parametrize("text", ["٣", "４", "²", "3_0", "", "x"])
def test_a_number_option_takes_the_digits_0_to_9_only(text):
    """int() takes '٣' and '４' as 3 and 4, and str.isdigit() says yes to '²': an option names them as wrong."""
    import argparse

    from hispec.cli.parsers import lengths_pair, whole_number

    with pytest.raises(argparse.ArgumentTypeError, match="expected a whole number in the digits 0-9"):
        whole_number(text)
    with pytest.raises(argparse.ArgumentTypeError, match="expected two whole numbers"):
        lengths_pair(f"2,{text}")
    assert whole_number(" 12 ") == 12 and whole_number("-1") == -1 and lengths_pair("2,4") == (2, 4)
