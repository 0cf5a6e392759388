"""The passes by level on one clock (issue 58, item 2): one lane per level of the run, each PassEvent a block of
its level's lane at its measured length, plain decoding's pace (its timing pairs') as the last lane, and a run
whose events hold no timed pass saying so."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import ee_of, tiny_model, write_tiny_lesson

from hispec.engine.config import DecodeConfig
from hispec.engine.events import PassEvent, RoundEvent
from hispec.explain.timeline import timeline_of
from hispec.model.early_exit import EarlyExitModel
from hispec.runs.lessons import read_lesson
from hispec.runs.record import build
from hispec.runs.runner import run
from ui import charts
from ui.panels.lesson import Lesson

PLAIN = "plain decoding (measured pace)"


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    """A tiny model's adaptive run (lookup → exit 1 → exit 2 → the full model) with timing pairs."""
    path = tmp_path_factory.mktemp("lessons") / "1-tiny.json.gz"
    write_tiny_lesson(path, [5, 17, 42, 8, 63, 21, 5, 17, 42, 8], max_new_tokens=24)
    return read_lesson(path)


def bars(fig, plain: bool = False) -> list:
    """The figure's blocks (bar traces), the run's or plain decoding's."""
    return [t for t in fig.data if t.type == "bar" and (t.name == PLAIN) == plain]


def test_one_lane_per_level_and_one_block_per_pass(lesson):
    record = lesson.record
    fig = charts.lanes_figure(record)
    timeline = timeline_of(record)
    lanes = [lane.words for lane in timeline.lanes]
    assert len(lanes) == len(record.levels) + 1 and lanes[-1] == PLAIN, lanes
    assert [lane.level for lane in timeline.lanes[:-1]] == list(record.levels)
    assert lanes == ["lookup (no layers)", "exit 1 (layers 0–1)", "exit 2 (layers 1–2)", "full model (layers 2–8)",
                     PLAIN]
    assert list(fig.layout.yaxis.categoryarray) == lanes[::-1], "the bottom level on top, plain decoding last"
    passes = [ev for ev in record.events if isinstance(ev, PassEvent)]
    run_blocks = bars(fig)
    assert sum(len(t.x) for t in run_blocks) == len(passes) == timeline.passes
    assert sorted(x for t in run_blocks for x in t.x) == sorted(ev.seconds for ev in passes), "measured lengths"
    assert {y for t in run_blocks for y in t.y} <= set(lanes[1:-1]), "lookup runs no layers: no block of its own"
    assert any(t.name == "lookup copies (no layer pass)" for t in fig.data)
    assert all(t.name for t in fig.data if t.showlegend is not False), "every colour in the legend"
    assert fig.layout.xaxis.title.text.startswith("seconds since the start") and fig.layout.yaxis.title.text


def test_a_rounds_passes_lie_in_order_from_its_start(lesson):
    record = lesson.record
    ends = {ev.round: ev.t for ev in record.events if isinstance(ev, RoundEvent)}
    blocks = sorted((b for lane in timeline_of(record).lanes[:-1] for b in lane.blocks), key=lambda b: b.start)
    for r in sorted(ends)[1:]:
        mine = [b for b in blocks if b.round == r]
        assert mine[0].start == pytest.approx(ends[r - 1]), r  # from the end of the round before
        for a, b in zip(mine, mine[1:]):
            assert b.start == pytest.approx(a.start + a.seconds), r  # end to end, none overlapping
    assert all(b.prefill for b in blocks if b.round == 0) and blocks[0].start == 0.0


def test_plain_decodings_lane_is_the_race_s_plain_line(lesson):
    record = lesson.record
    plain = timeline_of(record).lanes[-1]
    assert len(plain.blocks) == len(record.token_ids), "its prefill, then one step per token after the first"
    race = charts.race_figure([{"t": 1.0, "new_tokens": len(record.token_ids)}], dict(record.vs_plain))
    last = plain.blocks[-1]
    assert last.start + last.seconds == pytest.approx(list(race.data[1].x)[-1]), "one clock with the race"


def test_a_run_without_timings_says_so_and_one_without_pairs_has_no_plain_lane():
    ee = EarlyExitModel(tiny_model("llama", layers=8))
    events = []
    r = run(ee, [5, 6, 7, 8, 9] * 4, DecodeConfig(levels=("lookup", 2), policy="fixed", lengths=(3, 1),
                                                    max_new_tokens=12), on_event=events.append)
    record = build(events, r.stats)
    assert [lane.words for lane in timeline_of(record).lanes][-1] != PLAIN, "no timing pairs: no plain lane"
    untimed = dataclasses.replace(record, events=tuple(ev for ev in record.events if not isinstance(ev, PassEvent)))
    timeline = timeline_of(untimed)
    assert not timeline.timed and all(not lane.blocks for lane in timeline.lanes)
    fig = charts.lanes_figure(untimed)
    assert not bars(fig) and "no timings" in fig.layout.annotations[0].text
    assert charts.lanes_figure(record).layout.annotations == (), "a timed run has no such note"


def test_a_lesson_shows_the_lanes_beside_the_race_with_their_sentence(lesson):
    last = list(Lesson([lesson], speed=1000.0).replay(lesson.title))[-1]
    assert last["lanes_plot"].constructor_args["visible"] is True and last["race_plot"].visible
    assert "one lane per level" in last["lanes_note"] and "hs-lanes-words" in last["lanes_note"]


def test_the_4bit_model_has_its_own_lane():
    q4 = pytest.importorskip("hispec.model.formats.q4")
    if q4.q4_kernel.unavailable_reason():
        pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}")
    model = tiny_model("llama", layers=8, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(model)))
    events = []
    r = run(ee, [5, 17, 33, 5, 17], DecodeConfig(levels=("lookup", "full@q4"), policy="fixed", lengths=(3, 1),
                                                 max_new_tokens=12), on_event=events.append)
    timeline = timeline_of(build(events, r.stats))
    lanes = {lane.words: lane for lane in timeline.lanes}
    assert list(lanes) == ["lookup (no layers)", "4-bit full model (layers 0–8)", "full model (layers 0–8)"]
    assert lanes["4-bit full model (layers 0–8)"].blocks, "the 4-bit model's passes in its own lane"
    assert sum(len(lane.blocks) for lane in timeline.lanes) == timeline.passes
