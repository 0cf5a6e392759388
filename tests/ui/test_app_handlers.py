"""The app's streaming handlers on a tiny model: spans and chart data match the engine's events."""

import html
import re
import threading

import pytest
from helpers import tiny_registry

from hispec.errors import HiSpecError
from hispec.engine.events import TokenEvent
from hispec.evaluation.runner import run
from hispec.text import Detokenizer
from hispec.evaluation.trace import LEGEND
from ui import charts, handlers, render


@pytest.fixture(scope="module")
def registry():
    return tiny_registry()


def spans(fragment: str):
    return [(cls, html.unescape(text)) for cls, text in
            re.findall(r'<span class="hs-tok hs-([a-z-]+)" title="[^"]*"[^>]*>(.*?)</span>', fragment, re.S)]


def test_stream_matches_engine_events(registry):
    lm = registry.get("tiny")
    config = handlers.make_config("HiSpec", 2, 5, 2, 3, 30)
    snaps = list(handlers.generation_stream(registry, "tiny", "hello there", config, True, threading.Event(),
                                            throttle_s=0.0))
    final = snaps[-1]
    assert final["done"] and final["status"].startswith("Done")
    # the same generation straight from the engine
    events = []
    ref = run(lm.ee, lm.encode("hello there"), config.resolve(8), eos_ids=lm.eos_ids,
              detok=Detokenizer(lm.tokenizer), on_event=events.append)
    shown = spans(final["html"])
    tokens = [ev for ev in events if isinstance(ev, TokenEvent)]
    assert len(shown) == len({ev.serial for ev in tokens})
    committed = "".join(t for cls, t in shown if cls in ("accepted", "verify-wrote", "target-wrote"))
    assert committed.replace("</s>", "") == ref.text
    rejected = sum(cls in ("verify-rejected", "target-rejected") for cls, _ in shown)
    assert rejected == sum(ev.state.value.endswith("rejected") for ev in tokens)
    # chart data: one history row per round, the last one agreeing with the final stats
    assert [row["round"] for row in final["history"]] == list(range(1, ref.stats["rounds"] + 1))
    assert final["history"][-1]["draft->verify"] == ref.stats["acceptance"]["draft->verify"]
    assert final["stats"]["acceptance"] == ref.stats["acceptance"]
    fig = charts.acceptance_figure(final["history"])
    assert {trace.name for trace in fig.data} == {"draft → verify", "verify → full model"}
    work = charts.work_figure(final["stats"]["layer_tokens"])
    assert sum(sum(t.y) for t in work.data) == sum(
        v for s in final["stats"]["layer_tokens"]["by_stage"].values() for v in s.values())


def test_charts_name_their_axes_and_say_when_they_have_nothing():
    history = [{"round": 1, "t": 0.5, "new_tokens": 3, "tokens_per_s": 6.0},
               {"round": 2, "t": 1.5, "new_tokens": 4, "tokens_per_s": 4.0 / 1.5}]  # autoregressive: no pairs
    acc = charts.acceptance_figure(history)
    assert not acc.data and "n/a" in acc.layout.annotations[0].text
    speed = charts.speed_figure(history)
    assert [t.name for t in speed.data] == ["since the start", "per round"]
    assert list(speed.data[1].y) == [6.0, 1.0]  # 3 tokens in 0.5 s, then 1 token in 1 s
    for fig in (acc, speed, charts.work_figure({"by_stage": {}})):
        assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text and fig.layout.showlegend


def test_stream_is_incremental(registry):
    config = handlers.make_config("LayerSkip (single exit)", 3, 5, 3, 4, 40)
    snaps = [s for s in handlers.generation_stream(registry, "tiny", "abc", config, False, threading.Event(),
                                                   throttle_s=0.0) if "html" in s]
    assert len(snaps) > 3
    counts = [len(spans(s["html"])) for s in snaps]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert sum(s["charts"] for s in snaps) >= 1 and snaps[-1]["charts"]


@pytest.mark.parametrize("args, message", [
    (("HiSpec", 5, 5, 2, 4, 10), "draft layer 5 must be below verify layer 5"),
    (("HiSpec", 2, 9, 2, 4, 10), "verify layer 9 is impossible"),
])
def test_impossible_layers_are_messages(registry, args, message):
    config = handlers.make_config(*args)
    snaps = list(handlers.generation_stream(registry, "tiny", "hi", config, True, threading.Event()))
    assert len(snaps) == 1 and message in snaps[0]["error"]


@pytest.mark.parametrize("args, message", [
    (("HiSpec", 2, 5, 2, 4, 100000), "max new tokens 100000 is over this app's limit of 512"),
    (("HiSpec", 2, 5, 0, 4, 10), "draft_len must be at least 1"),
    (("HiSpec", 2.5, 5, 2, 4, 10), "draft layer must be a whole number"),
    (("HiSpec", "two", 5, 2, 4, 10), "draft layer must be a whole number"),
    (("Beam search", 2, 5, 2, 4, 10), "unknown method 'Beam search'"),
])
def test_bad_settings(args, message):
    with pytest.raises(HiSpecError, match=re.escape(message)):
        handlers.make_config(*args)


def test_empty_settings_take_the_models_own():
    """None (an API call that leaves a field out) is filled in from the model when it is resolved."""
    config = handlers.make_config("HiSpec", None, None, None, None, 10)
    assert (config.draft_layer, config.verify_layer, config.draft_len, config.verify_threshold) == (None,) * 4
    resolved = config.resolve(8, {"draft": 2, "verify": 5, "draft_len": 1, "verify_threshold": 3})
    assert (resolved.draft_layer, resolved.verify_layer, resolved.draft_len, resolved.verify_threshold) == (2, 5, 1, 3)


@pytest.mark.parametrize("prompt", ["", "   \n", None])
def test_empty_prompt(registry, prompt):
    config = handlers.make_config("HiSpec", 2, 5, 2, 4, 10)
    snaps = list(handlers.generation_stream(registry, "tiny", prompt, config, True, threading.Event()))
    assert snaps == [{"error": "The prompt is empty: type something or pick an example.", "done": True}]


def test_prompt_too_long(registry):
    config = handlers.make_config("HiSpec", 2, 5, 2, 4, 200)
    snaps = list(handlers.generation_stream(registry, "tiny", "x" * 100, config, False, threading.Event()))
    assert "exceeds the model's context of 256 tokens" in snaps[-1]["error"]


def test_waits_for_the_model_and_gives_up_on_stop(registry):
    lock = registry.generation_lock("tiny")
    stop = threading.Event()
    config = handlers.make_config("Autoregressive", 2, 5, 2, 4, 5)
    lock.acquire()
    try:
        stream = handlers.generation_stream(registry, "tiny", "hi", config, True, stop)
        assert "Waiting for another visitor" in next(stream)["status"]
        stop.set()
        assert next(stream)["error"] == "Stopped before the generation started."
    finally:
        lock.release()
    assert not lock.locked()


def test_stop_keeps_what_was_generated(registry):
    stop = threading.Event()
    config = handlers.make_config("HiSpec", 2, 5, 2, 4, 200)
    last = None
    for snap in handlers.generation_stream(registry, "tiny", "hi", config, False, stop, throttle_s=0.0):
        last = snap
        if snap.get("stats", {}).get("new_tokens", 0) >= 5:
            stop.set()
    assert last["done"] and last["stats"]["finish_reason"] == "stopped"
    assert 5 <= last["stats"]["new_tokens"] < 200
    assert not registry.generation_lock("tiny").locked()


def test_an_exception_inside_generation_is_a_message_and_frees_the_model(registry, monkeypatch):
    lm = registry.get("tiny")

    def boom(*a, **k):
        raise RuntimeError("simulated out of memory")

    monkeypatch.setattr(lm.ee, "exit_logits", boom)
    config = handlers.make_config("HiSpec", 2, 5, 2, 4, 10)
    snaps = list(handlers.generation_stream(registry, "tiny", "hi", config, True, threading.Event()))
    assert "Generation failed (RuntimeError: simulated out of memory)" in snaps[-1]["error"]
    assert not registry.generation_lock("tiny").locked()
    monkeypatch.undo()
    ok = list(handlers.generation_stream(registry, "tiny", "hi", config, True, threading.Event()))
    assert ok[-1]["done"] and "error" not in ok[-1]


def test_compare_checks_identical_output(registry):
    config = handlers.make_config("HiSpec", 2, 5, 2, 4, 24)
    snaps = list(handlers.compare_stream(registry, "tiny", "hello", config, True,
                                         ["Autoregressive", "LayerSkip (single exit)"], threading.Event()))
    rows = snaps[-1]["rows"]
    assert [r["method"] for r in rows] == ["hispec", "autoregressive", "layerskip"]
    assert rows[0]["token_ids"] == rows[1]["token_ids"] == rows[2]["token_ids"]
    table = render.compare_table(rows)
    assert table.count("✓ same tokens") == 3 and "DIFFERENT" not in table
    assert all(r["dtype"] == "float32" for r in rows)
    rows[2] = dict(rows[2], token_ids=rows[2]["token_ids"][:-1] + [0])
    assert f"✗ DIFFERENT from token {len(rows[2]['token_ids'])}</td>" in render.compare_table(rows)
    rows[2]["dtype"] = "bfloat16"  # on a GPU: near-ties may round differently, and the table says so
    assert "bfloat16: passes over different numbers of tokens can round a near-tie" in render.compare_table(rows)


def test_model_text_is_escaped_in_spans():
    from hispec.evaluation.trace import Trace

    trace = Trace()
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)">\x1b[31m'
    trace.add(TokenEvent(__import__("hispec.engine.events", fromlist=["TokenState"]).TokenState.TARGET_WROTE,
                         0, 0, 5, evil, "target", "target", 1, 0.0))
    out = render.tokens_html(trace)
    assert "<script>" not in out and "<img" not in out and "\x1b" not in out
    assert "&lt;script&gt;" in out and "\\x1b[31m" in out


def test_legend_names_every_colour():
    out = render.legend_html()
    for cls, label, meaning in LEGEND:
        assert f"hs-{cls}" in out and html.escape(label) in out


def test_policy_and_prompt_lookup_in_the_app():
    config = handlers.make_config("Lookup (copies earlier text)", 2, 5, 2, 4, 10, policy_label="Adaptive (auto)")
    assert (config.method, config.policy) == ("lookup", "auto")
    assert handlers.make_config("HiSpec", 2, 5, 2, 4, 10).policy == "fixed"
    with pytest.raises(HiSpecError, match="unknown policy 'Greedy'; choose from Adaptive"):
        handlers.make_config("HiSpec", 2, 5, 2, 4, 10, policy_label="Greedy")
