"""The app's Benchmark tab: a saved report (table + Plotly charts) and a small live benchmark.

The live run is a request like a generation (serving.api.BenchRequest): the server's limits, the
rate limit, the queue for the model's turn, Stop and the time limit all apply; its progress drives
the progress bar, and its report is drawn when it ends.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import gradio as gr

from hispec.engine.config import DEFAULT_LAYERS
from hispec.errors import ConfigError
from hispec.evaluation.method import BENCH_METHODS, BenchMethod
from hispec.evaluation.report import figures, table_html
from hispec.serving.api import LIVE_SETS, MAX_LIVE_PROMPTS, MAX_LIVE_TOKENS, BenchRequest
from hispec.serving.session import Server
from hispec.serving.updates import Output, Status

from .labels import level_words
from .panels.wiring import components
from .render import message_html

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BENCH_DIR = ASSETS / "bench"
DEFAULT_METHODS = ["autoregressive", "layerskip", "hispec"]
PLOTS = 4  # chart slots of the saved report (a sweep draws two per grid)
LIVE_PLOTS = 3
SAVED_OUTPUTS = ("bench_saved_table", "bench_saved_plots")  # show_saved's, in its order
LIVE_INPUTS = ("model", "bench_set", "bench_count", "bench_methods", "bench_max_new")  # run_live's, in its order
LIVE_OUTPUTS = ("bench_status", "bench_table", "bench_plots")
METHOD_HELP = ("autoregressive: the full model, token by token (the reference) · hf_generate: transformers' "
               "generate() · hf_early_exit: generate(assistant_early_exit=E) with layerskip's exit E · layerskip: "
               "single exit E · hispec: draft exit, verify exit, then the full model. Exits and lengths are the "
               "model's defaults: its trained exits' recommendation, else E = {E}, d = {d}, "
               "v = {v}").format(**DEFAULT_LAYERS)


# ---- saved reports ---------------------------------------------------------------------------
# The README's headline: the default configuration (hispec/auto: lookup -> full@a8 -> full on the default
# model) beside plain decoding in every format and llama.cpp, on heldout-fresh, the split no development
# touched: shown first when present.
HEADLINE = "headline_cpu_fresh2.json"


def saved_reports(folder: Path = BENCH_DIR) -> list[Path]:
    """JSON reports in `folder`: the headline benchmark first, then newest first (a fresh checkout
    gives every shipped file the same time, so the headline must not depend on it)."""
    folder = Path(folder)
    files = [p for p in folder.glob("*.json") if p.is_file()] if folder.is_dir() else []
    return sorted(files, key=lambda p: (p.name == HEADLINE, p.stat().st_mtime, p.name), reverse=True)


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


WEIGHTS = {"fp32": "float32 model", "fp32-torch": "float32 model through torch's products", "q4": "4-bit model", "a8": "4-bit model with int8 activations",
           "bf16": "bfloat16 model"}
POLICY = {"auto": "adaptive", "fixed": "fixed rounds"}
METHOD = {"autoregressive": "plain decoding", "hispec": "HiSpec", "layerskip": "LayerSkip", "lookup": "lookup",
          "hf_lookup": "transformers' prompt lookup", "hf_generate": "transformers' generate()",
          "hf_early_exit": "transformers' early-exit assistant"}


def method_words(key: str) -> str:
    """A bench method key in the page's words: 'hispec/auto@fp32' -> 'HiSpec, adaptive, on the float32 model',
    'lookup+full@a8/auto@q4' -> 'lookup → the 4-bit full model with int8 activations, adaptive, on the 4-bit
    model', 'lookup+4/fixed' -> 'lookup → exit 4, fixed rounds' (a key the bench cannot read is passed on)."""
    try:
        method = BenchMethod.parse(key)  # the bench's own reading: 'lookup+full@a8' names a level, not weights
    except ConfigError:
        return key
    if method.levels is not None:
        words = " → ".join(level_words(level) for level in method.levels)
    else:
        words = METHOD.get(method.name, method.name)
    weights = f"on the {WEIGHTS.get(method.weights, method.weights)}" if method.weights else ""
    return ", ".join(w for w in (words, POLICY.get(method.policy, method.policy), weights) if w)


def in_words(table: str, report: dict) -> str:
    """The summary table with its method keys and level pairs in words (the key stays as a hint)."""
    summary = report.get("summary") if isinstance(report.get("summary"), dict) else {}
    keys = {m for m in report.get("methods") or () if isinstance(m, str)} | {
        m for s in summary.values() if isinstance(s, dict) and isinstance(s.get("methods"), dict) for m in s["methods"]}
    for key in sorted(keys, key=len, reverse=True):
        shown = html.escape(key)
        table = table.replace(f"<td>{shown}</td>",
                              f"<td>{html.escape(method_words(key))} <span class='hs-hint'>({shown})</span></td>")
        table = table.replace(f"vs {shown}", f"vs {html.escape(method_words(key))}")
        table = table.replace(f"= {shown}", f"= {html.escape(method_words(key))}")
    for role, words in (("lookup", "lookup"), ("draft", "draft"), ("verify", "middle level"), ("target", "full model")):
        table = table.replace(f"{role}-&gt;", f"{words} → ").replace(f"→ {role} ", f"→ {words} ")
    return table


def render_report(report: dict) -> tuple[str, list]:
    """(HTML: description + summary table, Plotly figures) of a benchmark or sweep report."""
    table = in_words(table_html(report), report).replace("<table>", '<table class="hs-stats hs-bench">')
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


# ---- the tab ----------------------------------------------------------------------------------
class BenchTab:
    """The Benchmark panel: builds the tab's components (in the page's Benchmark tab, named on the page) and
    handles its events; the live run is a request like any other (serving.api.BenchRequest: limits, queue,
    the model's turn). `max_new_tokens`: the server's limit, the live run's budget at most."""

    def __init__(self, server: Server, folder: Path = BENCH_DIR, max_new_tokens: int = MAX_LIVE_TOKENS):
        self.server, self.folder = server, Path(folder)
        self.limit = min(MAX_LIVE_TOKENS, max_new_tokens)

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
        n = self.server.stop(self.server.caller(request), ("bench",))
        return message_html("Stopping after the current method…" if n else "No benchmark of yours is running.", "info")

    def run_live(self, model_name, set_name, count, methods, max_new_tokens, request: gr.Request | None = None,
                 progress=gr.Progress()):
        """(status, table, *LIVE_PLOTS plot updates) once the live benchmark ends."""
        raw = {"model": model_name, "set_name": set_name, "count": count, "methods": list(methods or []),
               "max_new_tokens": max_new_tokens}
        report = None
        for update in self.server.submit(self.server.caller(request), BenchRequest, raw):
            if isinstance(update, Status):
                progress(_fraction(update.text), desc=update.text)
            elif isinstance(update, Output):
                report = next((item for item in update.items if isinstance(item, dict)), report)
            elif not update.ok or report is None or not report["records"]:
                why = update.message if not update.ok else ("Stopped before any prompt was done."
                                                           if report and report.get("stopped") else update.message)
                return (message_html(why), gr.skip(), *[gr.skip()] * LIVE_PLOTS)
            else:
                done = len({(r["set"], r["prompt_id"]) for r in report["records"]})
                n_methods = len(report["methods"])
                status = (f"Done: {done} prompt(s) × {n_methods} method(s), {report['max_new_tokens']} new tokens "
                          "each." if not report.get("stopped") else
                          f"{update.message.rstrip('.')}: showing the {done} of {report['total_prompts']} prompt(s) "
                          "done.")
                table, figs = render_report(report)
                return (message_html(status, "info"), table, *_plot_updates(figs, LIVE_PLOTS))
        return (message_html("The benchmark ended without a result."), gr.skip(), *[gr.skip()] * LIVE_PLOTS)

    # ---- the panel --------------------------------------------------------------------------------
    def wire(self, p) -> None:
        """The tab's components, built in the page's Benchmark tab (`p.bench_tab`) and named on the page
        (bench_*), and its events by those names; the live run's model is the page's model box (`model`)."""
        with p.bench_tab:
            self.layout(p)
        p.bench_choice.change(self.show_saved, [p.bench_choice], components(p, *SAVED_OUTPUTS), api_name=False)
        p.bench_refresh_btn.click(self.refresh, None, [p.bench_choice], api_name=False, queue=False)
        # serving queues and limits the run: Gradio starts it at once, so that Stop reaches it while it waits
        p.bench_run_btn.click(self.run_live, components(p, *LIVE_INPUTS), components(p, *LIVE_OUTPUTS),
                              concurrency_limit=None, api_name="benchmark")
        p.bench_stop_btn.click(self.stop, None, [p.bench_status], queue=False, api_name=False)

    def layout(self, p) -> None:
        """The tab's components, on the page by name."""
        names = self.choices()
        first = self.show_saved(names[0] if names else None)
        gr.Markdown("### Saved report\nA benchmark run with `python -m hispec bench --json assets/bench/NAME.json` "
                    "(methods side by side, or a `--sweep` over layers or lengths). The run of the page's default "
                    "(lookup → 4-bit full model → full, both formats) is shown first, then the newest.")
        with gr.Row():
            p.bench_choice = gr.Dropdown(names, value=names[0] if names else None, label="Report (assets/bench)",
                                         scale=4)
            p.bench_refresh_btn = gr.Button("Refresh list", scale=1)
        p.bench_saved_table = gr.HTML(first[0], elem_id="hs-bench-saved")
        p.bench_saved_plots = [gr.Plot(value=u.get("value"), visible=u.get("visible", False),
                                       label=f"Saved report chart {i + 1}") for i, u in enumerate(first[1:])]
        gr.Markdown("### Run a small benchmark now\nThe same harness on a few prompts, on the model chosen above. "
                    "It waits its turn behind other visitors' requests and holds the model meanwhile, "
                    "so keep it small. " + METHOD_HELP)
        with gr.Row():
            p.bench_set = gr.Dropdown(list(LIVE_SETS), value="examples", label="Benchmark set",
                                      info="examples: the app's example prompts; the others need their PyPI package")
            p.bench_count = gr.Slider(1, MAX_LIVE_PROMPTS, value=2, step=1, label="Items from the set")
            p.bench_max_new = gr.Slider(1, self.limit, value=min(16, self.limit), step=1, label="Token budget per item",
                                        info="new tokens per item and method")
        p.bench_methods = gr.CheckboxGroup(list(BENCH_METHODS), value=DEFAULT_METHODS, label="Methods")
        with gr.Row():
            p.bench_run_btn = gr.Button("Run benchmark", variant="primary")
            p.bench_stop_btn = gr.Button("Stop benchmark", variant="stop")
        p.bench_status = gr.HTML("", elem_id="hs-bench-status")
        p.bench_table = gr.HTML("", elem_id="hs-bench-live")
        p.bench_plots = [gr.Plot(visible=False, label=f"Live chart {i + 1}") for i in range(LIVE_PLOTS)]


def _fraction(status: str) -> float:
    """How far a benchmark is, from its status ("Prompt 2 of 5 done ..."): 0 until the first prompt."""
    words = status.split()
    if len(words) > 3 and words[0] == "Prompt" and words[1].isdigit() and words[3].isdigit():
        return int(words[1]) / max(int(words[3]), 1)
    return 0.0
