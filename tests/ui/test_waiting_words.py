"""The page's words for a shared machine: a waiting visitor's status (serving.updates.Waiting, shown as it is),
timing pairs that gave way to a waiting visitor (the summary's "yielded", where the pairs are shown), and the
sentence beside the load on how sharing changes the figures."""

from __future__ import annotations

from hispec.evaluation.pairs import summary
from hispec.serving.updates import Waiting
from ui import render, why_view
from ui.generate_view import GenerateView


def measured(ratios, asked, yielded) -> dict:
    s = summary(ratios, asked)
    return dict(s, cut=max(0, s["cut"] - yielded), yielded=yielded, new_tokens=8,
                plain_decode_tokens_per_s=[10.0] * len(ratios))


def test_a_waiting_update_is_the_status_at_once():
    shown = GenerateView("tiny", pairs=3).update(Waiting.behind(2))
    assert "Waiting for the model: 2 requests ahead" in shown["status"]


def test_pairs_that_gave_way_are_said_where_the_pairs_are_shown():
    words = render.vs_plain_words(measured([1.2], 3, 2))
    assert "1 of 3 timing pairs measured; the other 2 gave way to a visitor waiting for the model" in words
    assert "cut short" not in words  # they were not cut: they did not run
    every = render.vs_plain_words(measured([1.2, 1.3, 1.1], 3, 0))
    assert "gave way" not in every
    row = why_view._measured_row({"measured": measured([1.2], 3, 2), "pairs_asked": 3})
    assert "2 more not run: they gave way to a visitor waiting for the model" in row


def test_no_pair_measured_because_a_visitor_waited():
    none = {"runs": 0, "asked": 3, "cut": 0, "yielded": 3, "new_tokens": 8,
            "verdict": "not measured: another visitor was waiting for the model, and the timing pairs gave way"}
    assert "another visitor was waiting" in render.vs_plain_words(none)
    row = why_view._measured_row({"measured": dict(none, median=None), "pairs_asked": 3})
    assert "gave way to a visitor waiting for the model" in row and "cut short" not in row
    assert "gave way" in why_view._not_measured({"measured": none, "pairs_asked": 3})


def test_the_load_row_says_the_machine_is_shared_and_what_that_does_to_the_figures():
    words = render.load_words([1.5, 1.0, 0.5])
    assert words.startswith("1.5 (1 min) on ")
    assert "This machine is shared" in words and "timing pairs" in words and "alone on the model" in words
    assert render.SHARED_WORDS in render.load_words([0.1, 0.1, 0.1])  # said whatever the load


def test_a_run_that_shared_its_calls_says_so_beside_its_speed():
    from hispec.model.shared import Tally

    stats = {"new_tokens": 3, "wall_s": 1.0, "tokens_per_s": 3.0, "acceptance": {}, "kept": {}, "full_passes": 3,
             "tokens_per_full_pass": 1.0, "layer_tokens": {"useful": 1, "wasted": 0}}
    shared = Tally(calls=40, shared_calls=12, others_passes=31, most_members=3)
    with_row = render.stats_html(stats, shared=shared)
    assert "shared with other visitors" in with_row and "12 of its 40 calls" in with_row and "up to 3 visitors" in with_row
    alone = render.stats_html(stats, shared=Tally(calls=40))
    assert "shared with other visitors" not in alone and "shared with other visitors" not in render.stats_html(stats)
