"""HiSpec demo: watch hierarchical speculative decoding token by token.

Run `python app.py` (127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT override; the limits and
the model allow-list are HISPEC_* settings, see README "Hosting it in public"). This file only wires
the page: the layout is ui/page.py, the handlers ui/controller.py, and every request is served by
hispec/serving (admission, limits, queue, the model's turn, Stop, the time limit).
"""

from __future__ import annotations

if __name__ == "__main__":  # before anything is loaded: glibc reads MALLOC_ARENA_MAX once, as the process starts
    from hispec.serving.memory import arenas_limited_on_spaces

    arenas_limited_on_spaces()  # on a Space: this command again, with at most two malloc arenas

try:  # ZeroGPU on Hugging Face Spaces: `spaces` must be imported before torch
    import spaces  # noqa: F401
except ImportError:  # pragma: no cover - spaces is in requirements, but the app runs without it
    spaces = None

import inspect
import logging
import os
import sys
from functools import partial
from pathlib import Path

import gradio as gr

from hispec.errors import HiSpecError
from hispec.evaluation import published
from hispec.model.default_gguf import default_gguf_present, fetch_default_gguf
from hispec.runs.runner import warm_up
from hispec.serving.api import api_signature
from hispec.serving.caller import forwarded_headers_left_to_serving
from hispec.serving.edge import STOP_EVENT, Edge
from hispec.serving.limits import LAYERSKIP_CHECKPOINT, Limits, on_spaces
from hispec.serving.registry import ModelRegistry
from hispec.serving.session import Server
from ui import bench_tab, controls, labels, stepper, token_story
from ui.controller import Handlers, stale_panels
from ui.model_view import model_defaults, model_info, settings_by_method, trained_layers
from ui.generate_view import VIEWS, WHAT_IF_VIEWS
from ui.page import Setup, build_page
from ui.settings import PageSettings, by_name

ASSETS = Path(__file__).parent / "assets"
TITLE = "HiSpec: hierarchical speculative decoding"
log = logging.getLogger("hispec.app")


def build(server: Server, model_choices: list[str] | None = None) -> gr.Blocks:
    """The page for a server whose start model is loaded; `model_choices`: what the model box offers
    (only names the server allows are kept)."""
    lm = server.registry.get(server.default_model)
    allowed = server.limits.allowed_models
    choices = [m for m in (model_choices or [server.default_model]) if m in allowed] or [server.default_model]
    setup = Setup(server.default_model, choices, "*" in allowed, lm.ee.num_layers, model_defaults(lm),
                  trained_layers(lm), settings_by_method(lm), model_info(server.default_model, lm),
                  server.limits.max_new_tokens, server.limits.max_prompt_chars, server.limits.describe(),
                  labels.default_levels(lm.ee.formats()))
    h = Handlers(server, published.load(ASSETS / "published_points.json"))
    with gr.Blocks(title=TITLE) as demo:
        p = build_page(setup)
        with p.bench_tab:
            bench_tab.BenchTab(server).build(p.model)
        _wire_runs(p, h)
        _wire_analysis(p, h)
        _wire_controls(p, h)
        gr.api(api_endpoint(h), api_name="generate", concurrency_limit=None)
    return demo


def _named(p, *names: str) -> dict:
    """The page's components by name (the names of ui.page's attributes)."""
    return {name: getattr(p, name) for name in names}


def _wire_runs(p, h: Handlers) -> None:
    """Generate, Compare, Stop and Load, by name. Gradio starts every request at once (concurrency_limit=None):
    serving queues them for the model's turn, so that a Stop reaches a job that is still waiting."""
    settings = _named(p, *(n for n in PageSettings.names()))
    views = _named(p, *VIEWS)
    analysis = [p.rounds_state, p.step_round, p.step_view, p.beliefs_view, p.explain_all]
    stale = _named(p, "what_if_status", "what_if_tokens", "what_if_stats", "what_if_plot", "what_if_result",
                   "compare_out", "compare_plot", "why_out", "why_plot", "stop_note")
    after = by_name(h.why_after_run, _named(p, "last_run"), _named(p, "why_out", "why_plot", "what_if_levels",
                                                                    "why_dv", "why_vt", "last_run"))
    for trigger in (p.generate_btn.click, p.prompt.submit):
        trigger(stepper.cleared, None, analysis + [p.timer, p.play_btn], api_name=False, queue=False)
        trigger(*by_name(stale_panels, {}, stale), api_name=False, queue=False)
        # busy: Generate waits for this run (and its timing pairs) to end
        trigger(lambda: gr.update(interactive=False, value="Generating…"), None, [p.generate_btn], api_name=False,
                queue=False)
        run = trigger(*by_name(h.generate, settings, views), concurrency_limit=None, api_name=False)
        run.then(lambda: gr.update(interactive=True, value="Generate"), None, [p.generate_btn], api_name=False,
                 queue=False)
        # two views after the run, each on its own: one failing leaves the other
        run.then(*after, api_name=False)
        run.then(h.after_run, [p.last_run], analysis, api_name=False)
    # /compare's positional order, as before: the settings, the policy, then baselines, repeats, levels
    compare = _named(p, *(n for n in PageSettings.names() if n not in ("baseline", "levels")), "baselines",
                     "repeats", "levels")
    p.compare_btn.click(*by_name(h.compare, compare,
                                 _named(p, "status", "compare_status", "compare_out", "compare_plot")),
                        concurrency_limit=None, api_name="compare")
    what_if = p.what_if_btn.click(*by_name(h.what_if, settings | _named(p, "last_run", "why_dv", "why_vt",
                                                                         "what_if_takes"), _named(p, *WHAT_IF_VIEWS)),
                                  concurrency_limit=None, api_name=False)
    # its result joins the prediction and the measured run in one table
    what_if.then(h.why, [p.last_run, p.why_dv, p.why_vt, p.what_if_result], [p.why_out, p.why_plot], api_name=False)
    # outside the queue: a Stop is never refused, nor waits behind the jobs it stops
    # its reply goes beside the status, never into it: the run alone writes the status line
    p.stop_btn.click(h.stop, None, [p.stop_note], queue=False, api_name=STOP_EVENT)  # counted as a Stop (serving.edge)
    p.load_btn.click(*by_name(h.load, _named(p, "model"),
                              _named(p, "status", "info", "draft_layer", "verify_layer", "num_layers", "draft_len",
                                     "verify_threshold", "head_layers", "method_settings", "levels")),
                     concurrency_limit=None, api_name="load_model")


def _wire_analysis(p, h: Handlers) -> None:
    """Why this speed, step through the run."""
    for slider in (p.why_dv, p.why_vt):
        slider.change(h.why, [p.last_run, p.why_dv, p.why_vt, p.what_if_result], [p.why_out, p.why_plot],
                      api_name=False, trigger_mode="always_last")
    p.step_round.change(stepper.show_round, [p.rounds_state, p.step_round, p.last_run], [p.step_view],
                        api_name=False, queue=False)
    p.prev_btn.click(partial(stepper.step, delta=-1), [p.rounds_state, p.step_round], [p.step_round], api_name=False,
                     queue=False)
    p.next_btn.click(partial(stepper.step, delta=1), [p.rounds_state, p.step_round], [p.step_round], api_name=False,
                     queue=False)
    p.play_btn.click(stepper.play, [p.playing], [p.playing, p.timer, p.play_btn], api_name=False, queue=False)
    p.timer.tick(stepper.tick, [p.rounds_state, p.step_round], [p.step_round, p.playing, p.timer, p.play_btn],
                 api_name=False)


def _wire_controls(p, h: Handlers) -> None:
    """The settings column: the controls follow the method, d < v < L, the depth strip, presets."""
    for control in (p.method, p.draft_layer, p.verify_layer, p.num_layers, p.head_layers, p.levels):
        control.change(controls.depth, [p.num_layers, p.draft_layer, p.verify_layer, p.method, p.head_layers,
                                        p.levels], [p.depth], api_name=False, queue=False)
    p.preset_choice.input(*by_name(h.preset, _named(p, "preset_choice", "model"),
                                   _named(p, "status", "method", "policy", "draft_layer", "verify_layer", "draft_len",
                                          "verify_threshold", "levels")), api_name=False)
    # a visitor's pick of a method sets its own defaults for this model (LayerSkip's exit is the benchmark's)
    # a list in the Levels box decides the exits, the adaptive policy the lengths: their sliders step aside
    for control in (p.method, p.levels, p.policy):
        control.change(controls.shown_for, [p.method, p.levels, p.policy],
                       [p.draft_layer, p.verify_layer, p.draft_len, p.verify_threshold], api_name=False, queue=False)
    p.method.change(controls.levels_box_for, [p.method], [p.levels], api_name=False, queue=False)
    p.method.input(controls.method_defaults, [p.method, p.method_settings],
                   [p.draft_layer, p.verify_layer, p.draft_len, p.verify_threshold], api_name=False, queue=False)
    p.draft_layer.release(controls.keep_below, [p.draft_layer, p.verify_layer, p.num_layers],
                          [p.draft_layer, p.verify_layer, p.status], api_name=False, queue=False)
    p.verify_layer.release(controls.keep_above, [p.draft_layer, p.verify_layer, p.num_layers],
                           [p.draft_layer, p.verify_layer, p.status], api_name=False, queue=False)
    for control in (p.method, p.policy, p.draft_layer, p.verify_layer, p.draft_len, p.verify_threshold, p.levels):
        control.input(controls.custom, None, [p.preset_choice], api_name=False, queue=False)
    p.show_rejected.change(None, [p.show_rejected], None, api_name=False, queue=False,
                           js="(show) => { document.querySelector('#hs-tokens')"
                              ".classList.toggle('hs-hide-rejected', !show); return []; }")


def api_endpoint(h: Handlers):
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
            yield from h.api_generate(request=values.pop("request"), **values)
        except gr.Error:
            raise
        except Exception as exc:  # a fault while the answer is built: the app's message, not Gradio's generic one
            log.exception("/generate failed while its answer was built")
            raise gr.Error(f"The generation failed while its answer was built ({type(exc).__name__}: {exc}). "
                           "The app is still running; try again.", print_exception=False) from None

    generate.__signature__ = full
    generate.__annotations__ = {name: param.annotation for name, param in full.parameters.items()} | {"return": dict}
    generate.__doc__ = h.api_generate.__doc__
    return generate


def model_choices() -> list[str]:
    return (["default"] if default_gguf_present() else []) + [LAYERSKIP_CHECKPOINT]


def launch_kwargs(server: Server) -> dict:
    """What launch() takes besides the address: the page's look, and the serving edge (serving.edge:
    every request stamped with its arrival, the queue-less Stop at /hispec/stop, the per-address
    limit on joining the queue), with uvicorn told to believe no X-Forwarded-For (serving.caller
    takes the address from the proxies the operator trusts)."""
    forwarded_headers_left_to_serving()
    from starlette.middleware import Middleware

    return dict(css=(ASSETS / "app.css").read_text(), theme=gr.themes.Soft(), head=token_story.EXPLAIN_JS,
                app_kwargs={"middleware": [Middleware(Edge, server=lambda: server)]})


def serve(registry: ModelRegistry, model_name: str, limits: Limits) -> Server:
    """The server of a registry whose start model is loaded; the operator's model is allowed."""
    return Server(registry, limits.allowing(model_name), default_model=model_name)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    model_name = os.environ.get("HISPEC_MODEL", "default")  # missing, it says how to install it (never a fallback)
    limits = Limits.from_env()
    registry = ModelRegistry(device=os.environ.get("HISPEC_DEVICE", "auto"), prepare=warm_up)
    say = lambda m: print(f"HiSpec: {m}", file=sys.stderr, flush=True)  # noqa: E731
    try:
        if on_spaces():  # a Space installs requirements.txt only: the default model's file is fetched here
            fetch_default_gguf(progress=say)
        say(f"loading {model_name}…")
        registry.add(model_name, registry.get(model_name, progress=say))
    except HiSpecError as exc:
        sys.exit(f"HiSpec: {exc}")
    server = serve(registry, model_name, limits)
    demo = build(server, model_choices())
    demo.queue(max_size=max(64, 8 * limits.queue_size), default_concurrency_limit=None).launch(**launch_kwargs(server))


if __name__ == "__main__":
    main()
