"""llama.cpp's own binary as a bench control (issue 57): what `measure` makes of llama-bench's JSON, its
refusals, and the README's rows from it. A stand-in binary answers as llama-bench does (its -o json
records), so the test needs no build; the real binary is built and run by scripts/measure/llama_bench.py."""

import stat
import sys

import pytest

from hispec.errors import ConfigError
from hispec.evaluation.llama_cpp import llama_bench as lb

# llama-bench -o json records as its build 0c1e570 writes them (avg_ts, stddev_ts); tokens/s by (prompt, generated): tg 130; a k-token pass k * 150 / (1 + k / 8) tokens/s; prompts 400 tokens/s
FAKE = '''#!{python}
import json, sys
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
p, n = int(args["-p"]), int(args["-n"])
ts = 130.0 if n else (400.0 if p >= 32 else p * 150.0 / (1 + p / 8))
print(json.dumps([{{"build_commit": "abc1234", "build_number": 1, "cpu_info": "AMD EPYC", "backends": "CPU",
                   "n_threads": int(args["-t"]), "model_type": "llama 135M Q4_1", "n_prompt": p, "n_gen": n,
                   "avg_ts": ts, "stddev_ts": 1.0, "repack": True}}]))
'''


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "llama-bench"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def test_measure_reads_tg_the_pass_widths_and_the_prompts(fake, tmp_path):
    got = lb.measure(fake, tmp_path / "model.gguf", lb.DEFAULT_FILE, threads=2, widths=(1, 8), prompt_lengths=(64,),
                     repetitions=1)
    assert got["tg"] == {"tokens": 128, "tokens_per_s": 130.0, "stddev": 1.0}
    assert got["pp"]["8"]["pass_cost_over_one"] == pytest.approx((150 / (1 + 1 / 8)) * 8 / (8 * 150 / 2))
    assert got["prompt_eval"]["64"]["seconds"] == pytest.approx(64 / 400)
    assert got["system"]["cpu_info"] == "AMD EPYC" and got["system"]["n_threads"] == 2
    run = lb.as_run(got, 64, 128)
    assert run["ttft_s"] == pytest.approx(0.16) and run["decode_tokens_per_s"] == 130.0
    assert run["tokens_per_s"] == pytest.approx(128 / (0.16 + 127 / 130))
    with pytest.raises(ConfigError, match="measured prompts of 64 tokens, not 100"):
        lb.as_run(got, 100, 128)


def test_a_missing_or_failing_binary_is_named(tmp_path):
    with pytest.raises(ConfigError, match="no llama-bench at .*--build-only"):
        lb.measure(tmp_path / "none", tmp_path / "m.gguf", lb.DEFAULT_FILE, threads=2)
    broken = tmp_path / "llama-bench"
    broken.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(ConfigError, match="failed \\(1\\): error: failed to load model"):
        lb.measure(broken, tmp_path / "m.gguf", lb.DEFAULT_FILE, threads=2)


def test_the_headline_puts_llama_bench_beside_the_runs(fake, tmp_path):
    import figures_tables as t

    records = [{"set": "s", "prompt_id": f"p{i}", "method": m, "prompt_tokens": 64, "tokens_per_s": v,
                "decode_tokens_per_s": 1.2 * v, "ttft_s": 0.01, "token_ids": [1, 2], "settings": {"levels": []}}
               for i in range(2) for m, v in (("autoregressive@fp32", 50.0), ("autoregressive@q4", 100.0))]
    report = {"methods": ["autoregressive@fp32", "autoregressive@q4"], "records": records, "command": "x",
              "max_new_tokens": 128, "llama_bench": {"files": [
                  lb.measure(fake, tmp_path / "m.gguf", lb.DEFAULT_FILE, threads=2, prompt_lengths=(64,), repetitions=1),
                  lb.measure(fake, tmp_path / "m.Q4_0.gguf", lb.Q4_0_FILE, threads=2, prompt_lengths=(64,),
                             repetitions=1)]}}
    table = t.headline_table(report)
    e2e = 128 / (64 / 400 + 127 / 130)
    assert (f"| llama-bench | llama.cpp's own binary: {lb.DEFAULT_FILE} | {e2e:.1f} / 130.0 | "
            f"{e2e / 50:.2f}× / {130 / 60:.2f}× | {e2e / 100:.2f}× / {130 / 120:.2f}× | 160.0 ms |") in table
    assert "| llama-bench (Q4_0: another file) | llama.cpp's own binary: ANOTHER FILE" in table
    assert "median prompt (64 tokens)" in table
