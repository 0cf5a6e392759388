"""The page's event handlers: a visitor's values in, serving's updates out as components.

No threads, locks or timers here: every request goes to serving (hispec.serving.session.Server),
which admits it, queues it, runs it and ends it; these functions name the request and turn its
updates into what the page shows.
"""

from __future__ import annotations

import html

import gradio as gr

from hispec.engine.events import event_from_dict
from hispec.engine.levels import exits_by_role
from hispec.errors import HiSpecError
from hispec.explain import what_if as what_ifs
from hispec.runs.replay import replay_from_dicts
from hispec.explain.speed_model import RoundShape, measured_pairs
from hispec.explain.why import explained_costs, keep_costs, speed_story
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
from ui.model_view import model_defaults, model_info, settings_by_method, trained_layers
from ui.steps_view import round_html

GENERATION_KINDS = ("generate", "compare", "what_if")  # what the page's Stop ends
WHY_HINT = render.message_html("Generate once: the run's acceptance and this machine's pass costs then explain its "
                               "speed here.", "info")


def page_request(prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold, max_new_tokens, chat,
                 temperature=0.0, top_k=0, top_p=1.0, seed=-1, policy=labels.DEFAULT_POLICY_LABEL,
                 baseline=0, levels="") -> dict:
    """The page's values as GenerateRequest's raw fields (labels mapped to the engine's names)."""
    return {"prompt": prompt, "model": model, "method": labels.method_name(method),
            "policy": labels.policy_name(policy), "draft_layer": draft_layer, "verify_layer": verify_layer,
            "draft_len": draft_len, "verify_threshold": verify_threshold, "max_new_tokens": max_new_tokens,
            "chat": bool(chat), "temperature": temperature, "top_k": top_k, "top_p": top_p, "seed": seed,
            "baseline": baseline,
            # the Levels box belongs to HiSpec: the other methods have lists of their own
            "levels": (labels.levels_name(levels) or None) if labels.method_name(method) == "hispec" else None}


class Handlers:
    def __init__(self, server: Server, published_points: list[dict] | None = None):
        self.server = server
        self.published = published_points or []

    # ---- generate, stop ---------------------------------------------------------------------------
    def generate(self, prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold, max_new_tokens,
                 chat, temperature=0.0, top_k=0, top_p=1.0, seed=-1, policy=labels.DEFAULT_POLICY_LABEL,
                 baseline=0, levels="", request: gr.Request = None):
        yield cleared(render.message_html("Starting…", "info"))  # nothing of the last run stays
        raw = page_request(prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold,
                           max_new_tokens, chat, temperature, top_k, top_p, seed, policy, baseline, levels)
        view = GenerateView(model, pairs=_pairs(raw["baseline"]))
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
            yield from api_answer(updates, lambda run: render.tokens_html(run.trace, run.done.settings))
        except HiSpecError as exc:
            raise gr.Error(sentence(str(exc)), print_exception=False) from None

    # ---- what if, compare -----------------------------------------------------------------------
    def what_if(self, prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold, max_new_tokens,
                chat, temperature, top_k, top_p, seed, a_dv, a_vt, takes=what_ifs.DEFAULT_TAKES,
                request: gr.Request = None):
        """The real engine with TIMING ONLY verdicts at the sliders' acceptance, each take after a
        real plain run of the same length: what better exits would give on this machine."""
        yield render.message_html("Starting a what-if run…", "info"), "", "", gr.Plot(None, visible=False), None
        raw = {"generate": page_request(prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold,
                                        max_new_tokens, chat, temperature, top_k, top_p, seed),
               "a_dv": a_dv, "a_vt": a_vt, "takes": takes}
        view = WhatIfView()
        for update in self.server.submit(self.server.caller(request), WhatIfRequest, raw):
            yield view.update(update)

    def compare(self, prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold, max_new_tokens,
                chat, temperature, top_k, top_p, seed, policy=labels.DEFAULT_POLICY_LABEL,
                baselines=("Autoregressive",), repeats=3, levels="", request: gr.Request = None):
        """(top status, compare status, table, chart): the progress shows at the top of the page too."""
        raw = {"generate": page_request(prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold,
                                        max_new_tokens, chat, temperature, top_k, top_p, seed, policy,
                                        levels=levels),
               "baselines": [labels.BASELINES.get(b, b) for b in baselines or []], "repeats": repeats}
        starting = render.message_html("Compare: starting…", "info")
        yield starting, starting, "", gr.Plot(None, visible=False)  # nothing of an earlier comparison stays
        sampling, table, figure = bool(temperature), gr.skip(), gr.skip()
        for update in self.server.submit(self.server.caller(request), CompareRequest, raw):
            if isinstance(update, Status):
                status = render.message_html("Compare: " + labels.running_words(update.text), "info")
                yield status, status, gr.skip(), gr.skip()
            elif isinstance(update, Output):
                for item in update.items:
                    table = render.compare_table(item["rows"], sampling=sampling, order=item["order"])
                    figure = gr.Plot(charts.compare_figure(item["rows"]), visible=True)
                    yield gr.skip(), gr.skip(), table, figure
            elif not update.ok:
                error = render.message_html(update.message)
                yield error, error, "", gr.Plot(None, visible=False)
            else:  # the last update sends the result again: the stream ends on it (and its chart shown)
                done = render.message_html("Comparison done." if update.outcome == "done" else update.message, "info")
                yield done, done, table, figure

    # ---- the model ------------------------------------------------------------------------------
    def load(self, model, request: gr.Request = None):
        """Load a model (the allow-list applies), then set the controls to its own settings."""
        for update in self.server.submit(self.server.caller(request), LoadRequest, {"model": model}):
            if isinstance(update, Status):
                yield (render.message_html(update.text, "info"),) + (gr.skip(),) * 9
            elif isinstance(update, Output) and update.items:
                lm = update.items[0]
                L, preset = lm.ee.num_layers, model_defaults(lm)
                yield (render.message_html(f"Loaded {model}.", "info"), model_info(model, lm),
                       gr.update(maximum=L - 1, value=preset.draft_layer),
                       gr.update(maximum=L - 1, value=preset.verify_layer), L,
                       gr.update(value=preset.draft_len), gr.update(value=preset.verify_threshold),
                       trained_layers(lm), settings_by_method(lm),
                       labels.default_levels(lm.ee.formats()))  # a list this model can run (no 4-bit copy: its own)
            elif isinstance(update, Ended) and not update.ok:
                yield (render.message_html(update.message),) + (gr.skip(),) * 9

    def loaded(self, model):
        """A model already loaded, by a name the visitor may use (a preset reads its settings)."""
        name = self.server.limits.check_model(model or self.server.default_model)
        if name not in self.server.registry.loaded():
            raise HiSpecError(f"model '{name}' is not loaded yet: press Load first")
        return self.server.registry.get(name)

    def preset(self, choice, model):
        """HiSpec with fixed rounds at a named setting of this model (controls.PRESETS)."""
        try:
            lm = self.loaded(model)
        except HiSpecError as exc:
            return (render.message_html(str(exc)),) + (gr.skip(),) * 7
        return controls.preset_values(choice, model_defaults(lm))

    # ---- why this speed -------------------------------------------------------------------------
    def why(self, run, a_dv, a_vt, what_if=None, request: gr.Request = None):
        """The run's measured speed, plan by plan, next to the cost model's estimates; at the sliders'
        acceptance, the estimate for the run's fixed shape and a what-if run's result if one ran there."""
        if not run:
            return WHY_HINT, gr.skip()
        settings = run["settings"]
        exits_used = tuple(sorted(exits_by_role(tuple(settings.get("levels") or ())).values()))
        costs, whose = explained_costs(run, exits_used)  # kept with the run: later runs cannot rewrite them
        if costs is None:
            try:
                costs = self._costs(run["model"], exits_used, request)
            except HiSpecError as exc:
                return render.message_html(str(exc)), gr.skip()
            keep_costs(run, costs)  # the run (this page's state) keeps them from its first explanation on
            whose = "first"
        story = speed_story(run, costs, (float(a_dv), float(a_vt)), what_if, frozen=whose)
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

    def why_after_run(self, run, request: gr.Request = None):
        """After a run: the sliders take the measured acceptance, and the view is redrawn."""
        if not run:  # a new run starting, or an error: the last run's explanation goes too
            return gr.skip(), gr.skip(), WHY_HINT, gr.Plot(None, visible=False)
        a_dv, a_vt = measured_pairs(run["stats"]["acceptance"], RoundShape.from_settings(run["settings"]).kind)
        a_vt = 0.5 if a_vt is None else round(a_vt, 2)
        a_dv = a_vt if a_dv is None else round(a_dv, 2)
        return (a_dv, a_vt) + self.why(run, a_dv, a_vt, None, request)

    # ---- after a run: its rounds, what each exit believed, every token's story ------------------
    def after_run(self, run, request: gr.Request = None):
        """(rounds, round slider, round view, beliefs view, token explanations) of a finished run."""
        if not run or not run.get("events"):
            return stepper.cleared()[:5]
        rounds = replay_from_dicts(run["events"])
        settings, token_ids = run["settings"], run["token_ids"]
        start = 1 if len(rounds) > 1 else 0  # the first decoding round (round 0 is the prompt's prefill)
        view = round_html(rounds, start, settings)
        trace = Trace()
        for data in run["events"]:
            trace.add(event_from_dict(data))
        try:
            beliefs = None
            if token_ids and run.get("prompt_ids"):
                beliefs = self.server.result(self.server.caller(request), BeliefsRequest, {
                    "model": run["model"], "prompt_ids": run["prompt_ids"], "token_ids": token_ids})
            beliefs_view = beliefs_html(beliefs) if beliefs else render.message_html("No token was generated.", "info")
        except HiSpecError as exc:
            beliefs, beliefs_view = None, render.message_html(f"What each exit believes: {exc}")
        return (rounds, gr.update(value=start, maximum=max(len(rounds) - 1, 1)), view, beliefs_view,
                token_story.explain_all_html(trace, beliefs, settings))


def _pairs(value) -> int:
    """The plain-baseline pairs a page value asks for, for the status's words (serving checks the value
    itself): a slider's 2.0 is 2; anything that is not a number, 0."""
    try:
        return max(0, int(value))
    except (TypeError, ValueError, OverflowError):
        return 0


def stale_panels() -> tuple:
    """A new run starts: the last run's what-if, comparison and "Why this speed" panels are emptied,
    not left beside it (what_if status, tokens, stats, chart, result; compare table, chart; why, chart;
    the last Stop's reply)."""
    return ("", "", "", gr.Plot(None, visible=False), None, "", gr.Plot(None, visible=False), WHY_HINT,
            gr.Plot(None, visible=False), "")
