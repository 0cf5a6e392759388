"""'Why this speed' from a run's own events: plan by plan, the measured ratio beside the estimates,
and the differences named (hispec.explain.plans, hispec.explain.why)."""

import pytest
from helpers import tiny_model
from test_speed_model import flat_costs

from hispec.engine.config import preset
from test_speed_model import fixed_plan, slider_model

from hispec.engine.planning.round import kind_words
from hispec.explain.plans import plan_rows
from hispec.runs.record import build, fixed_round, from_json
from hispec.runs.runner import run
from hispec.explain.why import speed_story
from hispec.model.early_exit import EarlyExitModel


@pytest.fixture(scope="module")
def ee():
    return EarlyExitModel(tiny_model("llama", layers=8))


def traced(ee, prompt, config):
    events = []
    r = run(ee, prompt, config, on_event=events.append)
    return r, events


def kept(r, events, vs_plain=None):
    return build(events, r.stats, vs_plain=vs_plain)


def by_roles(acceptance: dict) -> dict:
    """A plan's acceptance keyed by its levels, as the stats key it (by role)."""
    return {f"{low.name}->{high.name}": rate for (low, high), rate in acceptance.items()}


def test_a_fixed_run_is_one_plan_with_the_runs_own_acceptance(ee):
    r, events = traced(ee, [5, 6, 7, 8], preset("hispec", 2, 4, 2, 2, max_new_tokens=24, policy="fixed"))
    record = kept(r, events)
    rows = plan_rows(record)
    assert [row.kind.key for row in rows] == ["exit 2 -> exit 4"] == [fixed_round(record.levels, record.lengths).kind.key]
    row = rows[0]
    # the prefill commits the first token (round 0); the plan's rounds commit the rest
    assert row.rounds == r.stats["rounds"] and row.new_tokens == r.stats["new_tokens"] - 1
    assert by_roles(row.acceptance) == r.stats["acceptance"]
    assert row.share == pytest.approx(1.0) and (row.count, row.verify_at) == (2, 2)


def test_an_adaptive_run_is_told_plan_by_plan_lookup_included(ee):
    prompt = [5, 6, 7, 8, 9] * 6  # a prompt that repeats itself: the lookup level has something to copy
    r, events = traced(ee, prompt, preset("hispec", 2, 4, max_new_tokens=40, policy="auto"))
    rows = plan_rows(kept(r, events))
    kinds = {row.kind.key for row in rows}
    assert kinds == set(r.stats["policy_choices"]), (kinds, r.stats["policy_choices"])
    assert sum(row.rounds for row in rows) == r.stats["rounds"]
    assert sum(row.share for row in rows) == pytest.approx(1.0)
    assert sum(row.new_tokens for row in rows) <= r.stats["new_tokens"]
    if "lookup" in kinds:
        lookup = next(row for row in rows if row.kind.key == "lookup")
        assert set(by_roles(lookup.acceptance)) == {"lookup->target"}


def test_the_story_puts_the_estimate_beside_the_measured_ratio_and_names_the_gap(ee):
    r, events = traced(ee, [5, 6, 7, 8], preset("hispec", 2, 4, 2, 2, max_new_tokens=24, policy="fixed"))
    costs = flat_costs()
    measured = {"median": 0.30, "low": 0.28, "high": 0.33, "runs": 3, "new_tokens": 24,
                "plain_decode_tokens_per_s": [0.1, 0.125, 0.125]}
    story = speed_story(kept(r, events, measured), {None: costs}, (0.9, 0.9))
    plan = story["plans"][0]
    a_dv, a_vt = r.stats["acceptance"]["draft->verify"], r.stats["acceptance"]["verify->target"]
    assert plan["predicted"] == pytest.approx(slider_model(costs, 8).speedup(fixed_plan((2, 4), 2, 2),
                                                                           a_dv, a_vt))
    low, high = plan["range"]
    assert low <= plan["predicted"] <= high, "the estimate's range holds it"
    # the cost model's plain step (1/8 tokens per second on flat costs) is calibrated to the measured one
    assert plan["predicted_tokens_per_s"] == pytest.approx(plan["predicted"] * 0.125)
    assert story["predicted"] == pytest.approx(plan["predicted"]) and story["measured"] == measured
    if not measured["low"] <= story["predicted"] <= measured["high"]:
        reasons = dict(story["differences"])
        assert set(reasons) >= {"by", "bookkeeping", "noise"} and "%" in reasons["by"]
    at = story["sliders"]
    assert at["predicted"] == pytest.approx(slider_model(costs, 8).speedup(fixed_plan((2, 4), 2, 2), 0.9, 0.9))
    assert "sliders: estimate" in story["points"] and story["curves"]


def test_without_a_measurement_no_estimate_of_the_run_is_stated(ee):
    r, events = traced(ee, [5, 6, 7, 8], preset("layerskip", 2, max_new_tokens=12, policy="fixed"))
    story = speed_story(kept(r, events), {None: flat_costs()}, (0.5, 0.5))
    assert story["measured"] is None and story["differences"] == []
    from ui.why_view import why_html

    out = why_html(story)
    assert "not measured" in out and "this run, estimated" not in out


def test_a_what_if_at_the_sliders_joins_the_same_table(ee):
    r, events = traced(ee, [5, 6, 7, 8], preset("hispec", 2, 4, 2, 2, max_new_tokens=12, policy="fixed"))
    what_if = {"rates": (0.9, 0.9), "median": 1.4, "low": 1.2, "high": 2.0, "takes": 3}
    story = speed_story(kept(r, events), {None: flat_costs()}, (0.9, 0.9), what_if)
    assert story["sliders"]["what_if"] == what_if
    assert "sliders: what-if, measured (synthetic)" in story["points"]
    elsewhere = speed_story(kept(r, events), {None: flat_costs()}, (0.5, 0.9), what_if)
    assert elsewhere["sliders"]["what_if"] is None, "a what-if at other sliders is not this row"


def split(setup, prefill, passes, other):
    return {"wall_s": setup + prefill + passes + other, "setup_s": setup, "prefill_s": prefill, "passes_s": passes,
            "other_s": other}


def test_the_what_ifs_gap_is_taken_step_by_step_and_the_rest_called_unexplained():
    from hispec.explain.what_if import gap

    w = {"synthetic_split": split(0.1, 0.2, 1.0, 0.5), "plain_split": split(0.1, 0.2, 2.0, 0.3)}
    g = gap(w, 1.8)
    assert g["whole"] == pytest.approx(2.6 / 1.8) and g["decoding"] == pytest.approx(2.3 / 1.5)
    assert g["passes"] == pytest.approx(2.0)
    assert g["unexplained"] == 0.0  # between decoding only (1.53x) and passes only (2x): the other work's part
    assert gap(w, 2.4)["unexplained"] == pytest.approx(0.2)  # above both: measured from the nearer, 2x
    assert gap(w, 1.38)["unexplained"] == pytest.approx(1.38 / (2.3 / 1.5) - 1)
    assert gap({"synthetic_split": None, "plain_split": w["plain_split"]}, 1.8) is None
    assert gap(w, None) is None


def test_the_plan_table_as_data_estimates_every_plan_of_an_adaptive_run_from_its_kept_costs(ee):
    """/generate's `plans`: the page's table as JSON-ready data, each plan estimated on the costs the run
    kept (its policy's, every lane), with a break-even named by its pair; a run that kept none is measured
    only (no invented estimate)."""
    import json

    from hispec.explain.why import plan_table

    prompt = [5, 6, 7, 8, 9] * 6
    r, events = traced(ee, prompt, preset("hispec", 2, 4, max_new_tokens=40, policy="auto"))
    plans = plan_table(kept(r, events))
    json.dumps(plans)
    assert {p["words"] for p in plans} == {kind_words(k) for k in r.stats["policy_choices"]}
    for p in plans:
        assert p["predicted"] is not None and p["words"], p
        assert (p["break_even_pair"] is None) == p["plain"], p
        assert p["expected_gain"] is not None, p  # what the policy expected when it chose it
    recorded = kept(r, events).to_json()
    done = next(e for e in recorded["events"] if e["type"] == "done")
    done["costs_ms"] = {}  # as a fixed run on a model never timed
    recorded["costs_ms"] = {}
    assert all(p["predicted"] is None for p in plan_table(from_json(recorded)))


@pytest.mark.real_model
def test_the_default_runs_plans_each_get_an_estimate_on_the_default_model(real_model_threads):
    """The default model's default run (lookup -> the 4-bit model -> the exact model, adaptive): every plan
    that ran gets a numeric estimate and break-even from the costs the run kept for each lane."""
    from hispec.engine.config import DecodeConfig
    from hispec.explain.why import plan_table
    from hispec.model.loading import load_model
    from hispec.runs.runner import run, warm_up

    lm = load_model("default", device="cpu")
    warm_up(lm)
    ids = lm.encode("Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox", chat=True)
    config = DecodeConfig(max_new_tokens=48).resolve_for(lm.ee)
    assert tuple(config.levels) == ("lookup", "full@a8")
    events = []
    r = run(lm.ee, ids, config, lm.eos_ids, on_event=events.append)
    plans = plan_table(kept(r, events))
    ran = [p for p in plans if p["new_tokens"]]
    assert any("int8-activation" in p["words"] for p in ran), plans
    for p in ran:
        assert p["predicted"] is not None, p
        if not p["plain"]:
            assert p["break_even_pair"] is not None, p
