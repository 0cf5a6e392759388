"""A run that shared the machine, as the page shows it (issue 60, item 6): its passes carried by calls that held
other visitors' passes drawn crossed in their lanes with the others' rows, the lanes' sentence counting them,
"your speed / the machine's" in its stats, and "Why this speed" saying how sharing changed its figures; a run
that had the machine alone shows none of it."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import write_tiny_lesson

from hispec.engine.events import PassEvent
from hispec.explain.why import sharing_words
from hispec.model.shared import Tally
from hispec.runs.lessons import read_lesson
from hispec.runs.record import MachinePace, from_json
from ui import charts, render

SHARED = "shared with other visitors' passes"


@pytest.fixture(scope="module")
def alone(tmp_path_factory):
    path = tmp_path_factory.mktemp("lessons") / "1-tiny.json.gz"
    write_tiny_lesson(path, [5, 17, 42, 8, 63, 21, 5, 17, 42, 8], max_new_tokens=24)
    return dataclasses.replace(read_lesson(path).record, recorded_on=None)


def shared_run(record):
    """The same run as if every other pass had shared its call with two other visitors' passes (5 of their rows)."""
    events, n = [], 0
    for ev in record.events:
        if isinstance(ev, PassEvent) and ev.stage != "prefill":
            n += 1
            if n % 2:
                ev = dataclasses.replace(ev, beside=2, beside_rows=5)
        events.append(ev)
    return dataclasses.replace(record, events=tuple(events),
                               shared=Tally(calls=40, shared_calls=12, others_passes=24, most_members=3, own_rows=15,
                                            others_rows=60),
                               machine=MachinePace(tokens=90, own_tokens=24, seconds=2.0, visitors=3))


def test_shared_passes_are_drawn_crossed_in_their_lanes_and_counted_in_the_sentence(alone):
    record = shared_run(alone)
    fig = charts.lanes_figure(record)
    crossed = [t for t in fig.data if t.name == SHARED]
    marked = sum(1 for ev in record.events if isinstance(ev, PassEvent) and ev.beside)
    assert len(crossed) == 1 and len(crossed[0].x) == marked > 0
    assert crossed[0].marker.pattern.shape == "x" and {c[1] for c in crossed[0].customdata} == {5}
    said = charts.lanes_caption(record)
    assert f"{marked} of this run's passes" in said and f"{5 * marked} of their rows" in said
    assert not [t for t in charts.lanes_figure(alone).data if t.name == SHARED]
    assert charts.lanes_caption(alone) == charts.LANES_CAPTION


def test_the_stats_say_your_speed_beside_the_machines_and_why_says_what_sharing_changed(alone):
    record = shared_run(alone)
    stats = render.stats_html(dict(alone.stats), shared=record.shared, machine=record.machine)
    assert "your speed / the machine&#x27;s" in stats and "12.0 / 45.0 tok/s" in stats and "up to 3 at once" in stats
    assert "60 rows beside its 15" in stats
    said = sharing_words(record)
    assert "wrote 12.0 tokens/s and the machine 45.0" in said and "12 of its 40 calls" in said
    paired = dataclasses.replace(record, vs_plain={**(record.vs_plain or {}), "shared_calls": 7})
    assert "timing pairs against plain decoding ran beside other visitors too (7 of their calls" in sharing_words(paired)
    assert sharing_words(alone) is None
    assert "your speed" not in render.stats_html(dict(alone.stats), machine=MachinePace(tokens=24, own_tokens=24, seconds=2.0))
    back = from_json(record.to_json())  # the record keeps it: /generate's answer and a lesson
    assert back.machine == record.machine and back.shared == record.shared
    assert [ev.beside for ev in back.events if isinstance(ev, PassEvent)] == \
        [ev.beside for ev in record.events if isinstance(ev, PassEvent)]
