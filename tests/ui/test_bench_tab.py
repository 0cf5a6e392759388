"""The app's Benchmark tab on a tiny model: saved reports, the live run, its lock and limits."""

import os
import threading
from pathlib import Path

import gradio as gr
import pytest
from helpers import tiny_registry

from hispec.engine.decoding import DecodeConfig
from hispec.serving.limits import Limits
from hispec.evaluation.prompts import Prompt
from hispec.evaluation.sweep import Grid, sweep
from ui import bench_tab, handlers
from ui.bench_tab import BenchTab, bench_stream, load_report, saved_reports

SAVED = Path(__file__).resolve().parents[2] / "assets" / "bench" / "bench_cpu_default.json"


@pytest.fixture(scope="module")
def registry():
    return tiny_registry()


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
        assert f"<td>{method}</td>" in table
    assert "heldout-sharegpt" in table
    assert len(figs) == 3 and figs[0].layout.title.text.startswith("Tokens per second")


def test_newest_report_first_and_a_sweep_renders_heatmaps(registry, tmp_path):
    lm = registry.get("tiny")
    report = sweep(lm, {"s": [Prompt("h", "hello")]}, [Grid("layers", (1, 2), (3, 4))],
                   DecodeConfig("hispec", max_new_tokens=6), json_path=str(tmp_path / "sweep.json"), warmup=False)
    (tmp_path / "old.json").write_text(SAVED.read_text())
    (tmp_path / "broken.json").write_text("{not json")
    os.utime(tmp_path / "old.json", (1, 1))
    os.utime(tmp_path / "broken.json", (2, 2))
    assert [p.name for p in saved_reports(tmp_path)] == ["sweep.json", "broken.json", "old.json"]
    tab = BenchTab(registry, handlers.OPEN, folder=tmp_path)
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
    assert "<td>hispec</td>" in table and [p["visible"] for p in plots] == [True, True, True, False]
    empty = BenchTab(registry, handlers.OPEN, folder=tmp_path / "none")
    assert "No saved report" in empty.show_saved(None)[0]


def test_live_tiny_run_through_the_handler(registry):
    tab = BenchTab(registry, handlers.OPEN)
    progress = Recorder()
    status, table, *plots = tab.run_live("tiny", "examples", 2, ["hispec", "autoregressive"], 8,
                                         progress=progress)
    assert "Done: 2 prompt(s) × 2 method(s), 8 new tokens each." in status
    assert "<td>hispec</td>" in table and "<td>autoregressive</td>" in table and "<td>yes</td>" in table
    assert "NO" not in table  # every greedy output equals the autoregressive one
    assert [p["visible"] for p in plots] == [True] * bench_tab.LIVE_PLOTS
    fractions = [f for f, _ in progress.calls]
    assert fractions[0] == 0.0 and 0.5 in fractions and fractions[-1] == 1.0
    assert any("Prompt 1 of 2 done (examples/chat)" in d for _, d in progress.calls)
    assert not tab.stops  # the visitor's stop flag is forgotten
    assert registry.generation_lock("tiny").acquire(blocking=False)  # and the model's lock is free
    registry.generation_lock("tiny").release()


def test_live_run_waits_for_the_generation_lock(registry):
    lock = registry.generation_lock("tiny")
    lock.acquire()
    stream = bench_stream(registry, "tiny", "examples", 1, ["autoregressive"], 4, threading.Event())
    try:
        first = next(stream)
        assert first["status"] == "Waiting for another visitor's generation to finish…"
    finally:
        lock.release()
    snaps = list(stream)
    assert snaps[-1]["done"] and len(snaps[-1]["report"]["records"]) == 1
    assert lock.acquire(blocking=False)
    lock.release()


def test_stop_before_the_start_and_after_a_prompt(registry):
    lock = registry.generation_lock("tiny")
    lock.acquire()
    stop = threading.Event()
    stream = bench_stream(registry, "tiny", "examples", 2, ["autoregressive"], 4, stop)
    try:
        next(stream)
        stop.set()
        assert list(stream)[-1]["error"] == "Stopped before the benchmark started."
    finally:
        lock.release()
    stop = threading.Event()
    snaps = []
    for snap in bench_stream(registry, "tiny", "examples", 3, ["autoregressive", "hispec"], 4, stop):
        snaps.append(snap)
        if snap.get("status", "").startswith("Prompt 1 of 3"):
            stop.set()
    final = snaps[-1]
    assert final["report"]["stopped"] and final["status"] == "Stopped: showing the 1 of 3 prompt(s) done."
    assert len(final["report"]["records"]) == 2


@pytest.mark.parametrize("args, message", [
    (("examples", 0, ["hispec"], 8), "number of prompts must be between 1 and 5"),
    (("examples", 2, [], 8), "pick at least one method of autoregressive"),
    (("examples", 2, ["beam"], 8), "pick at least one method"),
    (("examples", 2, ["hispec"], 65), "max new tokens must be between 1 and 64 for a live benchmark"),
    (("examples", 2, ["hispec"], 2.5), "max new tokens must be a whole number"),
    (("gsm8k", 2, ["hispec"], 8), "unknown prompt set 'gsm8k'; choose from examples, sharegpt"),
])
def test_bad_live_settings_are_messages(registry, args, message):
    snaps = list(bench_stream(registry, "tiny", *args, threading.Event()))
    assert len(snaps) == 1 and message in snaps[0]["error"]


def test_live_run_respects_the_server_limits(registry):
    guard = handlers.Guard(Limits(max_prompt_tokens=20, max_new_tokens=10, rate_per_minute=1))
    snaps = list(bench_stream(registry, "tiny", "examples", 1, ["hispec"], 12, threading.Event(), guard=guard))
    assert "max new tokens must be between 1 and 10" in snaps[-1]["error"]  # the server's own limit
    snaps = list(bench_stream(registry, "tiny", "examples", 1, ["hispec"], 8, threading.Event(), guard=guard))
    assert "over this server's limit of 20" in snaps[-1]["error"]
    guard = handlers.Guard(Limits(rate_per_minute=1))
    tab = BenchTab(registry, guard)
    tab.run_live("tiny", "examples", 1, ["autoregressive"], 4, progress=Recorder())
    status, *_ = tab.run_live("tiny", "examples", 1, ["autoregressive"], 4, progress=Recorder())
    assert "rate limit: at most 1 generations per minute" in status


def test_the_app_has_the_benchmark_tab(registry):
    from app import App

    app = App(registry, "tiny", ["tiny"])
    demo = app.build()
    tabs = [b for b in demo.blocks.values() if isinstance(b, gr.Tab)]
    assert [t.label for t in tabs] == ["Demo", "Benchmark"]
    assert "benchmark" in {fn.api_name for fn in demo.fns.values()}
    # the app's live run goes through its (ZeroGPU-ready) stream, with the app's guard
    status, table, *_ = app.bench.run_live("tiny", "examples", 1, ["autoregressive", "hispec"], 4,
                                           progress=Recorder())
    assert "Done: 1 prompt(s) × 2 method(s)" in status and "<td>hispec</td>" in table
