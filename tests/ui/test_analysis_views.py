"""The views after a run: what-if runs (labelled timing-only, with a plain baseline), Compare's
repeats, each token's story, the exit warning and the published points."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest
from helpers import sketch_record, tiny_server

from hispec.engine.config import preset
from hispec.engine.events import DoneEvent, TokenEvent
from hispec.engine.events import TokenState as S
from hispec.evaluation import published
from hispec.runs import runner
from hispec.explain import what_if as what_ifs
from hispec.explain.beliefs import exit_beliefs
from hispec.runs.record import RecordedSettings, from_json
from hispec.runs.runner import run
from hispec.runs.trace import Trace
from hispec.serving.api import CompareRequest, WhatIfRequest
from hispec.serving.caller import LOCAL
from hispec.serving.updates import Output
from ui import controls, labels, render, token_story
from ui.panels.generate import Generate
from ui.panels.model import Model
from ui.panels.what_if import WhatIf
from ui.panels.why import Why
from ui.settings import PageSettings
from ui.model_view import settings_by_method


@pytest.fixture(scope="module")
def server():
    return tiny_server()


def plain(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


# ---- what if: timing-only verdicts, measured against a plain run --------------------------------
def what_if(server, settings=("HiSpec", 2, 4, 2, 4), max_new=30, rates=(1.0, 1.0), takes=1):
    """The what-if after a fixed run of these settings (its own levels, policy and lengths replayed)."""
    panel = WhatIf(server, Why(server))
    method, d, v, k, t = settings
    levels = () if method == "Autoregressive" else (d,) if v is None else (d, v)
    run = sketch_record(levels, "fixed", (k, t))
    return list(panel.what_if(PageSettings("hello", "tiny", *settings, max_new, True), run, *rates, takes))


def test_what_if_runs_are_labelled_and_measured_against_plain_decoding(server):
    lm = server.registry.get("tiny")
    raw = {"generate": PageSettings("hello", "tiny", "HiSpec", 2, 4, 2, 4, 30, True).request(), "a_dv": 1.0, "a_vt": 1.0,
           "takes": 1}
    items = [i for u in server.submit(LOCAL, WhatIfRequest, raw) if isinstance(u, Output) for i in u.items]
    plain_run = next(i for i in items if isinstance(i, what_ifs.PlainTimed))
    assert plain_run.new_tokens == 30 and plain_run.tokens_per_s > 0, "the whole budget, end-of-text ignored"
    done = next(i for i in items if isinstance(i, DoneEvent))
    assert "timing only" in done.settings["timing_only"] and "not the model's" in done.settings["timing_only"]
    assert len(done.token_ids) == 30, "the synthetic run is as long as the plain one"
    take = next(i for i in items if isinstance(i, what_ifs.TakeDone))
    assert take.new_tokens == 30 and take.ratio > 0
    plain_config = runner.plain_config(preset("hispec", 2, 4, 2, 4, 30, policy="fixed")).resolve_for(lm.ee)
    assert plain_config.levels == (), "the baseline is plain decoding: no exit drafts in it"
    outs = what_if(server)
    last = outs[-1]
    status, tokens, stats, plot, result = (last[f"what_if_{name}"] for name in ("status", "tokens", "stats", "plot",
                                                                                  "result"))
    assert result["rates"] == (1.0, 1.0) and result["takes"] == 1 and result["median"] > 0
    assert "1 of 1 takes done" in plain(status) and plot.visible
    rows = re.findall(r"<tr><td>(.*?)</td>", stats)
    assert rows and all(r.startswith(render.SYNTHETIC) or "real" in r for r in rows), rows
    assert "speed vs plain" in stats
    # every verdict accepts: the random model's exits never agree with its full model, yet nothing is rejected
    # named by what the levels are (issue 56): the run's exits 2 and 4
    assert "acceptance exit 2 → exit 4</td><td>100%" in stats and "acceptance exit 4 → full model</td><td>100%" in stats
    assert "SYNTHETIC" in tokens


def test_what_if_at_zero_acceptance_rejects_every_draft(server):
    outs = what_if(server, ("LayerSkip (single exit)", 2, None, 3, 4), 12, (0.0, 0.0))
    stats = outs[-1]["what_if_stats"]
    assert "acceptance exit 2 → full model</td><td>0%" in stats
    assert "new tokens</td><td>12<" in stats


def test_what_if_takes_repeat_plain_then_synthetic_and_give_a_median(server):
    outs = what_if(server, max_new=12, rates=(0.9, 0.9), takes=3)
    statuses = [plain(o["what_if_status"]) for o in outs if "what_if_status" in o]
    assert any("Take 1 of 3: timing plain decoding" in st for st in statuses)
    assert any("Take 3 of 3: timing plain decoding" in st for st in statuses)
    assert "3 of 3 takes done, median" in statuses[-1] and "synthetic" in statuses[-1]
    stats = plain(outs[-1]["what_if_stats"])
    assert "median of 3 of 3 takes" in stats and "(this take)" in stats
    each = re.search(r"each take, synthetic / real plain tokens / s \(tokens\)(.*?)SYNTHETIC", stats).group(1)
    assert len(re.findall(r"[\d.]+ / [\d.]+ \(12\)", each)) == 3, each
    one = plain(what_if(server, max_new=12, rates=(0.9, 0.9), takes=1)[-1]["what_if_stats"])
    assert "median of" not in one and "(this take)" not in one and "more takes give a median" in one
    assert "Takes must be from 1 to 5 (got 0)" in plain(what_if(server, takes=0)[-1]["what_if_status"])
    assert "drafted nothing" in plain(what_if(server, ("Autoregressive", 2, 4, 2, 4))[-1]["what_if_status"])


def test_why_puts_the_what_ifs_gap_in_numbers(server):
    """A what-if's result keeps its time split and plain rate; "Why this speed" at the same sliders
    shows them, its ratio step by step, and calls what is left unexplained."""
    generate, why = Generate(server).generate, Why(server).why
    settings = PageSettings("hello", "tiny", "HiSpec", 2, 4, 2, 4, 12, True, policy=labels.FIXED, baseline=0)
    run = list(generate(settings))[-1]["last_run"]
    result = what_if(server, max_new=12, rates=(0.9, 0.9), takes=2)[-1]["what_if_result"]
    assert result["takes"] == 2 and result["plain_tokens_per_s"] > 0
    assert set(result["synthetic_split"]) == {"wall_s", "setup_s", "prefill_s", "passes_s", "other_s"}
    view, _ = why(run, 0.9, 0.9, result)
    words = plain(view)
    assert "Where the what-if's time went" in words and "plain decoding ran at" in words, words
    assert re.search(r"whole runs [\d.]+×, decoding only \(set-up and prefill left out\) [\d.]+×, layer passes only", words)
    assert "Unexplained: " in words, words


def test_a_real_run_keeps_its_trace_and_prompt(server):
    lm = server.registry.get("tiny")
    generate, why = Generate(server).generate, Why(server).why
    outs = list(generate(PageSettings("hello", "tiny", "HiSpec", 2, 4, 2, 4, 16, True, policy=labels.FIXED, baseline=0)))
    kept = outs[-1]["last_run"]
    assert list(kept.prompt_ids) == lm.encode("hello", chat=True)
    assert isinstance(kept.events[-1], DoneEvent) and len(kept.token_ids) == 16
    assert "timing_only" not in kept.settings and kept.vs_plain is None
    trace = Trace()
    for ev in kept.events:
        trace.add(ev)
    assert render.tokens_html(trace, kept.spec) == outs[-1]["tokens"]


# ---- Compare: repeats, their spread and their order ----------------------------------------------
def compare_rows(server, settings=("HiSpec", 2, 5, 2, 4), baselines=("autoregressive",), repeats=3):
    raw = {"generate": PageSettings("hello", "tiny", *settings, 12, True, policy=labels.FIXED).request(),
           "baselines": list(baselines), "repeats": repeats}
    return next(i for u in server.submit(LOCAL, CompareRequest, raw) if isinstance(u, Output) for i in u.items)


def test_compare_repeats_each_method_in_alternating_order(server):
    final = compare_rows(server)
    assert final["order"] == ["hispec", "autoregressive", "autoregressive", "hispec", "hispec", "autoregressive"]
    rows = {r["method"]: r for r in final["rows"]}
    assert all(len(r["runs"]) == 3 for r in rows.values())
    assert all(r["tokens_per_s"] == sorted(r["runs"])[1] for r in rows.values()), "the median of the runs"
    assert rows["hispec"]["full_passes"] > 0
    assert rows["hispec"]["vs_plain"]["runs"] == 3 and rows["autoregressive"]["vs_plain"] is None
    assert rows["hispec"]["ran"] == "exit 2 → exit 5 → full model; fixed rounds, 2 drafts per round, the full model at 4 tentative"
    table = render.compare_table(final["rows"], order=final["order"])
    assert "Run order: HiSpec, fixed → Autoregressive → Autoregressive → HiSpec, fixed → HiSpec, fixed → Autoregressive" in plain(table)
    assert table.count("3 runs)") == 2
    assert "exit 2 → exit 5" in table and "->" not in table  # its pairs by their levels (evaluation.compare)


def test_compares_layerskip_baseline_is_the_benchmarks_single_exit(server):
    """The chosen method keeps its layers; LayerSkip as a baseline runs at the model's own exit."""
    from hispec.evaluation.bench import bench_exit

    final = compare_rows(server, ("HiSpec", 3, 5, 2, 4), ("layerskip",), 1)
    rows = {r["method"]: r for r in final["rows"]}
    assert tuple(rows["hispec"]["settings"]["levels"]) == (3, 5)  # the fixed policy: no lookup below
    assert tuple(rows["layerskip"]["settings"]["levels"]) == (bench_exit(server.registry.get("tiny")),) != (3,)


def test_picking_a_method_sets_its_own_settings_for_the_model(server):
    from hispec.evaluation.bench import bench_exit

    lm = server.registry.get("tiny")
    by_method = settings_by_method(lm)
    assert by_method["layerskip"][0] == bench_exit(lm)
    assert controls.method_defaults("LayerSkip (single exit)", by_method)[0] == by_method["layerskip"][0]
    assert controls.method_defaults("HiSpec", by_method)[:2] == tuple(by_method["hispec"][:2])
    assert all(v is not None for v in controls.method_defaults("HiSpec", by_method))


def test_loading_a_model_sets_the_levels_box_to_a_list_it_can_run(server):
    """The page starts on the 4-bit precision list of the default model; a model loaded after it that has
    no 4-bit copy (any other) gets its own list, not a run that fails on full@q4."""
    *_, last = Model(server).load("tiny")
    assert len(last) == 10 and last["status"].count("Loaded tiny") == 1
    assert last["levels"] == labels.default_levels(server.registry.get("tiny").ee.formats()) == next(iter(labels.LEVELS))
    assert labels.default_levels(("q4",)) == "lookup → 4-bit full model → full (precision level)"


# ---- each token's story -------------------------------------------------------------------------
def story_of(server, settings=("hispec", 2, 4, 2, 4), temperature=0.0):
    lm = server.registry.get("tiny")
    method, d, v, n_d, n_i = settings
    config = preset(method, d, v, n_d, n_i, 20, temperature=temperature, seed=1 if temperature else None,
                          policy="fixed").resolve(8)
    ids = lm.encode("hello", chat=True)
    r = run(lm.ee, ids, config, eos_ids=lm.eos_ids)
    beliefs = exit_beliefs(lm.ee, ids, r.token_ids, layers=[2, 4], tokenizer=lm.tokenizer)
    return r, beliefs, token_story.explain_all_html(r.trace, beliefs, RecordedSettings.read(r.settings))


def block_of(out: str, serial: int) -> str:
    match = re.search(rf"<div class='hs-explain' data-s='{serial}' data-i='\d+' hidden>(.*?)</div>", out, re.S)
    assert match, f"no story for token {serial}"
    return plain(match.group(1))


def predictions_at(out: str, index: int) -> str:
    match = re.search(rf"<div class='hs-explain-at' data-i='{index}' hidden>(.*?)</div>", out, re.S)
    assert match, f"no predictions at position {index}"
    return plain(match.group(1))


def test_every_token_has_a_story_naming_who_proposed_and_who_judged_it(server):
    r, beliefs, out = story_of(server)
    tokens = list(r.trace)
    assert out.count("class='hs-explain'") == len(tokens)
    rejected = [t for t in tokens if t.state is S.VERIFY_REJECTED]
    assert rejected, "the random model's exits disagree: some drafts are rejected at exit 4"
    story = block_of(out, rejected[0].serial)
    assert "Proposed by the draft exit (layer 2)" in story
    assert "rejected by the intermediate verifier (exit 4)" in story
    winner = next(t for t in tokens if t.index == rejected[0].index and not t.rejected)
    assert f"Replaced by {winner.text}" in story
    # what each exit predicted there: rows for exit 2, exit 4 and the full model, each with candidates,
    # once per position (shared by every token proposed there)
    assert f"data-s='{rejected[0].serial}' data-i='{rejected[0].index}'" in out
    at = predictions_at(out, rejected[0].index)
    assert "exit 2 · raw" in at and "exit 4 · raw" in at and "full model (8 layers)" in at
    assert out.count("class='hs-explain-at'") == len({t.index for t in tokens})
    full = beliefs["tokens"][rejected[0].index]["cells"][-1]["top"][0]
    assert full[0] == r.token_ids[rejected[0].index], "the full model's first choice is the kept token"
    # a draft after its block's first rejection fell with it, and its story says so
    fell = [t for t in rejected if any(o.index < t.index and o.round == t.round for o in rejected)]
    assert fell, "draft_len 2: the second draft of a block falls with the first"
    assert "fell with it" in block_of(out, fell[0].serial)
    assert "fell with it" not in story
    written = next(t for t in tokens if t.css_class == "target-wrote")
    assert "written by the full model itself" in block_of(out, written.serial)


def test_a_sampled_runs_story_gives_each_judges_chance_of_keeping_a_draft(server):
    r, beliefs, out = story_of(server, ("layerskip", 2, None, 2, 4), temperature=1.0)
    drafts = [t for t in r.trace if t.origin == "draft"]
    assert drafts
    stories = [block_of(out, t.serial) for t in drafts]
    assert any("the full model: min(1," in s for s in stories), stories[:2]


def test_story_text_is_escaped():
    trace = Trace()
    evil = "<script>alert(1)</script>"
    trace.add(TokenEvent(S.TARGET_WROTE, 0, 0, 5, evil, "target", "target", 1, 0.0))
    out = token_story.explain_all_html(trace, None, RecordedSettings.read({"levels": (2, 4), "num_layers": 8}))
    assert "<script>" not in out and "&lt;script&gt;" in out
    assert "once the run has finished" in plain(out)


# ---- controls and sources ------------------------------------------------------------------------
def test_an_exit_without_a_trained_head_is_warned_about():
    out = controls.depth(30, 3, 5, "HiSpec", [2, 4, 6, 12])
    assert "hs-msg-warn" in out and "Exits 3 and 5 have no trained head" in plain(out)
    assert "Exit 5 has no trained head" in plain(controls.depth(30, 2, 5, "HiSpec", [2, 4, 6, 12]))
    assert "Trained exits: 2, 4, 6, 12" in plain(out)
    assert "hs-msg-warn" not in controls.depth(30, 2, 4, "HiSpec", [2, 4, 6, 12])
    assert "hs-msg-warn" not in controls.depth(30, 3, 5, "HiSpec", [])  # raw exits everywhere: nothing to compare
    assert "hs-msg-warn" not in controls.depth(30, 3, 5, "Autoregressive", [2, 4])


def test_a_list_in_the_levels_box_decides_the_exits_and_the_sliders_step_aside():
    """The page ran lookup -> full@q4 while its d and v sliders (and the depth strip) still showed exits 2
    and 4: a list in the Levels box hides the exit sliders, and the strip names the list instead."""
    own, precision = next(iter(labels.LEVELS)), "lookup → 4-bit full model → full (precision level)"
    assert labels.levels_name(precision) == "lookup,full@q4"
    d, v, n_d, n_i = controls.shown_for("HiSpec", precision)
    assert (d["visible"], v["visible"], n_d["visible"], n_i["visible"]) == (False, False, True, True)
    d, v, _, _ = controls.shown_for("HiSpec", own)
    assert d["visible"] and v["visible"]
    d, v, _, _ = controls.shown_for("LayerSkip (single exit)", precision)  # levels are HiSpec's: E stays
    assert d["visible"] and d["label"] == "Exit layer E" and not v["visible"]
    assert controls.shown_for("HiSpec", "lookup,2,banana") == controls.shown_for("HiSpec", own)  # its run says why
    # the lengths are a fixed round's: under the adaptive policy (which plans them) their sliders step aside
    d, v, n_d, n_i = controls.shown_for("HiSpec", own, labels.ADAPTIVE)
    assert (d["visible"], v["visible"], n_d["visible"], n_i["visible"]) == (True, True, False, False)
    _, _, n_d, n_i = controls.shown_for("LayerSkip (single exit)", own, labels.FIXED)
    assert n_d["visible"] and not n_i["visible"]
    strip = plain(controls.depth(30, 2, 4, "HiSpec", [2, 4], precision))
    assert "Levels: lookup → the 4-bit full model → full model (the 4-bit full model runs every layer" in strip
    assert "draft exit after layer" not in strip
    # its key names only the colours on the strip: the 4-bit model's row (every layer), the full model's
    assert strip.endswith("30 layers 4-bit full model (every layer)full model"), strip
    assert controls.depth(30, 2, 4, "HiSpec", [2, 4], precision).count("hs-stage-precision") == 30 + 1
    assert plain(controls.depth(30, 2, 4, "HiSpec", [2, 4])).endswith("layers draft exitintermediate exitfull model")
    assert plain(controls.depth(30, 2, 4, "Autoregressive", [2, 4])).endswith("layers full model")
    mixed = controls.depth(30, 2, 4, "HiSpec", [2, 4], "lookup,3@q4,full@q4")
    assert "hs-stage-draft" in mixed.split("hs-layers")[2] and "hs-stage-precision" in mixed.split("hs-layers")[1]
    typed = controls.depth(30, 2, 4, "HiSpec", [2, 4, 6], "lookup,2,5")
    assert "Levels: lookup → exit 2 → exit 5 → full model" in plain(typed) and "Exit 5 has no trained head" in plain(typed)
    assert "draft exit after layer 2" in plain(controls.depth(30, 2, 4, "HiSpec", [2, 4], own))
    assert not controls.levels_box_for("LayerSkip (single exit)")["visible"] and controls.levels_box_for("HiSpec")["visible"]


def test_published_points_carry_sources_and_convert_to_per_token_acceptance(tmp_path):
    assert published.per_token(published.accepted_share(0.9, 12), 12) == pytest.approx(0.9, abs=1e-9)
    assert published.per_token(0.5, 1) == pytest.approx(0.5)
    points = published.load(Path(__file__).resolve().parents[2] / "assets" / "published_points.json")
    assert points and all(p["source"] and p["url"].startswith("https://") for p in points)
    assert all(p["x"] >= p["acceptance"] for p in points), "blocks lose their tails: per token is higher"
    (tmp_path / "p.json").write_text('{"points": [{"label": "x", "acceptance": null, "speedup": 2.0, '
                                     '"drafts": 4, "source": "s"}]}')
    assert published.load(tmp_path / "p.json") == [], "a point without an acceptance cannot be plotted"
    with pytest.raises(ValueError):
        published.per_token(1.5, 4)
    out = render.published_html(points)
    assert out.count("<li>") == len(points) and "arxiv.org" in out


def test_why_tells_an_adaptive_run_plan_by_plan_against_measured_plain_decoding(server):
    generate, why = Generate(server).generate, Why(server).why
    prompt = "abcabcabcabcabcabcabcabc"  # repeats itself: the lookup level has something to copy
    settings = PageSettings(prompt, "tiny", "HiSpec", 2, 4, 2, 4, 24, False, policy=labels.ADAPTIVE, baseline=2)
    outs = list(generate(settings))
    kept = outs[-1]["last_run"]
    assert kept.vs_plain["runs"] == 2 and kept.vs_plain["new_tokens"] == 24
    assert "speed vs plain decoding, measured" in plain(outs[-1]["stats"]), "the stats state the measured ratio"
    view, plot = why(kept, 0.9, 0.9)
    text = plain(view)
    assert text.startswith("Acceptance, everywhere on this page:"), "defined where it first appears"
    plans = re.findall(r"<tr><td>([^<]+)</td><td>\d+</td>", view.split("id='hs-why-plans'")[1].split("</table>")[0])
    assert {html.unescape(p) for p in plans} == set(map(labels.plan_words, kept.stats["policy_choices"])), plans
    assert "this run, measured against plain decoding (2 pairs of runs, 24 tokens each" in text
    assert "at the sliders" in text and "break-even of the same plan" in text
    assert plot.visible
    # where the speed came from, in words, above the plan table: each plan's tokens and time, and the verdict
    source = re.search(r"Where the speed came from: (.*?)Plan by plan", text, re.S)[1]
    for kind in kept.stats["policy_choices"]:
        assert f"{labels.plan_words(kind)} wrote" in source or kind == "plain", (kind, source)
    assert "plain decoding measured here" in source and ("Faster than" in source or "No plan beat" in source)
    settings = PageSettings("hello", "tiny", "HiSpec", 2, 4, 2, 4, 12, True, policy=labels.FIXED, baseline=0)
    fixed = list(generate(settings))
    view, _ = why(fixed[-1]["last_run"], 0.5, 0.5)
    assert "not measured" in plain(view) and "estimated from its plans" not in plain(view)
    assert re.findall(r"<tr><td>(exit 2 → exit 4 → full model)</td>", view), "a fixed run is one plan"


def test_the_story_of_a_token_replaced_twice_tells_the_whole_chain(server):
    """A draft rejected by the verifier, whose own token the full model then rejected and replaced:
    the story names all three, who wrote and who judged each, and in which round."""
    r, _, out = story_of(server)
    chains = {}
    for t in r.trace:
        chains.setdefault(t.index, []).append(t)
    index, chain = next((i, ts) for i, ts in sorted(chains.items())
                        if [t.css_class for t in ts][:1] == ["verify-rejected"]
                        and any(t.born is S.VERIFY_WROTE and t.css_class == "target-rejected" for t in ts)
                        and ts[-1].css_class == "target-wrote")
    first, second, last = chain[0], next(t for t in chain if t.born is S.VERIFY_WROTE), chain[-1]
    story = block_of(out, first.serial)
    assert f"Everything that happened at token {index + 1}:" in story
    assert (f"{first.text}: drafted by the draft exit (layer 2) in round {first.history[0][2]}, then rejected by "
            f"the intermediate verifier (exit 4) in round {first.history[-1][2]}.") in story
    assert (f"{second.text}: written by the intermediate verifier (exit 4) in round {second.history[0][2]}, then "
            f"rejected by the full model in round {second.history[-1][2]}.") in story
    assert f"{last.text}: written by the full model in round {last.history[0][2]}." in story
    assert story.index(first.text + ":") < story.index(second.text + ":") < story.rindex(last.text + ":")
    assert "← this one" in story
    # the tooltip, the story and the step-through count tokens alike, from 1
    tips = [html.unescape(t) for t in re.findall(r'title="([^"]*)"', render.tokens_html(r.trace, RecordedSettings.read(r.settings).spec))]
    assert any(t.startswith(f"token {index + 1} · id") for t in tips)
    # the tooltip tells the chain too: the verifier's own token, who rejected it, what replaced it
    tip = next(t for t in tips if t.startswith(f"token {index + 1} · id {second.token_id} ·"))
    assert (f"written by the intermediate verifier (exit 4) in round {second.history[0][2]}, then rejected by the "
            f"full model in round {second.history[-1][2]}; replaced by '{last.text}' (written by the full model)") in tip
    first_tip = next(t for t in tips if t.startswith(f"token {index + 1} · id {first.token_id} ·"))
    assert f"drafted by the draft exit (layer 2) in round {first.history[0][2]}, then rejected by the intermediate" \
           f" verifier (exit 4)" in first_tip and "click for the whole story" in first_tip
    assert f"token {index + 1} · round" in story


def test_why_explains_a_run_with_the_costs_it_kept_whatever_later_runs_teach(server):
    """An adaptive run keeps the pass costs its policy planned with (its DoneEvent's costs_ms); its
    explanation uses them, so new costs on the model (a later run, a what-if) leave it as it was. A
    run that kept none (a fixed run on a model never timed) is explained with the model's costs as they
    stand at its first explanation, and keeps those: a later change of the model's costs (the what-if
    after it) no longer moves its estimate either."""

    from hispec.engine.planning.costs import CostModel

    generate, why = Generate(server).generate, Why(server).why
    lm = server.registry.get("tiny")
    kept = list(generate(PageSettings("abcabcabcabc", "tiny", "HiSpec", 2, 4, 2, 4, 12, False, policy=labels.ADAPTIVE,
                           baseline=0)))[-1]["last_run"]
    done = kept.done
    assert done.costs_ms["layer"], "the run kept no costs"
    before = why(kept, 0.9, 0.9)[0]
    assert "as this run's policy had them at its end" in plain(before)
    live = lm.ee.cost_model
    try:  # the model's costs change under the run: everything ten times slower
        lm.ee.cost_model = CostModel.from_figures_ms({"layer": {k: 10 * v for k, v in done.costs_ms["layer"].items()},
                                                      "head": {k: v for k, v in done.costs_ms["head"].items()}})
        assert why(kept, 0.9, 0.9)[0] == before
        recorded = kept.to_json()  # as a run that kept no costs of its own (a fixed run on a model never timed)
        recorded["events"][-1]["costs_ms"], recorded["costs_ms"] = {}, {}
        bare = from_json(recorded)
        bare = Why(server).why_after_run(bare)["last_run"]  # its first explanation keeps the costs it used in the record
        changed = why(bare, 0.9, 0.9)[0]
    finally:
        lm.ee.cost_model = live
    assert changed != before and "as they stood when this run was first explained" in plain(changed)
    assert why(bare, 0.9, 0.9)[0] == changed  # the model's costs are back to the live ones: the run kept its first


def test_the_model_line_names_the_weights_format():
    """The page says which format it runs: float32 is the exact reference, 4-bit only exact to itself."""
    from types import SimpleNamespace

    from ui.model_view import model_info

    def lm(weights, dtype="float32"):
        return SimpleNamespace(weights=weights, dtype=dtype, device="cpu", load_s=1.0,
                               ee=SimpleNamespace(num_layers=30, exit_info=None))

    assert "float32 weights (the exact reference" in model_info("default", lm("fp32"))
    q4 = model_info("default", lm("q4"))
    assert "4-bit weights" in q4 and "not to float32" in q4 and "float32 weights" not in q4
    a8 = model_info("default", lm("a8"))  # a8's text belongs to the kernel build that ran it
    assert "int8 activations" in a8 and "in this kernel build, AVX-512 or AVX2" in a8 and "not to float32" in a8
    assert "bfloat16 weights" in model_info("x", lm("fp32", "bfloat16"))


def test_a_plan_the_cost_model_cannot_estimate_has_no_break_even_either():
    """Seen after a default run: the 4-bit plans' rows read '– estimate' and break-even 'never', as if no
    acceptance could make them pay, when the page simply has no estimate for a cheaper format."""
    from ui.why_view import plans_table

    row = {"kind": "full@q4", "words": "4-bit full model → full model", "rounds": 4, "new_tokens": 43, "share": 0.52,
           "a_dv": None, "a_vt": 1.0, "acceptance": {"verify->target": 1.0}, "measured_tokens_per_s": 35.3,
           "predicted_tokens_per_s": None, "predicted": None, "break_even": None,
           "break_even_pair": "4-bit full model → full model", "expected_gain": None, "drafts_on": False}
    exact = {**row, "kind": "exit 2", "words": "exit 2 → full model", "a_vt": 0.1, "predicted_tokens_per_s": 9.0,
             "predicted": 0.5, "range": (0.4, 0.6), "break_even_pair": "draft → full model"}
    cells = [re.findall(r"<td>(.*?)</td>", tr) for tr in plans_table({"plans": [row, exact]}).split("<tr>")[2:]]
    assert cells[0][0] == "4-bit full model → full model" and cells[0][6:] == ["–", "–", "–", "–"], cells[0]
    assert "estimate" in cells[1][6] and cells[1][9] == "never (draft → full model)", cells[1]  # never pays: said


def test_the_plan_table_names_every_pair_a_plan_measured():
    """Seen after a default run: the row 'lookup → 4-bit full model → full model' read '→ full model 100%' only;
    lookup's 36% into the 4-bit model, and which model judged, were missing."""
    from ui.why_view import plans_table

    from hispec.engine.levels import build_levels
    from hispec.engine.planning.round import RoundKind
    from hispec.explain.plans import PlanRow
    from hispec.explain.speed_model import explain_plans
    from hispec.runs.record import PairAcceptance

    def table(levels, judged, *rates):
        built = build_levels(levels, 8)
        pairs = tuple(PairAcceptance(low, high, round(rate * 100), 100)
                      for (low, high), rate in zip(judged(built), rates))
        row = PlanRow(RoundKind(built[0], (built[1],)), built[-1], rounds=7, new_tokens=37, seconds=0.8, share=0.39,
                      pairs=pairs)
        return re.findall(r"<td>(.*?)</td>", plans_table({"plans": explain_plans([row], {}, 8)}))

    cells = table(("lookup", "full@q4"), lambda lv: [(lv[0], lv[1]), (lv[1], lv[2])], 0.36, 1.0)
    assert cells[4] == "lookup → 4-bit full model 36%, 4-bit full model → full model 100%", cells
    cells = table((2, 4), lambda lv: [(lv[0], lv[1]), (lv[1], lv[2])], 0.4, 0.6)
    assert cells[4] == "exit 2 → exit 4 40%, exit 4 → full model 60%", cells
