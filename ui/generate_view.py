"""Update streams (serving) as the page's components, update by update.

GenerateView: status, tokens, legend, final text, stats, the three charts, the race, the passes by level,
and the finished run kept for the views below it (None until the run has ended). WhatIfView: a what-if request's status,
tokens, stats, chart, the synthetic run's own plan table and its takes' summary, every view labelled synthetic.
"""

from __future__ import annotations

import statistics
import time

import gradio as gr

from hispec.engine.events import Event
from hispec.evaluation.host import loadavg
from hispec.explain import what_if as what_ifs
from hispec.explain.why import plan_table
from hispec.runs.record import RunRecord
from hispec.runs.runner import LiveRun
from hispec.runs.trace import Trace
from hispec.serving.answer import Generation
from hispec.serving.updates import Ended, Output, Status
from ui import charts, render, why_view

VIEWS = ("status", "tokens", "legend", "final", "stats", "acc_plot", "speed_plot", "work_plot", "race_plot",
         "lanes_plot", "lanes_note", "last_run", "stop_note")
WHAT_IF_VIEWS = ("what_if_status", "what_if_tokens", "what_if_stats", "what_if_plot", "what_if_plans", "what_if_result")
CHARTS_EVERY_S = 1.0  # the charts are redrawn at most this often while a run streams


def cleared(status: str) -> dict:
    """Views (by name, VIEWS) with nothing of an earlier run left: empty text, stats and charts, no run kept."""
    return {"status": status, "tokens": render.tokens_html(Trace()), "legend": render.legend_html(), "final": "",
            "stats": "", "acc_plot": None, "speed_plot": None, "work_plot": None,
            "race_plot": gr.Plot(None, visible=False), "lanes_plot": gr.Plot(None, visible=False), "lanes_note": "",
            "last_run": None}


def stopped_message(ended: Ended, new_tokens: int) -> str:
    """What the status says when a run ended early (and kept what it wrote)."""
    if ended.outcome == "stopped":
        return f"Stopped after {new_tokens} token{'s' if new_tokens != 1 else ''}."
    if ended.outcome == "time limit":
        return f"{ended.message.rstrip('.')}, after {new_tokens} tokens."
    return ended.message


class GenerateView:
    """Folds one generation's updates; `update(u)` returns the page's outputs for it."""

    def __init__(self, model_name: str, pairs: int = 0, doing: str = "Generating"):
        """`pairs`: the plain-baseline pairs the request measures after the run (its status says "Done"
        once, at the very end, not when the tokens are in); `doing`: what the status says meanwhile
        ('Replaying' a recorded run)."""
        self.model_name, self.pairs, self.doing = model_name, pairs, doing
        self.load: tuple[list[float] | None, str] | None = None  # the machine's load: taken as the run ends
        self.fold = Generation()  # serving's fold of the updates: the run, its pairs, its prompt's ids
        self.run = self.fold.run
        self._charted = 0.0

    @property
    def vs_plain(self) -> dict | None:
        return self.fold.vs_plain

    @property
    def prompt_ids(self) -> list[int] | None:
        return self.fold.prompt_ids

    def update(self, update) -> dict:
        """The views (by name, VIEWS) this update changes."""
        if isinstance(update, Status):
            return {"status": render.message_html(update.text, "info")}
        if isinstance(update, Output):
            return self._output(update.items)
        return self._ended(update)

    def _output(self, items: tuple) -> dict:
        if not self.fold.add(items):
            return {}
        stats = self.run.summary()
        done = self.run.done is not None
        reason = render.reason_words(stats["finish_reason"]) if done else ""
        if done and self.pairs:
            status = (f"Generated {stats['new_tokens']} tokens (stopped by {reason}); timing plain decoding against "
                      f"it next ({self.pairs} pair{'s' if self.pairs != 1 else ''})…")
        else:
            status = f"Done: stopped by {reason}." if done else f"{self.doing}… {stats['new_tokens']} tokens"
        shown = {"status": render.message_html(status, "info"), "tokens": self.tokens(),
                 "legend": render.legend_html(self.run.trace.counts(), self._levels()),
                 "stats": render.stats_html(stats, levels=self._levels())}
        if done:
            shown["final"] = self.run.done.text
        return shown | self._charts(stats, done)

    def _ended(self, ended: Ended) -> dict:
        if not ended.ok or self.run.done is None:
            return cleared(render.message_html(ended.message, "error" if not ended.ok else "info")) | {"stop_note": ""}
        stats = self.run.summary()
        if ended.outcome == "done":
            status = f"Done: stopped by {render.reason_words(stats['finish_reason'])}."
        else:
            status = stopped_message(ended, stats["new_tokens"])
        shown = {"status": render.message_html(status, "info"), "tokens": self.tokens(),
                 "legend": render.legend_html(self.run.trace.counts(), self._levels()), "final": self.run.done.text,
                 "stats": render.stats_html(stats, self.vs_plain, levels=self._levels(),
                                            load=self.load or (loadavg(), "now"), shared=self.fold.shared,
                                            machine=self.fold.machine)}
        # the run's last word stands alone: a Stop's "Stopping…" reply goes with it
        kept = self.kept()
        return shown | self._charts(stats, True) | lanes(kept) | {"last_run": kept, "stop_note": ""}

    def _levels(self) -> tuple:
        """The run's level list, known from its start (its roles are named by level)."""
        return self.run.levels

    def tokens(self) -> str:
        return render.tokens_html(self.run.trace, self._levels())

    def _charts(self, stats: dict, force: bool) -> dict:
        if not force and time.perf_counter() - self._charted < CHARTS_EVERY_S:
            return {}
        self._charted = time.perf_counter()
        history = list(self.run.stats.history)
        plain = self.vs_plain if self.vs_plain and self.vs_plain.get("runs") else None
        rates = (plain or {}).get("plain_tokens_per_s")
        lines = {"plain decoding (measured)": statistics.median(rates)} if rates else {}
        race = charts.race_figure(history, plain)
        return {"acc_plot": charts.acceptance_figure(history, self._levels()),
                "speed_plot": charts.speed_figure(history, lines),
                "work_plot": charts.work_figure(stats["layer_tokens"], self._levels()),
                "race_plot": gr.Plot(race, visible=race is not None)}

    def kept(self) -> RunRecord:
        """The finished run as one value, for the views after it (why this speed, step through, beliefs, stories)."""
        return self.fold.record(self.model_name, self.pairs)


def lanes(record: RunRecord) -> dict:
    """The finished run's passes by level on its clock (charts.lanes_figure), with the sentence that says what
    it shows."""
    return {"lanes_plot": gr.Plot(charts.lanes_figure(record), visible=True),
            "lanes_note": f"<p class='hs-hint' id='hs-lanes-words'>{charts.lanes_caption(record)}</p>"}


class WhatIfView:
    """A what-if request's updates as (status, tokens, stats, chart), every view labelled synthetic."""

    def __init__(self):
        self.take: what_ifs.TakeStarted | None = None
        self.run = None  # the current take's synthetic run (runs.runner.LiveRun)
        self.plain: what_ifs.PlainTimed | None = None
        self.done: list[what_ifs.TakeDone] = []
        self.plans = ""  # the last finished take's plan table (its synthetic run's own record)

    def update(self, update) -> dict:
        """The views (by name, WHAT_IF_VIEWS) this update changes: the result (for "Why this speed") once it ends."""
        if isinstance(update, Status):
            return {"what_if_status": render.message_html("What if: " + update.text, "info")}
        if isinstance(update, Ended):
            if not update.ok:
                return {"what_if_status": render.message_html(update.message), "what_if_tokens": "",
                        "what_if_stats": "", "what_if_plot": gr.Plot(None, visible=False), "what_if_plans": "",
                        "what_if_result": None}
            # the views are sent again with the summary, so that the stream ends with the chart shown
            return ({"what_if_status": render.message_html(self._summary(update), "info")} | self._views()
                    | {"what_if_result": self.result()})
        changed = False
        for item in update.items:
            if isinstance(item, what_ifs.TakeStarted):
                self.take, self.run = item, LiveRun()
            elif isinstance(item, what_ifs.PlainTimed):
                self.plain = item
            elif isinstance(item, what_ifs.TakeDone):
                self.done.append(item)
                changed = True
            elif isinstance(item, Event) and self.run is not None:
                self.run.add(item)
                changed = True
                if self.run.done is not None:  # the take's synthetic run ended: its own plans, as a table
                    self.plans = why_view.synthetic_plans_html(plan_table(self.run.record()), self.take.take,
                                                               self.take.rates)
        return self._views() if changed else {}

    def result(self) -> dict | None:
        """The takes' summary, as "Why this speed" puts it beside its estimates (None: no take ended)."""
        return what_ifs.result_of(self.done, self.take.rates, self.take.of) if self.take is not None else None

    def _summary(self, ended: Ended) -> str:
        of = self.take.of if self.take else 0
        if ended.outcome != "done":
            return f"What if: {ended.message} {len(self.done)} of {of} takes finished."
        summary = what_ifs.Summary(tuple(self.done), of)
        median = f", median {summary.median:.2f}× a plain run" if summary.median else ""
        return f"What if: {len(self.done)} of {of} takes done{median} (synthetic, timing only)."

    def _views(self) -> dict:
        if self.run is None or not self.run.events:
            return {"what_if_tokens": "", "what_if_stats": "", "what_if_plot": gr.Plot(None, visible=False),
                    "what_if_plans": self.plans}
        rates = self.take.rates
        tokens = render.what_if_tokens(render.tokens_html(self.run.trace, self.run.levels), rates)
        stats = render.what_if_stats(self.run.summary(), rates, self.plain, self.done, self.take.of, self.run.levels)
        lines = {"plain decoding (real, timed just before)": self.plain.tokens_per_s} if self.plain else {}
        figure = charts.speed_figure(list(self.run.stats.history), lines, synthetic=True)
        return {"what_if_tokens": tokens, "what_if_stats": stats, "what_if_plot": gr.Plot(figure, visible=True),
                "what_if_plans": self.plans}
