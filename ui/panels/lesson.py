"""The Lesson panel: a recorded run (hispec.runs.lessons) replayed into the run's own views at its recorded
pace, with no model time spent, so that a class can watch at once. It writes what Generate writes (VIEWS, and
the prompt it was asked), and the panels that follow a run (Why, Steps) then read the lesson's record as they
read a live one: its costs, its timing pairs and what each exit believed travel with it."""

from __future__ import annotations

from hispec.runs.lessons import Lesson as Recorded
from hispec.runs.lessons import paced
from hispec.serving.updates import Ended, Output
from ui import render
from ui.generate_view import VIEWS, GenerateView, cleared
from ui.panels.generate import STALE, stale_panels
from ui.panels.wiring import bind

WRITES = (*VIEWS, "prompt")


class Lesson:
    """Reads `lesson_choice`, writes WRITES; `follow`: the panels that show a finished run (Why, Steps)."""

    def __init__(self, lessons: list[Recorded], follow=(), speed: float = 1.0):
        self.lessons = {lesson.title: lesson for lesson in lessons}
        self.follow, self.speed = tuple(follow), speed

    def wire(self, p) -> None:
        trigger = p.lesson_btn.click
        for panel in self.follow:
            panel.run_starts(p, trigger)
        trigger(*bind(stale_panels, p, (), STALE), api_name=False, queue=False)
        # outside serving's queue and limits: a replay never waits for the model, nor holds it
        run = trigger(*bind(self.replay, p, ("lesson_choice",), WRITES), concurrency_limit=None, api_name=False)
        for panel in self.follow:
            panel.run_ends(p, run)

    def replay(self, lesson_choice):
        """The lesson's views by name, round by round at its recorded pace; its own record kept last."""
        lesson = self.lessons.get(lesson_choice)
        if lesson is None:
            yield cleared(render.message_html(f"Pick a lesson from the list (got {lesson_choice!r}).", "info"))
            return
        record = lesson.record
        yield cleared(render.message_html(f"Replaying a run recorded on {lesson.machine}: no model time is spent, "
                                          "and every figure is that machine's.", "info")) | {"prompt": lesson.prompt}
        view = GenerateView(record.model, doing="Replaying")
        view.update(Output(({"levels": list(record.spec), "prompt_ids": list(record.prompt_ids),
                             "vs_plain": None if record.vs_plain is None else dict(record.vs_plain)},)))
        for batch in paced(record, self.speed):
            shown = view.update(Output(tuple(batch)))
            if shown:
                yield shown
        view.load = ((record.recorded_on or {}).get("loadavg_start"), "when recorded")
        last = view.update(Ended("done", ""))
        words = render.reason_words(record.finish_reason or "")
        status = (f"Lesson replayed: {len(record.token_ids)} tokens (stopped by {words}), recorded on {lesson.machine}. "
                  "Generate runs the same prompt live on this machine.")
        yield last | {"status": render.message_html(status, "info"), "last_run": record}
