"""The Steps panel: a finished run round by round (its rounds replayed from the recorded events), what
each exit believed, and every token's story. It follows Generate (Generate's `follow`): cleared as a run
starts, filled once it ends."""

from __future__ import annotations

from functools import partial

import gradio as gr

from hispec.errors import HiSpecError
from hispec.runs.replay import rounds_of
from hispec.runs.trace import Trace
from hispec.serving.api import BeliefsRequest
from hispec.serving.session import Server
from ui import render, stepper, token_story
from ui.beliefs_view import beliefs_html
from ui.panels.wiring import components
from ui.steps_view import round_html

ANALYSIS = ("rounds_state", "step_round", "step_view", "beliefs_view", "explain_all")  # after_run's outputs, in order


class Steps:
    """Reads `last_run`, writes ANALYSIS; the round slider, its buttons and the play timer step through it."""

    def __init__(self, server: Server):
        self.server = server

    def run_starts(self, p, trigger) -> None:
        trigger(stepper.cleared, None, components(p, *ANALYSIS, "timer", "play_btn"), api_name=False, queue=False)

    def run_ends(self, p, run) -> None:
        run.then(self.after_run, [p.last_run], components(p, *ANALYSIS), api_name=False)

    def wire(self, p) -> None:
        p.step_round.change(stepper.show_round, [p.rounds_state, p.step_round, p.last_run], [p.step_view],
                            api_name=False, queue=False)
        p.prev_btn.click(partial(stepper.step, delta=-1), [p.rounds_state, p.step_round], [p.step_round],
                         api_name=False, queue=False)
        p.next_btn.click(partial(stepper.step, delta=1), [p.rounds_state, p.step_round], [p.step_round],
                         api_name=False, queue=False)
        p.play_btn.click(stepper.play, [p.playing], [p.playing, p.timer, p.play_btn], api_name=False, queue=False)
        p.timer.tick(stepper.tick, [p.rounds_state, p.step_round], [p.step_round, p.playing, p.timer, p.play_btn],
                     api_name=False)

    # ---- after a run: its rounds, what each exit believed, every token's story ------------------
    def after_run(self, run, request: gr.Request = None):
        """(rounds, round slider, round view, beliefs view, token explanations) of a finished run."""
        if run is None or not run.events:
            return stepper.idle()
        rounds = rounds_of(run)
        start = 1 if len(rounds) > 1 else 0  # the first decoding round (round 0 is the prompt's prefill)
        view = round_html(rounds, start, run.spec)
        trace = Trace()
        for ev in run.events:
            trace.add(ev)
        try:
            beliefs = run.beliefs  # a recorded run (a lesson) brings its own: no model time
            if beliefs is None and run.token_ids and run.prompt_ids:
                beliefs = self.server.result(self.server.caller(request), BeliefsRequest, {
                    "model": run.model, "prompt_ids": list(run.prompt_ids), "token_ids": list(run.token_ids),
                    "formats": list(run.formats)})  # the run's 4-bit level gets its row of candidates
            beliefs_view = beliefs_html(beliefs) if beliefs else render.message_html("No token was generated.", "info")
        except HiSpecError as exc:
            beliefs, beliefs_view = None, render.message_html(f"What each exit believes: {exc}")
        return (rounds, gr.update(value=start, maximum=max(len(rounds) - 1, 1)), view, beliefs_view,
                token_story.explain_all_html(trace, beliefs, run))
