"""The page's generation on a tiny model, from the visitor's values to the components: spans and
chart data match the engine's events; bad values are messages; the run ends as it should."""

import html
import re
import threading

import pytest
from helpers import tiny_server

from hispec.engine.config import DecodeConfig, Preset, preset
from hispec.engine.events import TokenEvent
from hispec.engine.planning.policy import DEFAULT_POLICY
from hispec.errors import HiSpecError
from hispec.runs.runner import run
from hispec.runs.trace import LEGEND
from hispec.serving.api import GenerateRequest
from hispec.serving.caller import LOCAL
from hispec.serving.jobs import Job
from hispec.serving.limits import Limits
from hispec.text import Detokenizer
from ui import charts, labels, render
from ui.panels.compare import Compare
from ui.panels.generate import Generate
from ui.settings import PageSettings
from ui.generate_view import GenerateView

HISPEC = ("HiSpec", 2, 5, 2, 3)


@pytest.fixture(scope="module")
def server():
    return tiny_server()


def spans(fragment: str):
    return [(cls, html.unescape(text)) for cls, text in
            re.findall(r'<span class="hs-tok hs-([a-z-]+)" title="[^"]*"[^>]*>(.*?)</span>', fragment, re.S)]


def page_run(server, prompt="hello there", settings=HISPEC, max_new=30, chat=True, policy=labels.FIXED, **kw):
    """The page's generate handler: every output tuple it yields, and the view it folded."""
    raw = PageSettings(prompt, "tiny", *settings, max_new, chat, policy=policy, **kw).request()
    view = GenerateView("tiny")
    outs = [view.update(u) for u in server.submit(LOCAL, GenerateRequest, raw)]
    return outs, view


def test_the_page_matches_the_engines_events(server):
    lm = server.registry.get("tiny")
    outs, view = page_run(server)
    last = outs[-1]
    status, tokens_html, final_text, stats_html, kept = (last[k] for k in ("status", "tokens", "final", "stats",
                                                                           "last_run"))
    assert "Done" in status and kept is not None
    # the status names what ended it in the stats' words (not the engine's "eos" / "max_new_tokens")
    assert "Done: stopped by the token limit." in status or "Done: stopped by end of text." in status, status
    events = []
    config = preset("hispec", 2, 5, 2, 3, 30, policy="fixed").resolve(8)
    ref = run(lm.ee, lm.encode("hello there"), config, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer),
              on_event=events.append)
    shown = spans(tokens_html)
    tokens = [ev for ev in events if isinstance(ev, TokenEvent)]
    assert len(shown) == len({ev.serial for ev in tokens})
    committed = "".join(t for cls, t in shown if cls in ("accepted", "verify-wrote", "target-wrote"))
    assert committed.replace("</s>", "") == ref.text == final_text
    rejected = sum(cls in ("verify-rejected", "target-rejected") for cls, _ in shown)
    assert rejected == sum(ev.state.value.endswith("rejected") for ev in tokens)
    # chart data: one history row per round, the last one agreeing with the final stats
    history = view.run.stats.history
    assert [row["round"] for row in history] == list(range(1, ref.stats["rounds"] + 1))
    assert history[-1]["draft->verify"] == ref.stats["acceptance"]["draft->verify"]
    assert kept.stats["acceptance"] == ref.stats["acceptance"]
    assert list(kept.token_ids) == ref.token_ids and list(kept.prompt_ids) == lm.encode("hello there")
    fig = charts.acceptance_figure(history)
    assert {trace.name for trace in fig.data} == {"draft → verify", "verify → full model"}
    work = charts.work_figure(kept.stats["layer_tokens"])
    assert sum(sum(t.y) for t in work.data) == sum(
        v for s in kept.stats["layer_tokens"]["by_stage"].values() for v in s.values())


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


def test_the_acceptance_chart_names_each_pair_as_the_stats_do():
    """Seen on the page: the default run's chart drew 'verify → full model' only, where the verifier was the
    4-bit full model, and left out its lookup pair."""
    from hispec.serving.answer import Generation

    history = [{"round": 1, "t": 0.1, "new_tokens": 2, "tokens_per_s": 20.0, "lookup->verify": 0.5,
                "verify->target": 1.0},
               {"round": 2, "t": 0.2, "new_tokens": 5, "tokens_per_s": 25.0, "lookup->verify": 0.4,
                "verify->target": 0.98}]
    names = [t.name for t in charts.acceptance_figure(history, ("lookup", "full@q4")).data]
    assert names == ["lookup → 4-bit full model", "4-bit full model → full model"]
    assert [t.name for t in charts.acceptance_figure(history, ("lookup", 2, 4)).data] == [
        "lookup → exit 4", "exit 4 → full model"], "exits are named by their layer, like every level"
    # the live view knows the list from the request's first update, before any round
    live = Generation()
    live.add([{"prompt_ids": [1, 2], "levels": ["lookup", "full@q4"]}])
    assert live.run.levels == ("lookup", "full@q4") and live.run.trace.cheap_roles == {"verify"}


def test_the_text_grows_as_the_run_streams(server):
    outs, _ = page_run(server, "abc", ("LayerSkip (single exit)", 3, 5, 3, 4), 40, chat=False)
    counts = [len(spans(o["tokens"])) for o in outs if "tokens" in o]
    assert len(counts) > 3 and counts == sorted(counts) and counts[0] < counts[-1]


@pytest.mark.parametrize("settings, message", [
    (("HiSpec", 5, 5, 2, 4), "Draft layer 5 must be below verify layer 5"),  # capitalised on the page
    (("HiSpec", 2, 9, 2, 4), "Verify layer 9 is impossible"),
])
def test_impossible_layers_are_messages(server, settings, message):
    outs, _ = page_run(server, "hi", settings, 10)
    assert message in outs[-1]["status"] and "hs-msg-error" in outs[-1]["status"]
    assert outs[-1]["last_run"] is None, "no run is kept"


@pytest.mark.parametrize("values, message", [
    (dict(max_new_tokens=100000), "max new tokens 100000 is over this app's limit of 512"),
    (dict(draft_len=0), "draft_len must be from 1 to 64 (got 0)"),
    (dict(draft_layer=2.5), "draft layer must be a whole number (got 2.5)"),
    (dict(draft_layer="two"), "draft layer must be a whole number (got 'two')"),
    (dict(method="Beam search"), "unknown method 'Beam search'; choose from"),
    (dict(policy="Greedy"), "unknown policy 'Greedy'; choose from"),
])
def test_bad_settings(values, message):
    raw = PageSettings("hi", "tiny", *HISPEC, 10, True).request()
    raw.update({k: labels.method_name(v) if k == "method" else v for k, v in values.items()})
    with pytest.raises(HiSpecError, match=re.escape(message)):
        GenerateRequest.parse(raw, Limits())


def test_empty_settings_take_the_models_own():
    """None (an API call that leaves a field out) is filled in from the model when it is resolved."""
    request = GenerateRequest.parse({"prompt": "hi", "max_new_tokens": 10, "policy": "fixed"}, Limits())
    config = request.decode_config()
    assert config.preset == Preset("hispec") and config.lengths is None
    resolved = config.resolve(8, {"draft": 2, "verify": 5, "draft_len": 1, "verify_threshold": 3})
    assert (resolved.preset.draft_layer, resolved.preset.verify_layer, *resolved.lengths) == (2, 5, 1, 3)


@pytest.mark.parametrize("prompt", ["", "   \n"])
def test_empty_prompt(server, prompt):
    outs, _ = page_run(server, prompt)
    assert "The prompt is empty: type something or pick an example." in outs[-1]["status"]


def test_prompt_too_long_for_the_model(server):
    outs, _ = page_run(server, "x" * 100, max_new=200, chat=False)
    assert "exceeds the model's context of 256 tokens" in html.unescape(outs[-1]["status"])


def test_stop_keeps_what_was_generated_and_says_how_much(server):
    """A Stop made after 5 tokens ends the run with what it kept. The engine runs in serving's worker
    thread, ahead of this reader: unslowed, a busy machine can let the tiny model write all 200 tokens
    before the reader sees 5 (the likely cause of one failure seen in a full run of this file), so every
    full pass here sleeps a little."""
    import time

    lm = server.registry.get("tiny")
    original = lm.ee.run_layers

    def slowed(hidden, start, end, cache):
        if end == lm.ee.num_layers and start < end:
            time.sleep(0.01)
        return original(hidden, start, end, cache)

    raw = PageSettings("hi", "tiny", *HISPEC, 200, False, policy=labels.FIXED).request()
    view, out = GenerateView("tiny"), None
    caller = LOCAL
    lm.ee.run_layers = slowed
    try:
        for update in server.submit(caller, GenerateRequest, raw):
            out = view.update(update)
            if view.run.stats.new_tokens >= 5:
                server.stop(caller)
    finally:
        del lm.ee.run_layers
    kept = out["last_run"]
    assert kept.stats["finish_reason"] == "stopped"
    n = kept.stats["new_tokens"]
    assert 5 <= n < 200
    assert f"Stopped after {n} tokens." in out.get("status", "")
    assert not server.registry.turns("tiny").busy


def test_a_stop_while_waiting_says_so(server):
    turns = server.registry.turns("tiny")
    holder = Job(0, "another-visitor", "generate")
    assert turns.hold(holder, 1.0)
    try:
        outs = []
        for out in Generate(server).generate(PageSettings("hi", "tiny", *HISPEC, 5, True, policy=labels.FIXED)):
            outs.append(out)
            if "Waiting" in out.get("status", ""):
                server.stop(LOCAL)
    finally:
        turns.release(holder)
    assert "Stopped before the generation started." in outs[-1]["status"]


def test_an_exception_inside_generation_is_a_message_and_frees_the_model(server, monkeypatch):
    lm = server.registry.get("tiny")

    def boom(*a, **k):
        raise RuntimeError("simulated out of memory")

    monkeypatch.setattr(lm.ee, "exit_logits", boom)
    outs, _ = page_run(server, "hi", max_new=10)
    assert "The generation failed (RuntimeError: simulated out of memory)" in outs[-1]["status"]
    assert not server.registry.turns("tiny").busy
    monkeypatch.undo()
    outs, _ = page_run(server, "hi", max_new=10)
    assert "Done" in outs[-1]["status"] and outs[-1]["last_run"] is not None


def test_compare_checks_identical_output(server):
    settings = PageSettings("hello", "tiny", *HISPEC, 24, True, 0.0, 0, 1.0, -1, labels.FIXED)
    outs = list(Compare(server).compare(settings, ["Autoregressive", "LayerSkip (single exit)"], 1))
    table = outs[-1]["compare_out"]
    rows = re.findall(r"<tr><td>(HiSpec, fixed|Autoregressive|LayerSkip \(single exit\))</td>", table)
    assert rows == ["HiSpec, fixed", "Autoregressive", "LayerSkip (single exit)"], table  # the page's names
    assert table.count("✓ same tokens") == 3 and "DIFFERENT" not in table
    assert "Comparison done" in outs[-1]["status"] and "Comparison done" in outs[-1]["compare_status"], \
        "the top status says it too"
    assert any("Compare: Running HiSpec, fixed…" in o.get("status", "") for o in outs), "progress at the top"
    assert "fixed rounds, 2 drafts per round, the full model at 3 tentative" in table and "the reference" in table


def test_a_difference_and_half_precision_are_named():
    rows = [{"method": "autoregressive", "token_ids": [1, 2, 3], "tokens_per_s": 10.0, "new_tokens": 3,
             "dtype": "float32"},
            {"method": "hispec", "token_ids": [1, 2, 4], "tokens_per_s": 12.0, "new_tokens": 3, "dtype": "float32"}]
    assert "✗ DIFFERENT from token 3" in render.compare_table(rows)
    rows[1]["dtype"] = "bfloat16"  # on a GPU: near-ties may round differently, and the table says so
    assert "bfloat16: passes over different numbers of tokens can round a near-tie" in render.compare_table(rows)


def test_model_text_is_escaped_in_spans():
    from hispec.engine.events import TokenState
    from hispec.runs.trace import Trace

    trace = Trace()
    evil = '<script>alert(1)</script><img src=x onerror="alert(2)">\x1b[31m'
    trace.add(TokenEvent(TokenState.TARGET_WROTE, 0, 0, 5, evil, "target", "target", 1, 0.0))
    out = render.tokens_html(trace)
    assert "<script>" not in out and "<img" not in out and "\x1b" not in out
    assert "&lt;script&gt;" in out and "\\x1b[31m" in out


def test_legend_names_every_colour():
    out = render.legend_html()
    for cls, label, meaning in LEGEND:
        assert f"hs-{cls}" in out and html.escape(label) in out


def test_policy_labels_and_one_default():
    assert labels.policy_name(labels.DEFAULT_POLICY_LABEL) == DEFAULT_POLICY
    assert labels.method_name("Lookup (copies earlier text)") == "lookup"
    raw = PageSettings("hi", "tiny", "Lookup (copies earlier text)", 2, 5, 2, 4, 10, True, policy=labels.ADAPTIVE).request()
    request = GenerateRequest.parse(raw, Limits())
    assert (request.method, request.policy) == ("lookup", "auto")


def test_stop_with_nothing_running_says_so(server):
    assert "Nothing to stop" in Generate(server).stop(None)


def test_threads_are_not_left_behind(server):
    before = threading.active_count()
    page_run(server, "hi", max_new=5)
    assert threading.active_count() <= before + 1


def test_the_engine_the_cli_the_page_and_the_api_share_one_default_policy(server):
    """One default policy: DecodeConfig's, the CLI's, the page's Policy radio and /generate's input."""
    import gradio as gr

    import app
    from hispec.cli.parsers import build_parser
    from hispec.serving.api import api_signature

    engine = DecodeConfig().policy
    cli = build_parser().parse_args(["generate", "--prompt", "hi"]).policy
    demo = app.build(server, ["tiny"])
    radio = next(b for b in demo.blocks.values() if isinstance(b, gr.Radio) and b.elem_id == "hs-policy")
    page = labels.policy_name(radio.value)
    api = api_signature().parameters["policy"].default
    assert engine == cli == page == api == GenerateRequest.policy == DEFAULT_POLICY, (engine, cli, page, api)


def test_the_default_run_measures_enough_pairs_to_give_a_range(server):
    """The page's pairs slider starts at the fewest pairs whose ratio gets a range (pairs.MIN_PAIRS)."""
    import gradio as gr

    import app
    from hispec.evaluation import pairs

    demo = app.build(server, ["tiny"])
    slider = next(b for b in demo.blocks.values() if isinstance(b, gr.Slider) and b.elem_id == "hs-baseline")
    assert slider.value == pairs.MIN_PAIRS == 3
    assert pairs.summary([1.2])["verdict"].startswith("not enough to tell")
    assert pairs.summary([1.5, 1.6, 1.55])["verdict"] == "55% faster"


def test_the_status_says_done_once_at_the_very_end_when_plain_pairs_follow(server):
    """With pairs against plain decoding, "Done" appears once, after the pairs, not when the tokens are in."""
    h = Generate(server)
    # baseline as the page's slider sends it (a float)
    settings = PageSettings("hello there", "tiny", *HISPEC, 12, True, policy=labels.FIXED, baseline=1.0)
    statuses = [out["status"] for out in h.generate(settings) if "status" in out]
    done = [i for i, s in enumerate(statuses) if "Done" in s]
    assert done == [len(statuses) - 1], statuses
    assert any("timing plain decoding" in s for s in statuses), statuses


def test_a_paste_over_the_limit_is_a_message_not_cut_silently(server):
    """The prompt box has no max_length (the browser would cut a long paste without a word); the run names
    the length and the limit instead (issue 49: a 30,000-character paste was cut to 8,192)."""
    import app

    limit = server.limits.max_prompt_chars
    prompt = next(b for b in app.build(server, ["tiny"]).blocks.values() if getattr(b, "elem_id", "") == "hs-prompt")
    assert prompt.max_length is None and f"{limit:,} characters" in prompt.placeholder
    outs, _ = page_run(server, "x" * (limit + 1))
    assert (f"The prompt is {limit + 1:,} characters, over this server's limit of {limit:,}; shorten it"
            in html.unescape(outs[-1]["status"]))


def test_a_served_runs_stats_name_its_method(server):
    """stats.method was empty in /generate's answer and the page's kept run (issue 49)."""
    outs, view = page_run(server, "hi", max_new=6)
    assert outs[-1]["last_run"].stats["method"] == "hispec" == view.run.summary()["method"]
