"""The app's Benchmark tab: a saved report (table + Plotly charts) and a small live benchmark.

The live run goes through the same admission path as a generation (the server's limits, the rate
limit, then the model's generation lock, waiting for other visitors' generations) and runs the
engine's `bench.benchmark` in a worker thread that holds the lock until it ends; its progress
callback drives the progress bar. `bench_stream` yields plain dicts, like ui.handlers, so it can
run under ZeroGPU's decorator; `BenchTab` turns them into components.
"""

from __future__ import annotations

import html
import json
import logging
import threading
from pathlib import Path
from typing import Callable, Iterator

import gradio as gr

from hispec.engine.decoding import DEFAULT_LAYERS, DecodeConfig
from hispec.errors import ConfigError, HiSpecError
from hispec.evaluation.bench import BENCH_METHODS, benchmark
from hispec.evaluation.prompts import LOADERS, Prompt, load_sets
from hispec.evaluation.report import figures, table_html
from hispec.serving.registry import ModelRegistry
from hispec.serving.session import OPEN, Guard, admitted, error_update, in_background, whole_number

from .render import message_html

log = logging.getLogger("hispec.app")

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BENCH_DIR = ASSETS / "bench"
LIVE_SETS = ("examples",) + tuple(LOADERS)  # the app's example prompts, then the PyPI prompt sets
MAX_PROMPTS = 5  # per live run
MAX_LIVE_TOKENS = 64  # per prompt and method in a live run (and never over the server's limit)
DEFAULT_METHODS = ["autoregressive", "layerskip", "hispec"]
PLOTS = 4  # chart slots of the saved report (a sweep draws two per grid)
LIVE_PLOTS = 3
METHOD_HELP = ("autoregressive: the full model, token by token (the reference) · hf_generate: transformers' "
               "generate() · hf_early_exit: generate(assistant_early_exit=E) with layerskip's exit E · layerskip: "
               "single exit E · hispec: draft exit, verify exit, then the full model. Exits and lengths are the "
               "model's defaults: its trained exits' recommendation, else E = {layerskip_exit}, d = {draft_layer}, "
               "v = {verify_layer}").format(**DEFAULT_LAYERS)


# ---- saved reports ---------------------------------------------------------------------------
def saved_reports(folder: Path = BENCH_DIR) -> list[Path]:
    """JSON reports in `folder`, newest first."""
    folder = Path(folder)
    files = [p for p in folder.glob("*.json") if p.is_file()] if folder.is_dir() else []
    return sorted(files, key=lambda p: (p.stat().st_mtime, p.name), reverse=True)


def describe(report: dict) -> str:
    env = report.get("environment", {})
    bits = [env.get("model"), f"{env.get('layers')} layers" if env.get("layers") else None,
            f"{env.get('device')} · {env.get('dtype')}" if env.get("device") else None,
            f"{env.get('threads')} threads" if env.get("threads") else None,
            f"torch {env['torch']}" if env.get("torch") else None,
            f"transformers {env['transformers']}" if env.get("transformers") else None,
            f"{report.get('max_new_tokens')} new tokens per prompt" if report.get("max_new_tokens") else None,
            None if report.get("complete", True) else "incomplete run (stopped or interrupted)"]
    return " · ".join(html.escape(str(b)) for b in bits if b)


def render_report(report: dict) -> tuple[str, list]:
    """(HTML: description + summary table, Plotly figures) of a benchmark or sweep report."""
    table = table_html(report).replace("<table>", '<table class="hs-stats hs-bench">')
    kind = "Sweep" if report.get("kind") == "sweep" else "Benchmark"
    return f"<p><b>{kind}</b>: {describe(report)}</p>{table}", figures(report)


def load_report(path: Path) -> tuple[str, list]:
    """A saved report's views; an unreadable file is a message, never a crash."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
        if not report.get("summary"):
            return message_html(f"{Path(path).name} holds no results yet (an interrupted run?).", "info"), []
        return render_report(report)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return message_html(f"Could not read the report {Path(path).name} ({type(exc).__name__}: {exc})."), []


def _plot_updates(figs: list, slots: int) -> list:
    return [gr.update(value=figs[i], visible=True) if i < len(figs) else gr.update(value=None, visible=False)
            for i in range(slots)]


# ---- the live run ------------------------------------------------------------------------------
def live_prompts(set_name: str, count: int, seed: int = 0) -> dict[str, list[Prompt]]:
    """`count` prompts of a set: the app's examples, or a seeded sample of a PyPI prompt set."""
    if set_name == "examples":
        examples = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
        return {"examples": [Prompt(e["kind"], e["prompt"], True, e["kind"]) for e in examples][:count]}
    if set_name not in LOADERS:
        raise ConfigError(f"unknown prompt set '{set_name}'; choose from {', '.join(LIVE_SETS)}")
    return load_sets(f"{set_name}:{count}", seed=seed)


def check_live(set_name, count, methods, max_new_tokens, limit: int) -> tuple[int, list[str], int]:
    """The live run's settings from UI values, with errors a visitor can read."""
    if set_name not in LIVE_SETS:
        raise HiSpecError(f"unknown prompt set '{set_name}'; choose from {', '.join(LIVE_SETS)}")
    count = whole_number("number of prompts", count)
    if not 1 <= count <= MAX_PROMPTS:
        raise HiSpecError(f"number of prompts must be between 1 and {MAX_PROMPTS} (got {count})")
    unknown = [m for m in methods or [] if m not in BENCH_METHODS]
    if unknown or not methods:
        raise HiSpecError(f"pick at least one method of {', '.join(BENCH_METHODS)}")
    methods = [m for m in BENCH_METHODS if m in methods]  # the harness's order
    n_new = whole_number("max new tokens", max_new_tokens)
    if not 1 <= n_new <= limit:
        raise HiSpecError(f"max new tokens must be between 1 and {limit} for a live benchmark (got {n_new})")
    return count, methods, n_new


def bench_stream(registry: ModelRegistry, model_name: str, set_name: str, count, methods: list[str],
                 max_new_tokens, stop: threading.Event, guard: Guard = OPEN,
                 visitor: str = "local", prompts: Callable[[str, int], dict] = live_prompts) -> Iterator[dict]:
    """Snapshots of a small live benchmark: {"status", "progress"} while it runs, then
    {"report", "status", "done"}; or {"error"}."""
    limit = min(MAX_LIVE_TOKENS, guard.limits.max_new_tokens)
    try:
        count, methods, n_new = check_live(set_name, count, methods, max_new_tokens, limit)
    except HiSpecError as exc:
        yield error_update(str(exc))
        return
    if isinstance(model_name, str) and model_name.strip() and model_name.strip() not in registry.loaded():
        yield {"status": f"Loading model {model_name}…", "progress": 0.0}

    def prepare():
        lm = registry.get(model_name)
        base = DecodeConfig("hispec", max_new_tokens=n_new)
        base.resolve(lm.ee.num_layers)  # checked here; each method resolves its own defaults
        sets = prompts(set_name, count)
        for ps in sets.values():
            for p in ps:
                guard.limits.check_request(len(lm.encode(p.text, chat=p.chat)), n_new)
        guard.rate.check(visitor)  # the whole benchmark counts as one request
        return lm, sets, base

    prepared = yield from admitted(prepare, registry, model_name, stop, "benchmark")
    if prepared is None:
        return
    lm, sets, base = prepared

    def task(emit):
        emit(("report", benchmark(lm, sets, methods, base, warmup=True, stop=stop,
                                  progress=lambda done, total, what: emit(("progress", done, total, what)))))

    timer, expired = guard.timer(stop)
    timer.start()
    total = sum(len(ps) for ps in sets.values())
    try:
        yield {"status": f"Warming up {len(methods)} method(s)…", "progress": 0.0}
        for batch in in_background(task, registry.generation_lock(model_name), 0.0, "hispec-benchmark"):
            for item in batch:
                if item[0] == "progress":
                    _, done, total, what = item
                    yield {"status": f"Prompt {done} of {total} done ({what}).", "progress": done / total}
                    continue
                report = item[1]
                done = len({(r["set"], r["prompt_id"]) for r in report["records"]})
                if not report["records"]:
                    yield error_update("Stopped before any prompt was done." if report.get("stopped")
                                       else "No prompt fits the model's context.")
                    return
                why = (f"Stopped at this server's time limit of {guard.limits.max_seconds:g} s per request"
                       if expired.is_set() else "Stopped")
                status = (f"Done: {done} prompt(s) × {len(methods)} method(s), {n_new} new tokens each."
                          if not report.get("stopped") else f"{why}: showing the {done} of {total} prompt(s) done.")
                yield {"report": report, "status": status, "done": True, "progress": 1.0}
                return
    except HiSpecError as exc:
        yield error_update(str(exc))
    except Exception as exc:  # one failed benchmark must not take the app down
        log.error("benchmark failed", exc_info=exc)
        yield error_update(f"The benchmark failed ({type(exc).__name__}: {exc}). The app is still running; try again.")
    finally:
        timer.cancel()
        stop.set()  # ends a worker still running when the visitor goes away (after its current method)


# ---- the tab ----------------------------------------------------------------------------------
class BenchTab:
    """Builds the tab's components (inside the caller's `gr.Tab`) and handles its events.

    A host that must run the live benchmark elsewhere (ZeroGPU) passes `stream(model_name, set_name,
    count, methods, max_new_tokens, visitor)`, which yields bench_stream's dicts and finds the
    visitor's stop flag in `self.stops[visitor]`; by default bench_stream runs here."""

    def __init__(self, registry: ModelRegistry, guard: Guard, folder: Path = BENCH_DIR,
                 stream: Callable[..., Iterator[dict]] | None = None):
        self.registry, self.guard, self.folder = registry, guard, Path(folder)
        self.limit = min(MAX_LIVE_TOKENS, guard.limits.max_new_tokens)
        self._stream = stream
        self.stops: dict[str, threading.Event] = {}

    # ---- handlers ---------------------------------------------------------------------------
    def choices(self) -> list[str]:
        return [p.name for p in saved_reports(self.folder)]

    def show_saved(self, name: str | None):
        """(table HTML, *PLOTS plot updates) of a saved report."""
        names = self.choices()
        if not names:
            return (message_html(f"No saved report in {self.folder.name}/ yet: run `python -m hispec bench "
                                 f"--json {self.folder.name}/NAME.json`.", "info"), *_plot_updates([], PLOTS))
        if name not in names:
            name = names[0]
        table, figs = load_report(self.folder / name)
        return (table, *_plot_updates(figs, PLOTS))

    def refresh(self):
        names = self.choices()
        return gr.update(choices=names, value=names[0] if names else None)

    def stop(self, request: gr.Request | None = None) -> str:
        key = _visitor(request)
        if key in self.stops:
            self.stops[key].set()
        return message_html("Stopping after the current method…", "info")

    def run_live(self, model_name, set_name, count, methods, max_new_tokens, request: gr.Request | None = None,
                 progress=gr.Progress()):
        """(status, table, *LIVE_PLOTS plot updates) once the live benchmark ends."""
        key, stop = _visitor(request), threading.Event()
        self.stops[key] = stop
        try:
            if self._stream is not None:
                snaps = self._stream(model_name, set_name, count, list(methods or []), max_new_tokens, key)
            else:
                snaps = bench_stream(self.registry, model_name, set_name, count, list(methods or []),
                                     max_new_tokens, stop, guard=self.guard, visitor=key)
            last = {}
            for snap in snaps:
                last = snap
                if snap.get("status") and not snap.get("done"):
                    progress(snap.get("progress", 0.0), desc=snap["status"])
            if last.get("error") or "report" not in last:
                return (message_html(last.get("error") or "The benchmark ended without a result."),
                        gr.skip(), *[gr.skip()] * LIVE_PLOTS)
            progress(1.0, desc=last["status"])
            table, figs = render_report(last["report"])
            return (message_html(last["status"], "info"), table, *_plot_updates(figs, LIVE_PLOTS))
        finally:
            stop.set()
            if self.stops.get(key) is stop:
                del self.stops[key]

    # ---- page ---------------------------------------------------------------------------------
    def build(self, model: gr.components.Component) -> None:
        """The tab's components and events; `model` is the page's model box (the live run's model)."""
        names = self.choices()
        first = self.show_saved(names[0] if names else None)
        gr.Markdown("### Saved report\nA benchmark run with `python -m hispec bench --json assets/bench/NAME.json` "
                    "(methods side by side, or a `--sweep` over layers or lengths). The newest file is shown first.")
        with gr.Row():
            choice = gr.Dropdown(names, value=names[0] if names else None, label="Report (assets/bench)", scale=4)
            refresh_btn = gr.Button("Refresh list", scale=1)
        saved_table = gr.HTML(first[0], elem_id="hs-bench-saved")
        saved_plots = [gr.Plot(value=u.get("value"), visible=u.get("visible", False),
                               label=f"Saved report chart {i + 1}") for i, u in enumerate(first[1:])]
        gr.Markdown("### Run a small benchmark now\nThe same harness on a few prompts, on the model chosen above. "
                    "It waits for other visitors' generations and holds the model meanwhile, "
                    "so keep it small. " + METHOD_HELP)
        with gr.Row():
            set_name = gr.Dropdown(list(LIVE_SETS), value="examples", label="Benchmark set",
                                   info="examples: the app's example prompts; the others need their PyPI package")
            count = gr.Slider(1, MAX_PROMPTS, value=2, step=1, label="Items from the set")
            max_new = gr.Slider(1, self.limit, value=min(16, self.limit), step=1, label="Token budget per item",
                                info="new tokens per item and method")
        methods = gr.CheckboxGroup(list(BENCH_METHODS), value=DEFAULT_METHODS, label="Methods")
        with gr.Row():
            run_btn = gr.Button("Run benchmark", variant="primary")
            stop_btn = gr.Button("Stop benchmark", variant="stop")
        live_status = gr.HTML("", elem_id="hs-bench-status")
        live_table = gr.HTML("", elem_id="hs-bench-live")
        live_plots = [gr.Plot(visible=False, label=f"Live chart {i + 1}") for i in range(LIVE_PLOTS)]

        choice.change(self.show_saved, [choice], [saved_table, *saved_plots], api_name=False)
        refresh_btn.click(self.refresh, None, [choice], api_name=False, queue=False)
        run_btn.click(self.run_live, [model, set_name, count, methods, max_new],
                      [live_status, live_table, *live_plots], concurrency_limit=1, concurrency_id="benchmark",
                      api_name="benchmark")
        stop_btn.click(self.stop, None, [live_status], concurrency_limit=None, api_name=False)


def _visitor(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "anonymous"
