"""The controls of "Step through the run": a round slider, Previous / Next, and Play on a timer.
Plain functions of the replayed rounds (hispec.runs.replay) and the run kept by the page."""

from __future__ import annotations

import gradio as gr

from ui import render, token_story
from ui.steps_view import round_html

STEP_HINT = render.message_html("Generate once: each round of the run then shows here, step by step.", "info")
BELIEFS_HINT = render.message_html("Generate once: what each exit predicted at every token then shows here.", "info")
# while a run (and the timing pairs after it) is under way: it is coming, not to be asked for
STEP_BUSY = render.message_html("The run is under way: its rounds show here, step by step, once it ends (after the "
                                "timing pairs, when asked for).", "info")
BELIEFS_BUSY = render.message_html("The run is under way: what each exit predicted shows here once it ends.", "info")


def cleared():
    """A new run starts: nothing of the last run's analysis stays (rounds, slider, round view, beliefs
    view, token stories, the Play timer and its button); the views say the run is coming."""
    return (None, gr.update(value=0, maximum=1), STEP_BUSY, BELIEFS_BUSY, token_story.HINT,
            gr.Timer(active=False), "Play ▶")


def idle():
    """No run to analyse (it failed, or none ran): (rounds, slider, round view, beliefs view, token stories)."""
    return None, gr.update(value=0, maximum=1), STEP_HINT, BELIEFS_HINT, token_story.HINT


def show_round(rounds, i, run):
    """Round i of the run, kept inside it."""
    if not rounds or not run:
        return STEP_HINT
    i = min(max(int(i), 0), len(rounds) - 1)
    return round_html(rounds, i, run.spec)


def step(rounds, i, delta):
    """The round `delta` away, kept inside the run."""
    if not rounds:
        return gr.skip()
    return min(max(int(i) + delta, 0), len(rounds) - 1)


def play(playing):
    """Play / pause: a timer steps through the rounds."""
    playing = not playing
    return playing, gr.Timer(active=playing), "Pause ⏸" if playing else "Play ▶"


def tick(rounds, i):
    """One step of Play; at the last round the timer stops."""
    if not rounds or int(i) >= len(rounds) - 1:
        return gr.skip(), False, gr.Timer(active=False), "Play ▶"
    return int(i) + 1, True, gr.skip(), gr.skip()
