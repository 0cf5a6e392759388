"""The page's event handlers: a visitor's values in, serving's updates out as components.

No threads, locks or timers here: every request goes to serving (hispec.serving.session.Server),
which admits it, queues it, runs it and ends it; these functions name the request and turn its
updates into what the page shows.
"""

from __future__ import annotations

import html

import gradio as gr

from hispec.errors import HiSpecError
from hispec.explain import what_if as what_ifs
from hispec.runs.replay import rounds_of
from hispec.explain.why import explained_costs, slider_values, speed_story
from hispec.runs.trace import Trace
from hispec.serving.api import (BeliefsRequest, CompareRequest, CostsRequest, GenerateRequest, LoadRequest,
                               WhatIfRequest)
from hispec.serving.answer import api_answer
from hispec.serving.session import Server
from hispec.serving.updates import Ended, Output, Status
from hispec.text import sentence
from ui import charts, controls, labels, render, stepper, token_story, why_view
from ui.beliefs_view import beliefs_html
from ui.generate_view import GenerateView, WhatIfView, cleared
from ui.settings import PageSettings
from ui.model_view import model_defaults, model_info, settings_by_method, trained_layers
from ui.steps_view import round_html

GENERATION_KINDS = ("generate", "compare", "what_if")  # what the page's Stop ends
WHY_HINT = render.message_html("Generate once: the run's acceptance and this machine's pass costs then explain its "
                               "speed here.", "info")
BUSY_HINT = render.message_html("The run is under way: why it was (or was not) faster shows here once it ends, after "
                                "the timing pairs when asked for.", "info")


class Handlers:
    def __init__(self, server: Server, published_points: list[dict] | None = None):
        self.server = server
        self.published = published_points or []

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

    # ---- what if, compare -----------------------------------------------------------------------
    def what_if(self, settings: PageSettings, last_run=None, why_dv=0.5, why_vt=0.5,
                what_if_takes=what_ifs.DEFAULT_TAKES, request: gr.Request = None):
        """The real engine on the last run's own level list, policy and lengths, with TIMING ONLY verdicts
        at the sliders' acceptance, each take after a real plain run: what better levels would give here.
        A list the drawn verdicts cannot model is named, and nothing runs."""
        try:
            replay = what_ifs.replay_of(last_run)
        except HiSpecError as exc:
            yield {"what_if_status": render.message_html(str(exc), "info")}
            return
        yield {"what_if_status": render.message_html(f"Starting a what-if run of {replay.words}…", "info"),
               "what_if_tokens": "", "what_if_stats": "", "what_if_plot": gr.Plot(None, visible=False),
               "what_if_result": None}
        own = replay.request_fields() | {"draft_layer": None, "verify_layer": None, "draft_len": None,
                                         "verify_threshold": None}  # the run's list and lengths, not the sliders'
        raw = {"generate": settings.request(**own), "policy": replay.policy,
               "a_dv": why_dv, "a_vt": why_vt, "takes": what_if_takes}
        view = WhatIfView()
        for update in self.server.submit(self.server.caller(request), WhatIfRequest, raw):
            yield view.update(update)

    def compare(self, settings: PageSettings, baselines=("Autoregressive",), repeats=3, request: gr.Request = None):
        """(top status, compare status, table, chart) by name: the progress shows at the top of the page too."""
        raw = {"generate": settings.request(baseline=0),
               "baselines": [labels.BASELINES.get(b, b) for b in baselines or []], "repeats": repeats}
        starting = render.message_html("Compare: starting…", "info")
        yield {"status": starting, "compare_status": starting, "compare_out": "",
               "compare_plot": gr.Plot(None, visible=False)}  # nothing of an earlier comparison stays
        temperature = settings.temperature
        sampling, shown = bool(temperature), {}
        for update in self.server.submit(self.server.caller(request), CompareRequest, raw):
            if isinstance(update, Status):
                status = render.message_html("Compare: " + labels.running_words(update.text), "info")
                yield {"status": status, "compare_status": status}
            elif isinstance(update, Output):
                for item in update.items:
                    shown = {"compare_out": render.compare_table(item["rows"], sampling=sampling, order=item["order"]),
                             "compare_plot": gr.Plot(charts.compare_figure(item["rows"]), visible=True)}
                    yield shown
            elif not update.ok:
                error = render.message_html(update.message)
                yield {"status": error, "compare_status": error, "compare_out": "",
                       "compare_plot": gr.Plot(None, visible=False)}
            else:  # the last update sends the result again: the stream ends on it (and its chart shown)
                done = render.message_html("Comparison done." if update.outcome == "done" else update.message, "info")
                yield {"status": done, "compare_status": done} | shown

    # ---- the model ------------------------------------------------------------------------------
    def load(self, model, request: gr.Request = None):
        """Load a model (the allow-list applies), then set the controls (by name) to its own settings."""
        for update in self.server.submit(self.server.caller(request), LoadRequest, {"model": model}):
            if isinstance(update, Status):
                yield {"status": render.message_html(update.text, "info")}
            elif isinstance(update, Output) and update.items:
                lm = update.items[0]
                L, preset = lm.ee.num_layers, model_defaults(lm)
                yield {"status": render.message_html(f"Loaded {model}.", "info"), "info": model_info(model, lm),
                       "draft_layer": gr.update(maximum=L - 1, value=preset.draft_layer),
                       "verify_layer": gr.update(maximum=L - 1, value=preset.verify_layer), "num_layers": L,
                       "draft_len": gr.update(value=preset.draft_len),
                       "verify_threshold": gr.update(value=preset.verify_threshold),
                       "head_layers": trained_layers(lm), "method_settings": settings_by_method(lm),
                       # a list this model can run (no 4-bit copy: its own)
                       "levels": labels.default_levels(lm.ee.formats())}
            elif isinstance(update, Ended) and not update.ok:
                yield {"status": render.message_html(update.message)}

    def loaded(self, model):
        """A model already loaded, by a name the visitor may use (a preset reads its settings)."""
        name = self.server.limits.check_model(model or self.server.default_model)
        if name not in self.server.registry.loaded():
            raise HiSpecError(f"model '{name}' is not loaded yet: press Load first")
        return self.server.registry.get(name)

    def preset(self, preset_choice, model) -> dict:
        """HiSpec with fixed rounds at a named setting of this model (controls.PRESETS), by control name."""
        try:
            lm = self.loaded(model)
        except HiSpecError as exc:
            return {"status": render.message_html(str(exc))}
        return controls.preset_values(preset_choice, model_defaults(lm))

    # ---- why this speed -------------------------------------------------------------------------
    def why(self, run, a_dv, a_vt, what_if=None, request: gr.Request = None):
        """The run's measured speed, plan by plan, next to the cost model's estimates; at the sliders'
        acceptance, the estimate for the run's fixed shape and a what-if run's result if one ran there."""
        if run is None:
            return WHY_HINT, gr.skip()
        lanes, whose = explained_costs(run, run.exact_exits)  # kept with the run: later runs cannot rewrite them
        if lanes is None:
            try:
                lanes, whose = {None: self._costs(run.model, run.exact_exits, request)}, None
            except HiSpecError as exc:
                return render.message_html(str(exc)), gr.skip()
        story = speed_story(run, lanes, (float(a_dv), float(a_vt)), what_if, frozen=whose)
        if story.get("sliders") is None and what_if and tuple(what_if.get("rates") or ()) == (round(float(a_dv), 2),
                                                                                             round(float(a_vt), 2)):
            story["what_if"] = what_if  # no slider estimate for its plans: the what-if's row still joins the table
        view = why_view.why_html(story) + render.published_html(self.published)
        if not story.get("curves"):
            return view, gr.Plot(None, visible=False)
        return view, gr.Plot(charts.why_figure(story["curves"], story["points"], story["axis"], self.published),
                             visible=True)

    def _costs(self, model: str, exits_used: tuple[int, ...], request):
        lm = self.loaded(model)
        known = getattr(lm.ee, "cost_model", None)
        if known is not None and known.covers(exits_used):  # timed before: nothing to run, no need to wait
            return known
        return self.server.result(self.server.caller(request), CostsRequest, {"model": model, "exits": exits_used})

    def why_after_run(self, last_run, request: gr.Request = None) -> dict:
        """After a run, by name: the sliders take the run's own measured pairs (named after them), the
        what-if names the list it will run, and the view is redrawn."""
        if last_run is None:  # a new run starting, or an error: the last run's explanation goes too
            return {"why_out": WHY_HINT, "why_plot": gr.Plot(None, visible=False), "what_if_levels": ""}
        out = {}
        if explained_costs(last_run, last_run.exact_exits)[0] is None:  # kept from its first explanation on
            try:
                costs = self._costs(last_run.model, last_run.exact_exits, request)
            except HiSpecError:
                costs = None  # the view below says why
            if costs is not None:
                last_run = out["last_run"] = last_run.with_costs({None: costs}, "first")
        try:
            note = render.message_html(what_if_words(what_ifs.replay_of(last_run)), "info")
        except HiSpecError as exc:
            note = render.message_html(f"What if: {exc}", "info")
        a_dv, a_vt, names = slider_values(last_run)
        a_vt = 0.5 if a_vt is None else round(a_vt, 2)
        a_dv = a_vt if a_dv is None else round(a_dv, 2)
        view, plot = self.why(last_run, a_dv, a_vt, None, request)
        out |= {"why_out": view, "why_plot": plot, "what_if_levels": note}
        if names:  # the sliders vary the plan that committed the most tokens, named by its own pairs
            out["why_dv"] = gr.update(value=a_dv, label=f"Acceptance {names['low_pair']}" if names["low_pair"]
                                      else "Acceptance of a middle level (none in this plan)",
                                      info=f"{names['words']}: its own pair, measured; move it to ask what if")
            out["why_vt"] = gr.update(value=a_vt, label=f"Acceptance {names['full_pair']}",
                                      info="the full model's verdicts on what reaches it, measured on this run")
        return out

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
            beliefs = None
            if run.token_ids and run.prompt_ids:
                beliefs = self.server.result(self.server.caller(request), BeliefsRequest, {
                    "model": run.model, "prompt_ids": list(run.prompt_ids), "token_ids": list(run.token_ids),
                    "formats": list(run.formats)})  # the run's 4-bit level gets its row of candidates
            beliefs_view = beliefs_html(beliefs) if beliefs else render.message_html("No token was generated.", "info")
        except HiSpecError as exc:
            beliefs, beliefs_view = None, render.message_html(f"What each exit believes: {exc}")
        return (rounds, gr.update(value=start, maximum=max(len(rounds) - 1, 1)), view, beliefs_view,
                token_story.explain_all_html(trace, beliefs, run))


def _pairs(value) -> int:
    """The plain-baseline pairs a page value asks for, for the status's words (serving checks the value
    itself): a slider's 2.0 is 2; anything that is not a number, 0."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def what_if_words(replay: what_ifs.Replay) -> str:
    """The list a what-if will run, said above its button."""
    middle = "the left slider for the middle level's verdicts, " if replay.dv_pair else ""
    return (f"What if runs this run's own levels: {replay.words}, with verdicts drawn at the sliders' acceptance "
            f"({middle}the right one for the full model's, on whatever reaches it).")


def stale_panels() -> dict:
    """A new run starts: the last run's what-if, comparison and "Why this speed" panels are emptied,
    not left beside it, and the last Stop's reply goes (by name)."""
    hidden = gr.Plot(None, visible=False)
    return {"what_if_status": "", "what_if_tokens": "", "what_if_stats": "", "what_if_plot": hidden,
            "what_if_result": None, "compare_out": "", "compare_plot": hidden, "why_out": BUSY_HINT,
            "why_plot": hidden, "stop_note": ""}
