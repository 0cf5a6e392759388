"""A generation's updates folded into what it produced, and /generate's answer assembled from them.

`Generation` folds a GenerateRequest's Output items (engine events into a LiveRun, the plain-baseline pairs,
the prompt's ids, the level list); the page folds through it too. `api_answer` is /generate's stream:
{"status": ...} while it waits, {"status", "token_ids", "text"} (the tokens committed so far) while it
runs, then the finished run's record (runs.record.RunRecord.to_json) with the
coloured tokens drawn by the caller (`html_of`: the UI's renderer, the only part serving does not draw).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Iterator

from hispec.engine.events import COMMITTED_STATES, Event
from hispec.errors import HiSpecError
from hispec.explain.why import plan_table
from hispec.model.shared import Tally
from hispec.runs.record import MachinePace, RunRecord
from hispec.runs.runner import LiveRun
from hispec.serving.updates import Ended, Output, Status


class Generation:
    def __init__(self):
        self.run = LiveRun()
        self.vs_plain: dict | None = None
        self.prompt_ids: list[int] | None = None
        self.shared: Tally | None = None  # the calls its passes shared with other visitors' (serving.worker)
        self.machine: MachinePace | None = None  # what every visitor's generations wrote meanwhile (runs.meter)

    def add(self, items: Iterable[object]) -> list[Event]:
        """Fold one Output's items; the engine events among them, in order."""
        items = list(items)
        for item in items:
            if isinstance(item, (Tally, MachinePace)):  # what sharing did (serving.worker), the machine's pace
                setattr(self, "shared" if isinstance(item, Tally) else "machine", item)
            if isinstance(item, dict):
                self.vs_plain = item.get("vs_plain", self.vs_plain)
                self.prompt_ids = item.get("prompt_ids", self.prompt_ids)
                if "levels" in item:
                    self.run.set_levels(item["levels"])
        events = [item for item in items if isinstance(item, Event)]
        for ev in events:
            self.run.add(ev)
        return events

    def progress(self) -> dict:
        """/generate's update while the run goes on: the tokens committed so far, in order, and their text as
        the engine wrote it (what a client streams; the answer at the end holds all of them)."""
        committed = sorted((t for t in self.run.trace if t.state in COMMITTED_STATES), key=lambda t: t.index)
        return {"status": f"generating: {len(committed)} tokens", "token_ids": [t.token_id for t in committed],
                "text": "".join(t.text for t in committed)}

    def record(self, model: str = "", pairs_asked: int = 0) -> RunRecord:
        """The finished generation as one value (runs.record.RunRecord), what every view after it reads."""
        record = self.run.record(model=model, prompt_ids=self.prompt_ids or (), vs_plain=self.vs_plain,
                                 pairs_asked=pairs_asked)
        return dataclasses.replace(record, shared=self.shared, machine=self.machine)

    def response(self, html: str, model: str = "") -> dict:
        """What /generate returns: the run's record (RunRecord.to_json, with its schema version: its levels in
        words, text, token_ids, stats, acceptance by pair and position, costs, settings and every engine
        event), with html (the coloured tokens) and plans (the page's "Why this speed" plan table as data:
        explain.why.plan_table)."""
        record = self.record(model)
        return record.to_json() | {"html": html, "plans": plan_table(record)}


def api_answer(updates: Iterable[object], html_of: Callable[[LiveRun], str], model: str = "") -> Iterator[dict]:
    """/generate's stream from a GenerateRequest's updates. Raises HiSpecError with the ending's message
    when the request was refused, failed, or ended before its first token."""
    fold = Generation()
    for update in updates:
        if isinstance(update, Ended):
            if not update.ok or fold.run.done is None:  # refused, failed, or stopped before it started
                raise HiSpecError(update.message)
            yield fold.response(html_of(fold.run), model)  # a fault here: app.py's message, not Gradio's generic one
            return
        if isinstance(update, Output):
            fold.add(update.items)
        yield {"status": update.text} if isinstance(update, Status) else fold.progress()
