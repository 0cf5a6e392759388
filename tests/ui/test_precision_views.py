"""A level in a cheaper format on the page: its tokens have their own colour and legend entry, the
step-through and the tooltips name it in words, the Levels box reaches the request (HiSpec only)."""

import pytest
from helpers import ee_of, tiny_model

from hispec.engine.config import DecodeConfig
from hispec.runs.replay import rounds_of
from hispec.runs.runner import LiveRun, events as run_events
from hispec.runs.trace import LEGEND
from hispec.model.early_exit import EarlyExitModel
from ui import labels, render
from ui.settings import PageSettings
from ui.steps_view import round_html

q4 = pytest.importorskip("hispec.model.formats.q4")
if q4.q4_kernel.unavailable_reason():
    pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}", allow_module_level=True)


class _LM:
    """What runner.events needs of a loaded model."""

    def __init__(self, ee):
        self.ee, self.eos_ids, self.tokenizer = ee, (), None


@pytest.fixture(scope="module")
def run():
    model = tiny_model("llama", layers=8, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    live = LiveRun()
    config = DecodeConfig(levels=("full@q4",), policy="fixed", max_new_tokens=16, lengths=(3, None)).resolve_for(ee)
    for ev in run_events(_LM(ee), [5, 17, 33, 5, 17], config):
        live.add(ev)
    return live


def test_level_words():
    assert labels.level_words("full@q4") == "the 4-bit full model"
    assert labels.level_words("4@q4") == "exit 4 in 4-bit"
    assert labels.level_words(4) == "exit 4" and labels.level_words("lookup") == "lookup"


def test_plans_and_compared_runs_carry_the_pages_names():
    """The engine's plan kinds and Compare's row names, as the page shows them (issue 37: no internal
    names such as 'hispec (auto)' or 'exit 2 -> exit 4' on the page)."""
    assert labels.plan_words("exit 2 -> exit 4") == "exit 2 → exit 4 → full model"
    assert labels.plan_words("lookup") == "lookup → full model" and labels.plan_words("exit 4") == "exit 4 → full model"
    assert labels.plan_words("lookup -> full@q4 (drafts on)") == "lookup → 4-bit full model → full model (drafts on)"
    assert labels.plan_words("plain") == "plain step (full model)"
    assert labels.run_words("hispec (auto)") == "HiSpec, adaptive" and labels.run_words("hispec") == "HiSpec, fixed"
    assert labels.run_words("layerskip") == "LayerSkip (single exit)" and labels.run_words("autoregressive") == "Autoregressive"


def test_the_4bit_models_accepted_drafts_have_their_own_colour_and_legend_entry(run):
    assert "precision" in render.COLORS and any(cls == "precision" for cls, _, _ in LEGEND)
    counts = run.trace.counts()
    assert counts["precision"] > 0, counts  # the 4-bit model drafted, the exact model accepted
    assert counts["accepted"] == 0  # no exact exit drafted in this run
    html = render.tokens_html(run.trace, run.record().spec)
    assert "hs-precision" in html and "4-bit" in html and "exit full@q4" not in html
    assert "4-bit draft" in render.legend_html(counts) and f"({counts['precision']})" in render.legend_html(counts)


def test_the_step_through_names_the_4bit_level(run):
    record = run.record()
    rounds = rounds_of(record)
    shown = " ".join(round_html(rounds, i, record.spec) for i in range(1, len(rounds)))
    assert "Draft by the 4-bit full model" in shown and "exit full@q4" not in shown


def test_the_levels_box_reaches_the_request_for_hispec_only():
    own, precision = list(labels.LEVELS)[:2]
    args = ("hi", "tiny", "HiSpec", 2, 4, 3, 2, 16, True)
    assert PageSettings(*args, levels=own).request()["levels"] is None
    assert PageSettings(*args, levels=precision).request()["levels"] == "lookup,full@q4"
    assert PageSettings(*args, levels="lookup,2,4").request()["levels"] == "lookup,2,4"  # typed by hand
    lookup = ("hi", "tiny", "Lookup (copies earlier text)", 2, 4, 3, 2, 16, True)
    assert PageSettings(*lookup, levels=precision).request()["levels"] is None


def test_a_4bit_plan_whose_run_kept_no_4bit_costs_is_measured_only_and_says_why(run):
    """A fixed run on a model never timed keeps no pass costs: explained with the exact model's costs alone,
    its 4-bit plan is measured, with no estimate and no break-even, and the page says why."""
    from hispec.explain.why import speed_story
    from hispec.engine.planning.costs import CostModel
    from ui.why_view import why_html

    costs = CostModel.given({n: 1e-3 for n in (1, 4, 16)}, {(8, n): 1e-4 for n in (1, 4, 16)})
    story = speed_story(run.record(), {None: costs}, (0.5, 0.5))
    q4 = [p for p in story["plans"] if p["words"] == labels.plan_words("full@q4")]
    assert q4 and all(p["predicted"] is None and p["break_even"] is None for p in q4), story["plans"]
    assert story["slider_plan"] is None  # no slider estimate without the 4-bit lane's costs (said, not guessed)
    assert "kept no pass costs for one of its levels" in why_html(story)


def test_every_plan_of_an_adaptive_precision_run_gets_an_estimate_and_a_break_even():
    """The default list's run (lookup, the 4-bit model, the exact model; adaptive) keeps each lane's costs
    with it: every plan that ran is estimated, with a break-even named by its pair."""
    import re

    from hispec.explain.why import explained_costs, speed_story
    from ui.why_view import plans_table

    from hispec.engine.planning.costs import CostModel

    model = tiny_model("llama", layers=8, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    # Given costs, the 4-bit lane a tenth of the exact one as on the default model: on a tiny model the
    # timed costs of the two lanes are close and move with the host, and with them the policy's plans
    # (a quiet host ran no 4-bit plan at all). The run still refines them with what it measures.
    ee.cost_model = CostModel.given({n: 1e-3 for n in (1, 2, 4, 8, 16)}, {(8, 1): 1e-4})  # float32: k tokens ~ one
    ee.in_format("q4").cost_model = CostModel.given({n: 1e-4 * n for n in (1, 2, 4, 8, 16)}, {(8, 1): 1e-4})
    live = LiveRun()
    config = DecodeConfig(levels=("lookup", "full@q4"), policy="auto", max_new_tokens=40).resolve_for(ee)
    for ev in run_events(_LM(ee), [5, 17, 33, 5, 17, 33, 5, 17, 33, 5, 17], config):
        live.add(ev)
    assert "lanes" in live.done.costs_ms and "q4" in live.done.costs_ms["lanes"]
    record = live.record()
    lanes, whose = explained_costs(record)
    assert whose == "run" and set(lanes) == {None, "q4"}
    story = speed_story(record, lanes, (0.5, 0.5), frozen="run")
    ran = [p for p in story["plans"] if p["new_tokens"]]
    assert any("4-bit" in p["words"] for p in ran), story["plans"]
    for p in ran:
        assert p["predicted"] is not None, p
        assert (p["break_even_pair"] is None) == p["plain"], p
    # the sliders vary a 4-bit plan of the run: its estimate moves with them (issue 56). Which plan wrote the most
    # tokens on this tiny model moves with the host (a fresh CI run had lookup's): the 4-bit plan is picked by name
    four_bit = next(p["words"] for p in ran if "4-bit" in p["words"])
    picked = speed_story(record, lanes, (0.5, 0.5), frozen="run", pick=four_bit)
    assert picked["slider_plan"] is not None and picked["slider_plan"]["words"] == four_bit, picked["slider_plan"]
    low = speed_story(record, lanes, (0.2, 0.2), pick=four_bit)["sliders"]["predicted"]
    high = speed_story(record, lanes, (0.95, 0.95), pick=four_bit)["sliders"]["predicted"]
    assert high > low, (low, high)
    for p, tr in zip(story["plans"], plans_table(story).split("<tr>")[2:]):
        cells = re.findall(r"<td>(.*?)</td>", tr)
        if p["new_tokens"] and not p["plain"]:  # an estimate and a break-even on the page, not '–'
            assert cells[7] != "–" and cells[9] != "–", cells


def test_where_the_speed_came_from_names_the_faster_plans_and_a_hierarchy_that_barely_ran():
    from ui.why_view import speed_source_words

    def plan(kind, new_tokens, rate, rounds, hierarchy=False):
        return {"kind": kind, "words": labels.plan_words(kind), "hierarchy": hierarchy, "plain": kind == "plain",
                "drafts_on": False, "new_tokens": new_tokens,
                "measured_tokens_per_s": rate, "rounds": rounds}

    from hispec.engine.levels import build_levels

    story = {"policy": "auto", "adapts": True, "levels": build_levels(("lookup", 2, 4), 8),
             "plain": {"measured_decode_tokens_per_s": 20.0, "model_tokens_per_s": 30.0},
             "plans": [plan("lookup", 40, 50.0, 10), plan("exit 2 -> exit 4", 3, 10.0, 1, hierarchy=True),
                       plan("plain", 20, 20.0, 20)]}
    words = speed_source_words(story)
    assert "lookup → full model wrote 40 tokens in 0.8 s" in words
    assert "Faster than plain decoding measured here: lookup → full model (2.50×)" in words
    assert "exit 2 → exit 4 → full model wrote 3 tokens" in words and "->" not in words  # the page's names
    assert "exit 2 → exit 4 → full model (" not in words  # slower than plain: not named as faster
    assert "ran in 1 of 31 rounds" in words and "Teaching preset" in words
    assert "Teaching preset" not in speed_source_words({**story, "levels": build_levels(("lookup", "full@q4"), 8)})  # no exits
    story["plain"]["measured_decode_tokens_per_s"] = None  # no plain timing: no ratio to the cost model's step
    assert "No plan beat" not in speed_source_words(story) and "not measured" in speed_source_words(story)
    assert "×" not in speed_source_words(story)


def test_the_levels_box_starts_on_the_precision_list_where_the_model_offers_4bit():
    own, precision = list(labels.LEVELS)[:2]
    assert labels.default_levels(("q4",)) == precision and labels.default_levels(()) == own


def test_a_4bit_tokens_story_names_the_level_in_words(run):
    from ui import token_story

    html_all = token_story.explain_all_html(run.trace, None, run.record())
    assert "exit full@q4" not in html_all and "4-bit" in html_all


def test_a_4bit_draft_is_named_by_what_the_4bit_model_did(run):
    """Under lookup, the 4-bit model is the middle level (the verifier's role) but drafts where lookup has
    no copy: its drafts' tooltips and stories say they were drafted by the 4-bit model, never by "the
    intermediate verifier" (issue 49)."""
    from ui import token_story

    model = tiny_model("llama", layers=8, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    live = LiveRun()
    config = DecodeConfig(levels=("lookup", "full@q4"), policy="fixed", max_new_tokens=16,
                          lengths=(3, 1)).resolve_for(ee)
    for ev in run_events(_LM(ee), [5, 17, 33, 5, 17], config):
        live.add(ev)
    drafted = [t for t in live.trace if t.origin == "verify" and t.born.value == "drafted"]
    assert drafted, "the 4-bit model drafted where lookup had nothing to copy"
    tips = render.tokens_html(live.trace, live.record().spec)
    assert "drafted by the 4-bit full model" in tips
    assert "intermediate verifier (the 4-bit" not in tips and "drafted by the intermediate verifier" not in tips
    story = token_story.explain_all_html(live.trace, None, live.record())
    assert "Proposed by <b>the 4-bit full model</b>" in story
    assert "intermediate verifier (the 4-bit" not in story


def test_one_hue_per_level_across_the_text_the_step_through_and_the_depth_strip(run):
    """The 4-bit model teal, the full model blue, the draft exit green, the intermediate exit orange, lookup
    purple: the same colour in the text (render.COLORS), the steps' left edges and the depth strip (issue 49:
    the step-through painted 4-bit drafts green, the strip painted drafting blue, the full model's colour)."""
    import re
    from pathlib import Path

    css = (Path(render.__file__).resolve().parent.parent / "assets" / "app.css").read_text()

    def colour(selector: str, prop: str) -> str:
        return re.search(re.escape(selector) + r"[^{]*\{[^}]*?" + prop + r":\s*(#[0-9a-f]{6})", css)[1]

    for text, level in (("precision", "precision"), ("target-wrote", "target"), ("accepted", "draft"),
                        ("verify-wrote", "verify")):
        hue = render.COLORS[text]
        assert colour(f".hs-{text}", "background") == hue
        assert colour(f".hs-stage-{level}", "background") == hue, level
        assert colour(f".hs-step-{level}", "border-left-color") == hue, level
    assert colour(".hs-step-lookup", "border-left-color") == render.COLORS["copied"]
    record = run.record()
    rounds = rounds_of(record)
    shown = " ".join(round_html(rounds, i, record.spec) for i in range(1, len(rounds)))
    assert "hs-precision" in shown and "hs-accepted" not in shown, "the 4-bit model's accepted drafts: teal, as in the text"
    assert "hs-step-precision" in shown and "Left edge, by level" in shown  # with its key
