"""Update streams (serving) as the page's components, update by update.

GenerateView: status, tokens, legend, final text, stats, the three charts, and the finished run kept
for the views below it (None until the run has ended). WhatIfView: a what-if request's status,
tokens, stats, chart and its takes' summary, every view labelled synthetic.
"""

from __future__ import annotations

import time

import gradio as gr

from hispec.engine.events import Event
from hispec.explain import what_if as what_ifs
from hispec.runs.runner import LiveRun
from hispec.runs.trace import Trace
from hispec.serving.answer import Generation
from hispec.serving.updates import Ended, Output, Status
from ui import charts, render

OUTPUTS = 9
CHARTS_EVERY_S = 1.0  # the charts are redrawn at most this often while a run streams


def cleared(status: str) -> tuple:
    """Views with nothing of an earlier run left: empty text, stats and charts, no run kept."""
    return (status, render.tokens_html(Trace()), render.legend_html(), "", "", None, None, None, None)


def stopped_message(ended: Ended, new_tokens: int) -> str:
    """What the status says when a run ended early (and kept what it wrote)."""
    if ended.outcome == "stopped":
        return f"Stopped after {new_tokens} token{'s' if new_tokens != 1 else ''}."
    if ended.outcome == "time limit":
        return f"{ended.message.rstrip('.')}, after {new_tokens} tokens."
    return ended.message


class GenerateView:
    """Folds one generation's updates; `update(u)` returns the page's outputs for it."""

    def __init__(self, model_name: str, pairs: int = 0):
        """`pairs`: the plain-baseline pairs the request measures after the run (its status says "Done"
        once, at the very end, not when the tokens are in)."""
        self.model_name, self.pairs = model_name, pairs
        self.fold = Generation()  # serving's fold of the updates: the run, its pairs, its prompt's ids
        self.run = self.fold.run
        self._charted = 0.0

    @property
    def vs_plain(self) -> dict | None:
        return self.fold.vs_plain

    @property
    def prompt_ids(self) -> list[int] | None:
        return self.fold.prompt_ids

    def update(self, update) -> tuple:
        if isinstance(update, Status):
            return (render.message_html(update.text, "info"),) + (gr.skip(),) * (OUTPUTS - 1)
        if isinstance(update, Output):
            return self._output(update.items)
        return self._ended(update)

    def _output(self, items: tuple) -> tuple:
        if not self.fold.add(items):
            return (gr.skip(),) * OUTPUTS
        stats = self.run.summary()
        done = self.run.done is not None
        reason = render.reason_words(stats["finish_reason"]) if done else ""
        if done and self.pairs:
            status = (f"Generated {stats['new_tokens']} tokens (stopped by {reason}); timing plain decoding against "
                      f"it next ({self.pairs} pair{'s' if self.pairs != 1 else ''})…")
        else:
            status = f"Done: stopped by {reason}." if done else f"Generating… {stats['new_tokens']} tokens"
        shown = (render.message_html(status, "info"), self.tokens(), render.legend_html(self.run.trace.counts()),
                 self.run.done.text if done else gr.skip(), render.stats_html(stats, levels=self._levels()))
        return shown + self._charts(stats, done) + (gr.skip(),)

    def _ended(self, ended: Ended) -> tuple:
        if not ended.ok or self.run.done is None:
            return cleared(render.message_html(ended.message, "error" if not ended.ok else "info"))
        stats = self.run.summary()
        if ended.outcome == "done":
            status = f"Done: stopped by {render.reason_words(stats['finish_reason'])}."
        else:
            status = stopped_message(ended, stats["new_tokens"])
        shown = (render.message_html(status, "info"), self.tokens(), render.legend_html(self.run.trace.counts()),
                 self.run.done.text, render.stats_html(stats, self.vs_plain, levels=self._levels()))
        return shown + self._charts(stats, True) + (self.kept(),)

    def _levels(self) -> tuple:
        """The run's level list, known from its start (its roles are named by level)."""
        return self.run.levels

    def tokens(self) -> str:
        settings = self.run.done.settings if self.run.done else {}
        return render.tokens_html(self.run.trace, settings)

    def _charts(self, stats: dict, force: bool) -> tuple:
        if not force and time.perf_counter() - self._charted < CHARTS_EVERY_S:
            return (gr.skip(),) * 3
        self._charted = time.perf_counter()
        history = list(self.run.stats.history)
        return (charts.acceptance_figure(history, self._levels()), charts.speed_figure(history),
                charts.work_figure(stats["layer_tokens"]))

    def kept(self) -> dict:
        """The finished run, for the views after it (why this speed, step through, beliefs, stories)."""
        done = self.run.done
        return {"model": self.model_name, "stats": self.run.summary(), "settings": done.settings,
                "events": self.run.events, "prompt_ids": self.prompt_ids,
                "token_ids": list(done.token_ids), "vs_plain": self.vs_plain}


class WhatIfView:
    """A what-if request's updates as (status, tokens, stats, chart), every view labelled synthetic."""

    def __init__(self):
        self.take: what_ifs.TakeStarted | None = None
        self.run = None  # the current take's synthetic run (runs.runner.LiveRun)
        self.plain: what_ifs.PlainTimed | None = None
        self.done: list[what_ifs.TakeDone] = []

    def update(self, update):
        """(status, tokens, stats, chart, result): the result (for "Why this speed") once it ends."""
        if isinstance(update, Status):
            return (render.message_html("What if: " + update.text, "info"),) + (gr.skip(),) * 4
        if isinstance(update, Ended):
            if not update.ok:
                return render.message_html(update.message), "", "", gr.Plot(None, visible=False), None
            # the views are sent again with the summary, so that the stream ends with the chart shown
            return (render.message_html(self._summary(update), "info"),) + self._views() + (self.result(),)
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
        return (gr.skip(),) + self._views() + (gr.skip(),) if changed else (gr.skip(),) * 5

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

    def _views(self):
        if self.run is None or not self.run.events:
            return "", "", gr.Plot(None, visible=False)
        rates = self.take.rates
        settings = self.run.done.settings if self.run.done else {}
        tokens = render.what_if_tokens(render.tokens_html(self.run.trace, settings), rates)
        stats = render.what_if_stats(self.run.summary(), rates, self.plain, self.done, self.take.of)
        lines = {"plain decoding (real, timed just before)": self.plain.tokens_per_s} if self.plain else {}
        figure = charts.speed_figure(list(self.run.stats.history), lines, synthetic=True)
        return tokens, stats, gr.Plot(figure, visible=True)
