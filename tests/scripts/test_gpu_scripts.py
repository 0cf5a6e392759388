"""The GPU check script runs end to end on CPU (--device cpu --quick), so that a GPU session, short
and rare, never finds it broken: the report has every section, float32 exactness holds in both
execution modes, and the graph mode really replayed passes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def test_gpu_check_smoke_run_on_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    # one thread: its shapes are tiny, and two threads spin-wait badly beside a busy test process
    # (the same run took 115 s alone and 386-538 s inside the suite with two)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--out", str(out)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    exact = report["exactness_fp32"]
    assert exact["all_equal"] and exact["graph_runs"] == exact["runs"] // 2 > 0
    assert {"layerskip(d=2,v=None)", "layerskip(d=2,v=None)+graphs"} <= set(report["bf16_mismatch"]["methods"])
    (timing,) = report["timings"]
    for mode in ("eager", "graphs"):
        part = timing[mode]
        assert part["autoregressive_tokens_per_s"] > 0 and len(part["synthetic"]) == 3
        recorded = part["recorded"]  # the default model's own acceptance pattern, replayed
        assert "SmolLM2-135M-Instruct" in recorded["hispec_pattern"] and recorded["hispec_tokens_per_s"] > 0
        assert "recorded acceptance" in recorded["timing_only"]
        assert 1.2 < recorded["layerskip_tokens_per_full_pass"] < 2.5  # about 40% per token, runs of 0-4
        assert set(part["step_ms"]["1"]) == {"draft_pass_d", "verify_pass_d_to_v", "rest_pass_v_to_L",
                                             "full_pass_0_to_L", "final_head"}
    assert timing["graphs"]["graph_replays"] > 0 and timing["graphs"]["graphs_disabled"] is None
    assert "graph_replays" not in timing["eager"] and timing["graphs_vs_eager_autoregressive"] > 0
    d, v = timing["exits"]  # the exits the side-by-side ran at, by role
    assert 0 < d < v < timing["layers"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_check_refuses_cuda_without_a_gpu(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "gpu_check.py"), "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr


def test_gpu_profile_smoke_run_on_cpu_records_its_run(tmp_path):
    """gpu_session.sh's third step: it runs on a small shape on CPU, times every method three times and
    records what ran (command, commit, versions), so a GPU session's profile can be cited."""
    out = tmp_path / "profile.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu" / "gpu_profile.py"), "--device", "cpu", "--shape",
                           "small", "--new", "6", "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["command"].startswith("python scripts/gpu/gpu_profile.py") and "--shape small" in report["command"]
    assert report["code"]["commit"] and report["env"]["torch"] == torch.__version__ and report["env"]["gpu"] is None
    assert set(report["runs"]) == {"autoregressive", "layerskip@0.9", "hispec@0.9/0.9"}
    assert all(len(v) == 3 and min(v) > 0 for v in report["runs"].values())
    assert report["breakdown_s"]["autoregressive"]["full_passes"] == 5  # the prompt's pass writes the first token
