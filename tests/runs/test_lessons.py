"""Lessons (hispec/runs/lessons.py): recorded runs that the page replays with no model time, at their pace."""

import json

import pytest
from helpers import write_tiny_lesson

from hispec.engine.events import RoundEvent
from hispec.runs import lessons

PROMPT = [5, 17, 42, 8, 63, 21]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lessons")
    return folder, write_tiny_lesson(folder / "1-tiny.json.gz", PROMPT)


def test_a_lesson_reads_back_as_the_run_it_recorded_with_its_beliefs_and_machine(recorded):
    folder, record = recorded
    [lesson] = lessons.load_lessons(folder)
    assert lesson.title == "A tiny lesson" and lesson.prompt == "hello"
    assert lesson.record.token_ids == record.token_ids and lesson.record.events == record.events
    as_json = lambda value: json.loads(json.dumps(dict(value)))  # noqa: E731 - tuples come back as lists
    assert lesson.record.pairs == record.pairs and as_json(lesson.record.vs_plain) == as_json(record.vs_plain)
    assert lesson.record.beliefs["tokens"] and lesson.machine == "a test host at commit 0123456"
    assert lessons.load_lessons(folder / "missing") == []


def test_a_replay_keeps_the_recorded_pace_round_by_round_and_never_stalls(recorded):
    _, record = recorded
    waits = []
    batches = list(lessons.paced(record, speed=1.0, sleep=waits.append))
    assert [ev for batch in batches for ev in batch] == list(record.events)  # every event, in order
    assert all(isinstance(batch[-1], RoundEvent) for batch in batches[:-1])  # released a round at a time
    assert all(0 < w <= lessons.MAX_WAIT_S for w in waits)
    rounds = [ev.t for ev in record.events if isinstance(ev, RoundEvent)]
    assert sum(waits) == pytest.approx(rounds[-1], rel=1e-6) or sum(waits) < rounds[-1]  # capped pauses only shorten
    fast = []
    list(lessons.paced(record, speed=10.0, sleep=fast.append))
    assert sum(fast) == pytest.approx(sum(waits) / 10, rel=1e-6)


def test_the_shipped_lessons_are_default_model_runs_with_their_pairs_beliefs_and_machine():
    shipped = lessons.load_lessons()
    assert len(shipped) >= 2, "the page offers recorded runs to replay (scripts/measure/lessons.py)"
    titles = [lesson.title for lesson in shipped]
    assert any("default" in t.lower() for t in titles) and any("teaching" in t.lower() for t in titles), titles
    for lesson in shipped:
        record = lesson.record
        assert record.model == "default" and record.token_ids and record.beliefs and record.recorded_on["machine"]
        assert record.vs_plain and record.vs_plain["runs"] >= 1, "the lesson's own timing pairs"
        assert record.costs.get(None) is not None, "its pass costs travel with it: Why needs no model"
        assert lesson.prompt
