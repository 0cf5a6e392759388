"""A generation's updates folded into what it produced, and /generate's answer assembled from them.

`Generation` folds the Output items of a GenerateRequest (serving.api): engine events into a LiveRun
(stats, trace, the JSON trace, the DoneEvent), the plain-baseline pairs (`vs_plain`), the prompt's ids
and the level list. The page's view folds through it too, so the page and the API read one fold.
`api_answer` is /generate's stream: {"status": ...} while it runs, then the one JSON shape of a
finished generation (`response`); the coloured tokens come from the caller (`html_of`: the UI's
renderer), the only part serving does not draw.
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator

from hispec.engine.events import Event
from hispec.errors import HiSpecError
from hispec.explain.why import plan_table
from hispec.runs.runner import LiveRun
from hispec.serving.updates import Ended, Output, Status


class Generation:
    def __init__(self):
        self.run = LiveRun()
        self.vs_plain: dict | None = None
        self.prompt_ids: list[int] | None = None

    def add(self, items: Iterable[object]) -> list[Event]:
        """Fold one Output's items; the engine events among them, in order."""
        items = list(items)
        for item in items:
            if isinstance(item, dict):
                self.vs_plain = item.get("vs_plain", self.vs_plain)
                self.prompt_ids = item.get("prompt_ids", self.prompt_ids)
                if "levels" in item:
                    self.run.set_levels(item["levels"])
        events = [item for item in items if isinstance(item, Event)]
        for ev in events:
            self.run.add(ev)
        return events

    def response(self, html: str) -> dict:
        """What /generate returns: text, token_ids, html (the coloured tokens), stats (with `vs_plain`
        when a baseline was measured), settings, plans (the page's "Why this speed" plan table as data:
        explain.why.plan_table) and trace (every engine event, in order)."""
        done = self.run.done
        stats = self.run.summary()
        if self.vs_plain is not None:
            stats["vs_plain"] = self.vs_plain
        kept = {"settings": done.settings, "events": self.run.events, "stats": stats, "vs_plain": self.vs_plain}
        return {"text": done.text, "token_ids": list(done.token_ids), "html": html, "stats": stats,
                "settings": done.settings, "plans": plan_table(kept), "trace": self.run.events}


def api_answer(updates: Iterable[object], html_of: Callable[[LiveRun], str]) -> Iterator[dict]:
    """/generate's stream from a GenerateRequest's updates. Raises HiSpecError with the ending's message
    when the request was refused, failed, or ended before its first token."""
    fold = Generation()
    for update in updates:
        if isinstance(update, Ended):
            if not update.ok or fold.run.done is None:  # refused, failed, or stopped before it started
                raise HiSpecError(update.message)
            yield fold.response(html_of(fold.run))  # a fault here: app.py's message, not Gradio's generic one
            return
        if isinstance(update, Output):
            fold.add(update.items)
        yield {"status": update.text if isinstance(update, Status) else
               f"generating: {fold.run.stats.new_tokens} tokens"}
