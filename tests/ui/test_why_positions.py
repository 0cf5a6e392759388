"""Acceptance by position in the block (issue 58, item 3): in the Why panel after a run, one line per level pair
that judged (the share of its blocks whose i-th token survived), named by the pair's levels, and one sentence,
computed from the same record, on what the fall says about the block lengths the run chose."""

import dataclasses

import pytest
from helpers import tiny_model

from hispec.engine.config import DecodeConfig
from hispec.engine.levels import build_levels
from hispec.engine.planning.round import Round
from hispec.explain.positions import Fall, block_length, fall_sentence, falls, ordinal
from hispec.model.early_exit import EarlyExitModel
from hispec.runs.record import PairAcceptance, build
from hispec.runs.runner import run
from ui import charts
from ui.panels.why import positions


@pytest.fixture(scope="module")
def record():
    """A fixed run of lookup → exit 2 → exit 4 → the full model on a tiny model: three pairs judge."""
    ee = EarlyExitModel(tiny_model("llama", layers=8))
    config = DecodeConfig(levels=("lookup", 2, 4), policy="fixed", lengths=(3, 4), max_new_tokens=40)
    events = []
    r = run(ee, [5, 6, 7, 8, 9] * 6, config, on_event=events.append)
    return build(events, r.stats)


def test_the_chart_has_one_falling_line_per_pair_that_judged_named_by_its_levels(record):
    judged = [p for p in record.pairs if p.by_position]
    assert len(judged) >= 2, record.pairs
    fig = charts.position_figure(record.pairs)
    assert [trace.name for trace in fig.data] == [p.words for p in judged]
    for trace, pair in zip(fig.data, judged):
        y = list(trace.y)
        assert list(trace.x) == list(range(1, len(y) + 1)) and y == pair.survival()
        assert all(later <= earlier for earlier, later in zip(y, y[1:])), (pair.words, y)
        assert 0 <= y[-1] <= y[0] <= 1


def test_the_sentence_under_it_names_every_pair_and_the_lengths_the_run_gave_them(record):
    found = falls(record)
    sentence = fall_sentence(found, record.adapts)
    assert [f.pair for f in found] == [p for p in record.pairs if p.by_position]
    for f in found:
        assert f.pair.words in sentence and f.length is not None
        assert f"of {f.pair.by_position[0][1]} blocks" in sentence
    assert "the fixed rounds gave it" in sentence and "policy chose" not in sentence
    assert fall_sentence(found, adapts=True).count("the policy chose") == len(found)


def test_the_why_panel_draws_them_after_a_run_and_hides_them_without_one(record):
    shown = positions(record)
    assert shown["position_plot"].constructor_args["visible"] is True
    assert "hs-position-words" in shown["position_note"] and record.pairs[0].words in shown["position_note"]
    for nothing in (None, dataclasses.replace(record, pairs=())):  # no run; a run of plain steps only
        hidden = positions(nothing)
        assert hidden["position_plot"].constructor_args["visible"] is False and hidden["position_note"] == ""


def fall(survival, length, blocks=50):
    low, high = build_levels(("full@q4",), 30)[:2]
    by_position = tuple((round(s * blocks), blocks) for s in survival)
    return Fall(PairAcceptance(low, high, 0, 0, by_position=by_position), tuple(survival), length)


def test_what_the_fall_says_about_the_lengths():
    adaptive = True
    long = fall_sentence([fall((0.95, 0.9, 0.8, 0.7), 4)], adaptive)
    assert long == ("By position in the block: 4-bit full model → full model: the 4th token still survives in 70% of "
                    "50 blocks, so long blocks pay; the policy chose 4 a round.")
    short = fall_sentence([fall((0.6, 0.3, 0.08), 3)], adaptive)
    assert "the 2nd token survives in 30% of 50 blocks (the 1st in 60%), yet the policy chose 3 a round: most of " \
           "the tokens past the 2nd are thrown away" in short
    kept_short = fall_sentence([fall((0.4, 0.1), 1)], adaptive)
    assert "the 1st token survives in 40% of 50 blocks; the policy chose 1 a round, no further than" in kept_short
    assert fall_sentence([], adaptive) == ""


def test_a_rounds_block_for_each_pair():
    lookup, d, v, full = build_levels(("lookup", 2, 4), 8)
    hierarchy = Round(d, full, 2, (v,), 4)
    assert block_length(hierarchy, d, v) == 2 and block_length(hierarchy, v, full) == 4
    assert block_length(hierarchy, lookup, d) is None  # not a pair of this round
    q4_lookup, q4, q4_full = build_levels(("lookup", "full@q4"), 8)
    drafts_on = Round(q4_lookup, q4_full, 5, (q4,), 1, then=3)
    assert block_length(drafts_on, q4_lookup, q4) == 5 and block_length(drafts_on, q4, q4_full) == 8
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 112)] == \
        ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "112th"]
