"""Lesson mode (ui/panels/lesson.py, issue 58): a recorded run replayed into the run's own views, and the views
that follow a run (Why, Steps) drawn from its record alone: no model, no server, no queue."""

from __future__ import annotations

import pytest
from helpers import write_tiny_lesson

from hispec.runs.lessons import read_lesson
from ui.generate_view import VIEWS
from ui.panels.lesson import Lesson
from ui.panels.steps import Steps
from ui.panels.why import Why

PROMPT = [5, 17, 42, 8, 63, 21, 5, 17, 42, 8]


class NoServer:
    """A server a lesson must never reach: any use of it fails the test."""

    def __getattr__(self, name):
        raise AssertionError(f"a lesson reached the server ({name}): it must spend no model time")


@pytest.fixture(scope="module")
def lesson(tmp_path_factory):
    path = tmp_path_factory.mktemp("lessons") / "1-tiny.json.gz"
    write_tiny_lesson(path, PROMPT, max_new_tokens=24, prompt="hello again")
    return read_lesson(path)


def test_a_lesson_replays_into_the_runs_views_and_keeps_its_record(lesson):
    panel = Lesson([lesson], speed=1000.0)
    outs = list(panel.replay(lesson.title))
    assert "recorded on a test host at commit 0123456" in outs[0]["status"] and outs[0]["prompt"] == "hello again"
    assert set(outs[-1]) <= set(VIEWS) | {"prompt"}
    assert outs[-1]["last_run"] is lesson.record, "the views after it read the lesson's own record"
    assert "Lesson replayed" in outs[-1]["status"] and "Generate runs the same prompt live" in outs[-1]["status"]
    assert "speed vs plain decoding, measured" in outs[-1]["stats"], "the recorded timing pairs are shown"
    assert "machine load (when recorded)" not in outs[-1]["stats"], "the tiny lesson recorded no load"
    assert sum("tokens" in o for o in outs) >= 3, "streamed round by round, not all at once"
    assert outs[-1]["race_plot"].visible, "the race against plain decoding, from the lesson's own pairs"
    assert "Pick a lesson" in list(panel.replay("no such lesson"))[-1]["status"]


def test_why_and_the_steps_of_a_lesson_need_no_model(lesson):
    record = lesson.record
    after = Why(NoServer()).why_after_run(record)
    assert "A recorded run, replayed" in after["why_out"] and "a test host" in after["why_out"]
    assert "last_run" not in after, "its own costs travelled with it: nothing fetched, nothing kept"
    rounds, _, view, beliefs_view, stories = Steps(NoServer()).after_run(record)
    assert rounds and "hs-steps" in view and "hs-beliefs" in beliefs_view and "hs-explain" in stories
