"""The plan the Why sliders vary, picked by a student (issue 58): the Why panel lists the run's plans by their
words in the plan table, starts on the one that committed the most tokens, and a pick moves the sliders, the
estimate, its curve and the what-if to the plan picked; for a live run's record and a lesson's alike."""

from __future__ import annotations

import re

import pytest
from helpers import tiny_model, write_tiny_lesson

from hispec.engine.config import DecodeConfig
from hispec.engine.planning.costs import CostModel
from hispec.explain.plans import plan_rows
from hispec.explain.why import plan_table, slider_choices
from hispec.model.early_exit import EarlyExitModel
from hispec.runs.lessons import read_lesson
from hispec.runs.record import build
from hispec.runs.runner import run
from ui.panels.what_if import WhatIf
from ui.panels.why import Why
from ui.settings import PageSettings


class NoServer:
    """A server the Why panel must not need here: the record keeps its costs."""

    def __getattr__(self, name):
        raise AssertionError(f"the Why panel reached the server ({name})")


@pytest.fixture(scope="module")
def record():
    """A fixed run of lookup → exit 2 → the full model on a tiny model: where lookup has no copy, exit 2 drafts,
    so two plans ran ('exit 2 → full model' wrote the most tokens, 'lookup → exit 2 → full model' the rest); given
    costs (a fixed run on an untimed model keeps none), as its first explanation would keep them."""
    ee = EarlyExitModel(tiny_model("llama", layers=8))
    events = []
    r = run(ee, [5, 6, 7, 8, 9] * 6, DecodeConfig(levels=("lookup", 2), policy="fixed", lengths=(3, 1),
                                                    max_new_tokens=40), on_event=events.append)
    costs = CostModel.given({n: 1e-3 for n in (1, 2, 4, 8)}, {(k, n): 1e-4 for k in (2, 8) for n in (1, 2, 4, 8)})
    return build(events, r.stats).with_costs({None: costs}, "first")


def plans_of(record) -> list[str]:
    return [row.kind.words for row in plan_rows(record) if not row.round.plain]


def test_the_list_holds_the_runs_plans_by_their_table_words_and_starts_on_the_most_tokens(record):
    choices, pick = slider_choices(record)
    assert len(choices) == 2 and set(choices) == {p["words"] for p in plan_table(record) if not p["plain"]}, choices
    most = max((row for row in plan_rows(record) if not row.round.plain), key=lambda row: row.new_tokens)
    assert pick == most.kind.words == "exit 2 → full model"
    after = Why(NoServer()).why_after_run(record)
    assert after["why_plan"]["choices"] == choices and after["why_plan"]["value"] == pick
    assert after["why_plan"]["visible"] is True
    assert slider_choices(None) == ([], None)
    gone = Why(NoServer()).why_after_run(None)["why_plan"]  # a new run starting: the list goes with the last run
    assert gone["choices"] == [] and gone["visible"] is False


def test_picking_another_plan_moves_the_sliders_the_estimate_and_its_curve(record):
    panel = Why(NoServer())
    choices, first = slider_choices(record)
    other = next(c for c in choices if c != first)
    assert other == "lookup → exit 2 → full model"

    def estimate(view: str) -> str:
        return re.search(r"at the sliders</td><td>.*?</td><td><b>([\d.]+)×</b>", view)[1]

    def curves(plot) -> dict:
        return {t.name: list(t.y) for t in plot.constructor_args["value"].data if t.mode == "lines"}

    at = (0.6, 0.6)
    view_first, plot_first = panel.why(record, *at, None, first)
    view_other, plot_other = panel.why(record, *at, None, other)
    assert f"{first} (" in view_first and f"{other} (" in view_other
    assert estimate(view_first) != estimate(view_other), "the same sliders, another plan: another estimate"
    assert curves(plot_first) != curves(plot_other) and any(other in name for name in curves(plot_other))
    assert panel.why(record, *at, None, None)[0] == view_first, "no pick: the plan that committed the most tokens"

    picked = panel.plan_picked(record, other)
    rows = {row.kind.words: row for row in plan_rows(record)}
    lookup_pair = rows[other].acceptance
    assert picked["why_dv"]["label"] == "Acceptance lookup → exit 2" and other in picked["why_dv"]["info"]
    assert picked["why_dv"]["value"] == round(next(v for (low, _), v in lookup_pair.items() if low.kind == "lookup"), 2)
    assert "lookup → exit 2 → the full model" in picked["what_if_levels"], "the what-if follows the pick"
    assert estimate(picked["why_out"]) == estimate(panel.why(record, picked["why_dv"]["value"],
                                                             picked["why_vt"]["value"], None, other)[0])
    assert picked["what_if_result"] is None and picked["what_if_plans"] == "", "a what-if of the plan before goes"
    assert panel.plan_picked(None, other) == {}


def test_the_what_if_runs_the_plan_picked(record):
    choices, first = slider_choices(record)
    other = next(c for c in choices if c != first)
    settings = PageSettings("hello", "tiny", "HiSpec", 2, 4, 2, 4, 12, True)

    def starts(pick) -> str:  # its first word, before it asks the server for anything
        return next(WhatIf(NoServer(), Why(NoServer())).what_if(settings, record, 0.9, 0.9, 1, pick))["what_if_status"]

    assert "lookup → exit 2 → the full model" in starts(other)
    assert "exit 2 → the full model" in starts(first) and "lookup" not in starts(first)


def test_a_lessons_plans_are_listed_and_picked_without_the_model(tmp_path):
    path = tmp_path / "1-tiny.json.gz"
    write_tiny_lesson(path, [5, 17, 42, 8, 63, 21, 5, 17, 42, 8], max_new_tokens=24)
    lesson = read_lesson(path).record
    panel = Why(NoServer())
    after = panel.why_after_run(lesson)
    assert after["why_plan"]["choices"] == plans_of(lesson) and after["why_plan"]["value"] in plans_of(lesson)
    picked = panel.plan_picked(lesson, plans_of(lesson)[-1])
    assert plans_of(lesson)[-1] in picked["why_dv"]["info"] and "hs-why-table" in picked["why_out"]
