"""Lessons (hispec/runs/lessons.py): recorded runs that the page replays with no model time, at their pace."""

import gzip
import json

import pytest
from helpers import tiny_model

from hispec.engine.config import DecodeConfig
from hispec.engine.events import RoundEvent
from hispec.evaluation.pairs import summary
from hispec.explain.beliefs import exit_beliefs
from hispec.model.early_exit import EarlyExitModel
from hispec.runs import lessons
from hispec.runs.record import build
from hispec.runs.runner import run

PROMPT = [5, 17, 42, 8, 63, 21]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A lesson file of a tiny model's adaptive run, as scripts/measure/lessons.py writes one."""
    ee = EarlyExitModel(tiny_model("llama", layers=8, seed=3))
    events = []
    r = run(ee, PROMPT, DecodeConfig(max_new_tokens=20), on_event=events.append)
    measured = summary([1.1, 1.2, 1.3], 3) | {"new_tokens": 20, "plain_decode_tokens_per_s": [9.0, 9.5, 10.0]}
    record = build(events, r.stats, model="tiny", prompt_ids=PROMPT, vs_plain=measured)
    data = record.to_json() | {"title": "A tiny lesson", "prompt": "hello",
                               "beliefs": exit_beliefs(ee, PROMPT, r.token_ids),
                               "recorded_on": {"machine": "a test host", "commit": "0123456789abcdef"}}
    folder = tmp_path_factory.mktemp("lessons")
    (folder / "1-tiny.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    return folder, record


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
