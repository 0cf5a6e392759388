"""The app's Benchmark tab on a tiny model: saved reports, the live run, its lock and limits."""

import html
import os
import threading
from pathlib import Path

import gradio as gr
import pytest
from helpers import tiny_registry, tiny_server

from hispec.engine.config import preset
from hispec.data.prompts import Prompt
from hispec.evaluation.sweep import Grid, sweep
from hispec.serving.api import BenchRequest
from hispec.serving.caller import LOCAL, Caller
from hispec.serving.jobs import Job
from hispec.serving.updates import Ended, Status
from ui import bench_tab
from ui.bench_tab import BenchTab, load_report, saved_reports

SAVED = Path(__file__).resolve().parents[2] / "assets" / "bench" / "bench_cpu_default.json"


@pytest.fixture(scope="module")
def registry():
    return tiny_registry()


@pytest.fixture(scope="module")
def server(registry):
    return tiny_server(registry)


class Recorder:
    """Stands in for gr.Progress: records (fraction, description)."""

    def __init__(self):
        self.calls = []

    def __call__(self, fraction, desc=None):
        self.calls.append((fraction, desc))


def test_the_saved_default_report_renders_as_table_and_charts():
    table, figs = load_report(SAVED)
    assert '<table class="hs-stats hs-bench">' in table and "<b>Benchmark</b>: default · 30 layers" in table
    for method in ("autoregressive", "hf_generate", "layerskip", "hispec"):  # the methods that report ran
        assert f"<td>{html.escape(bench_tab.method_words(method))} <span class='hs-hint'>({method})</span></td>" in table
    assert "heldout-sharegpt" in table
    assert len(figs) == 3 and figs[0].layout.title.text.startswith("Tokens per second")


def test_newest_report_first_and_a_sweep_renders_heatmaps(registry, server, tmp_path):
    # Fixed rounds: under the auto policy a busy host can make every round plain (costs are timed), and a
    # sweep whose cells drafted nothing has no acceptance heatmap (CI failed on that once).
    lm = registry.get("tiny")
    report = sweep(lm, {"s": [Prompt("h", "hello")]}, [Grid("layers", (1, 2), (3, 4))],
                   preset("hispec", max_new_tokens=6, policy="fixed"), json_path=str(tmp_path / "sweep.json"), warmup=False)
    (tmp_path / "old.json").write_text(SAVED.read_text())
    (tmp_path / "broken.json").write_text("{not json")
    os.utime(tmp_path / "old.json", (1, 1))
    os.utime(tmp_path / "broken.json", (2, 2))
    assert [p.name for p in saved_reports(tmp_path)] == ["sweep.json", "broken.json", "old.json"]
    (tmp_path / bench_tab.HEADLINE).write_text(SAVED.read_text())
    os.utime(tmp_path / bench_tab.HEADLINE, (0, 0))  # the oldest, and still first
    assert [p.name for p in saved_reports(tmp_path)][0] == bench_tab.HEADLINE
    (tmp_path / bench_tab.HEADLINE).unlink()
    tab = BenchTab(server, folder=tmp_path)
    table, *plots = tab.show_saved(None)  # None: the newest
    assert "<b>Sweep</b>: tiny · 8 layers" in table and "layers sweep (draft_len=2, verify_threshold=4)" in table
    assert len(plots) == bench_tab.PLOTS
    assert [p["visible"] for p in plots] == [True, True, False, False]
    heat = plots[0]["value"]
    assert heat.data[0].type == "heatmap" and any(t.name.startswith("best (") for t in heat.data)
    assert report["summary"]["grids"]["layers"]["best"] is not None
    table, *plots = tab.show_saved("broken.json")
    assert "Could not read the report broken.json" in table and not any(p["visible"] for p in plots)
    table, *plots = tab.show_saved("old.json")
    assert "<td>HiSpec <span class='hs-hint'>(hispec)</span></td>" in table and [p["visible"] for p in plots] == [True, True, True, False]
    empty = BenchTab(server, folder=tmp_path / "none")
    assert "No saved report" in empty.show_saved(None)[0]


def test_live_tiny_run_through_the_handler(server):
    tab = BenchTab(server)
    progress = Recorder()
    status, table, *plots = tab.run_live("tiny", "examples", 2, ["hispec", "autoregressive"], 8,
                                         progress=progress)
    assert "Done: 2 prompt(s) × 2 method(s), 8 new tokens each." in status
    assert "<td>HiSpec <span class='hs-hint'>(hispec)</span></td>" in table and "<td>plain decoding <span class='hs-hint'>(autoregressive)</span></td>" in table and "<td>yes</td>" in table
    assert "NO" not in table  # every greedy output equals the autoregressive one
    assert [p["visible"] for p in plots] == [True] * bench_tab.LIVE_PLOTS
    fractions = [f for f, _ in progress.calls]
    assert fractions[0] == 0.0 and 0.5 in fractions
    assert any("Prompt 1 of 2 done (examples/chat)" in d for _, d in progress.calls)
    assert server.jobs.of() == []  # the request is forgotten
    assert not server.registry.turns("tiny").busy  # and the model is free


def test_live_run_waits_for_the_models_turn(server):
    turns = server.registry.turns("tiny")
    holder = Job(0, "another-visitor", "generate")
    assert turns.hold(holder, 1.0)
    raw = {"set_name": "examples", "count": 1, "methods": ["autoregressive"], "max_new_tokens": 4}
    stream = server.submit(LOCAL, BenchRequest, raw)
    try:
        first = next(u for u in stream if isinstance(u, Status) and "Waiting" in u.text)
        assert first.text.startswith("Waiting for the model: 1 request ahead")
    finally:
        turns.release(holder)
    updates = list(stream)
    report = next(i for u in updates if hasattr(u, "items") for i in u.items if isinstance(i, dict))
    assert updates[-1].outcome == "done" and len(report["records"]) == 1
    assert not turns.busy


def test_stop_before_the_start_and_after_a_prompt(server):
    turns = server.registry.turns("tiny")
    holder = Job(0, "another-visitor", "generate")
    me = Caller("bench-tab", "10.0.0.3")
    assert turns.hold(holder, 1.0)
    raw = {"set_name": "examples", "count": 2, "methods": ["autoregressive"], "max_new_tokens": 4}
    try:
        stream = server.submit(me, BenchRequest, raw)
        next(u for u in stream if isinstance(u, Status) and "Waiting" in u.text)
        server.stop(me, ("bench",))
        assert list(stream)[-1] == Ended("stopped", "Stopped before the benchmark started.")
    finally:
        turns.release(holder)
    tab, progress = BenchTab(server), Recorder()

    def stop_after_the_first(fraction, desc=None):
        progress(fraction, desc)
        if desc and desc.startswith("Prompt 1 of 3"):
            server.stop(LOCAL, ("bench",))

    status, table, *_ = tab.run_live("tiny", "examples", 3, ["autoregressive", "hispec"], 4,
                                     progress=stop_after_the_first)
    assert "Stopped: showing the 1 of 3 prompt(s) done." in status, status
    assert table.count("<td>HiSpec <span class='hs-hint'>(hispec)</span></td>") >= 1


@pytest.mark.parametrize("args, message", [
    (("examples", 0, ["hispec"], 8), "Number of prompts must be from 1 to 5"),
    (("examples", 2, [], 8), "Pick at least one method of autoregressive"),
    (("examples", 2, ["beam"], 8), "Unknown method 'beam'"),
    (("examples", 2, ["hispec"], 65), "Max new tokens must be between 1 and 64 for a live benchmark"),
    (("examples", 2, ["hispec"], 2.5), "Max new tokens must be a whole number"),
    (("gsm8k", 2, ["hispec"], 8), "Unknown prompt set 'gsm8k'; choose from examples, sharegpt"),
])
def test_bad_live_settings_are_messages(server, args, message):
    status, *_ = BenchTab(server).run_live("tiny", *args, progress=Recorder())
    assert message in html.unescape(status) and "hs-msg-error" in status


def test_live_run_respects_the_server_limits(registry):
    strict = tiny_server(registry, max_prompt_tokens=20, max_new_tokens=10)
    status, *_ = BenchTab(strict).run_live("tiny", "examples", 1, ["hispec"], 12, progress=Recorder())
    assert "Max new tokens must be between 1 and 10" in status  # the server's own limit
    status, *_ = BenchTab(strict).run_live("tiny", "examples", 1, ["hispec"], 8, progress=Recorder())
    assert "over this server&#x27;s limit of 20" in status
    limited = tiny_server(registry, rate_per_minute=1)
    tab = BenchTab(limited)
    tab.run_live("tiny", "examples", 1, ["autoregressive"], 4, progress=Recorder())
    status, *_ = tab.run_live("tiny", "examples", 1, ["autoregressive"], 4, progress=Recorder())
    assert "Rate limit: at most 1 requests per minute from one visitor" in status


def test_the_app_has_the_benchmark_tab(server):
    import app

    demo = app.build(server, ["tiny"])
    tabs = [b for b in demo.blocks.values() if isinstance(b, gr.Tab)]
    assert [t.label for t in tabs] == ["Demo", "Benchmark"]
    assert "benchmark" in {fn.api_name for fn in demo.fns.values()}


def test_the_saved_reports_methods_and_pairs_are_in_words():
    """The Benchmark tab speaks words, not engine keys (issue 49: `hispec/auto@fp32`, `verify->target`)."""
    import json

    from ui.bench_tab import BENCH_DIR, method_words, render_report

    assert method_words("hispec/auto@fp32") == "HiSpec, adaptive, on the float32 model"
    assert method_words("lookup+4/fixed") == "lookup → exit 4, fixed rounds"
    assert method_words("autoregressive@q4") == "plain decoding, on the 4-bit model"
    table, _ = render_report(json.loads((BENCH_DIR / "precision_default_cpu_report.json").read_text()))
    assert "<td>HiSpec, adaptive, on the float32 model <span class='hs-hint'>(hispec/auto@fp32)</span></td>" in table
    assert "-&gt;" not in table and "vs plain decoding, on the float32 model" in table
