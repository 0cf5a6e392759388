"""Lessons: recorded runs that the page replays at their recorded pace, with no model time spent.

A lesson is a run record (runs.record.RunRecord) written by `scripts/measure/lessons.py` on a named machine:
its events, the timing pairs against plain decoding measured right after it, the pass costs its policy kept,
and what each exit believed at every token, so that every view of the page (the tokens, the stats, the charts,
the steps, "Why this speed" with its sliders) works from the file alone. Any number of visitors can watch at
once: a replay never waits for the model, and its figures are the recorded machine's, named as such.

    assets/lessons/*.json.gz  --load_lessons-->  [Lesson(title, record)]  --paced(record)-->  events, round by round
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from hispec.engine.events import Event, RoundEvent
from hispec.runs.record import RunRecord, from_json

LESSONS = Path(__file__).resolve().parents[2] / "assets" / "lessons"
MAX_WAIT_S = 2.0  # the longest pause between two rounds of a replay (a slow prefill is not watched in full)


@dataclass(frozen=True)
class Lesson:
    title: str  # what the page's list says: "The default on a list to repeat: ..."
    record: RunRecord
    prompt: str = ""  # the prompt as the visitor would have typed it (its chat template is in the record's ids)

    @property
    def machine(self) -> str:
        """Where and with what code it was recorded (RunRecord.recorded_where)."""
        return self.record.recorded_where or "an unnamed machine"


def read_lesson(path: Path) -> Lesson:
    """One lesson file: a run record's JSON (RunRecord.to_json, with `recorded_on` and `beliefs`) and a title."""
    data = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_text())
    if not data.get("title"):
        raise ValueError(f"{path.name}: a lesson needs a title")
    return Lesson(data["title"], from_json(data), data.get("prompt") or "")


def load_lessons(folder: Path = LESSONS) -> list[Lesson]:
    """Every lesson of a folder, in the order of their file names ([] when there is none)."""
    paths = sorted([*folder.glob("*.json"), *folder.glob("*.json.gz")]) if folder.is_dir() else []
    return [read_lesson(path) for path in paths]


def paced(record: RunRecord, speed: float = 1.0, sleep: Callable[[float], None] = time.sleep) -> Iterator[list[Event]]:
    """The record's events round by round, each batch released when the recorded run had reached it (its
    events' times over `speed`), a pause never longer than MAX_WAIT_S."""
    batch: list[Event] = []
    shown = 0.0
    for ev in record.events:
        batch.append(ev)
        if isinstance(ev, RoundEvent):
            wait = min(MAX_WAIT_S, max(0.0, (ev.t - shown) / speed))
            if wait:
                sleep(wait)
            shown = ev.t
            yield batch
            batch = []
    if batch:
        yield batch
