"""The Generate panel: the prompt's Generate (and its Enter), the Stop, the tokens' view, and /generate.

A run's views are written by name (generate_view.VIEWS). The panels that show a finished run (Why, Steps)
follow it: each clears its views as a run starts (`run_starts(page, trigger)`) and reads the finished run
after it (`run_ends(page, run)`), every one on its own event, so that one failing leaves the others.
"""

from __future__ import annotations

import inspect
import logging

import gradio as gr

from hispec.errors import HiSpecError
from hispec.serving.answer import api_answer
from hispec.serving.api import GenerateRequest, api_signature
from hispec.serving.edge import STOP_EVENT
from hispec.serving.session import Server
from hispec.text import sentence
from ui import render
from ui.generate_view import VIEWS, GenerateView, cleared
from ui.panels.wiring import SETTINGS, bind
from ui.settings import PageSettings

GENERATION_KINDS = ("generate", "compare", "what_if")  # what the page's Stop ends
BUSY_HINT = render.message_html("The run is under way: why it was (or was not) faster shows here once it ends, after "
                                "the timing pairs when asked for.", "info")
# what a new run empties: the last run's what-if, comparison, "Why this speed" (its acceptance by position too),
# and the last Stop's reply
STALE = ("what_if_status", "what_if_tokens", "what_if_stats", "what_if_plot", "what_if_plans", "what_if_result",
         "compare_out",
         "compare_plot", "why_out", "why_plot", "position_plot", "position_note", "stop_note")
log = logging.getLogger("hispec.app")


class Generate:
    """Reads the settings (ui.settings.PageSettings: the prompt and the settings column), writes VIEWS;
    the Stop writes `stop_note`; `follow`: the panels that show a finished run (Why, Steps)."""

    def __init__(self, server: Server, follow=()):
        self.server = server
        self.follow = tuple(follow)

    def wire(self, p) -> None:
        """Gradio starts every request at once (concurrency_limit=None): serving queues them for the model's
        turn, so that a Stop reaches a job that is still waiting."""
        for trigger in (p.generate_btn.click, p.prompt.submit):
            for panel in self.follow:
                panel.run_starts(p, trigger)
            trigger(*bind(stale_panels, p, (), STALE), api_name=False, queue=False)
            # busy: Generate waits for this run (and its timing pairs) to end
            trigger(lambda: gr.update(interactive=False, value="Generating…"), None, [p.generate_btn], api_name=False,
                    queue=False)
            run = trigger(*bind(self.generate, p, SETTINGS, VIEWS), concurrency_limit=None, api_name=False)
            run.then(lambda: gr.update(interactive=True, value="Generate"), None, [p.generate_btn], api_name=False,
                     queue=False)
            for panel in self.follow:  # the views after the run, each on its own: one failing leaves the other
                panel.run_ends(p, run)
        # outside the queue: a Stop is never refused, nor waits behind the jobs it stops
        # its reply goes beside the status, never into it: the run alone writes the status line
        p.stop_btn.click(self.stop, None, [p.stop_note], queue=False, api_name=STOP_EVENT)  # counted as a Stop (serving.edge)
        p.show_rejected.change(None, [p.show_rejected], None, api_name=False, queue=False,
                               js="(show) => { document.querySelector('#hs-tokens')"
                                  ".classList.toggle('hs-hide-rejected', !show); return []; }")
        gr.api(self.endpoint(), api_name="generate", concurrency_limit=None)

    # ---- generate, stop ---------------------------------------------------------------------------
    def generate(self, settings: PageSettings, request: gr.Request = None):
        """The run's views by name (generate_view.VIEWS), update by update."""
        yield cleared(render.message_html("Starting…", "info"))  # nothing of the last run stays
        raw = settings.request()
        view = GenerateView(settings.model, pairs=_pairs(raw["baseline"]))
        for update in self.server.submit(self.server.caller(request), GenerateRequest, raw):
            yield view.update(update)

    def stop(self, request: gr.Request = None) -> str:
        """The Stop button's reply, shown beside the status (never in it: the run's own last word stays)."""
        n = self.server.stop(self.server.caller(request), GENERATION_KINDS)
        if n:
            return render.message_html("Stopping: the run ends after its current round.", "info")
        # a request sent just before the Stop may not be registered yet: serving remembers the Stop for it
        return render.message_html("Nothing to stop: no request of yours is running (one sent just before this "
                                   "Stop is stopped as it arrives).", "info")

    def api_generate(self, request: gr.Request = None, **fields):
        """/generate: progress as {"status": ...} while it runs, then the result (assembled by serving.answer);
        bad input raises an error naming what is wrong and what is allowed."""
        updates = self.server.submit(self.server.caller(request), GenerateRequest, fields)
        try:
            yield from api_answer(updates, lambda run: render.tokens_html(run.trace, run.levels),
                                  model=fields.get("model") or self.server.default_model)
        except HiSpecError as exc:
            raise gr.Error(sentence(str(exc)), print_exception=False) from None

    def endpoint(self):
        """/generate with GenerateRequest's fields as named inputs (serving.api declares them once)."""
        fields = api_signature()
        request = inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                    annotation=gr.Request)
        full = fields.replace(parameters=[*fields.parameters.values(), request])

        def generate(*args, **kwargs):
            bound = full.bind(*args, **kwargs)
            bound.apply_defaults()
            values = dict(bound.arguments)
            try:
                yield from self.api_generate(request=values.pop("request"), **values)
            except gr.Error:
                raise
            except Exception as exc:  # a fault while the answer is built: the app's message, not Gradio's generic one
                log.exception("/generate failed while its answer was built")
                raise gr.Error(f"The generation failed while its answer was built ({type(exc).__name__}: {exc}). "
                               "The app is still running; try again.", print_exception=False) from None

        generate.__signature__ = full
        generate.__annotations__ = {name: param.annotation for name, param in full.parameters.items()} | {"return": dict}
        generate.__doc__ = self.api_generate.__doc__
        return generate


def _pairs(value) -> int:
    """The plain-baseline pairs a page value asks for, for the status's words (serving checks the value
    itself): a slider's 2.0 is 2; anything that is not a number, 0."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def stale_panels() -> dict:
    """A new run starts: the last run's what-if, comparison and "Why this speed" panels are emptied,
    not left beside it, and the last Stop's reply goes (by name)."""
    hidden = gr.Plot(None, visible=False)
    return {"what_if_status": "", "what_if_tokens": "", "what_if_stats": "", "what_if_plot": hidden,
            "what_if_plans": "", "what_if_result": None, "compare_out": "", "compare_plot": hidden, "why_out": BUSY_HINT,
            "why_plot": hidden, "position_plot": hidden, "position_note": "", "stop_note": ""}
