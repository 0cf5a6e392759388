"""The Compare panel: the same prompt with the chosen baselines, several runs each (/compare)."""

from __future__ import annotations

import gradio as gr

from hispec.serving.api import CompareRequest
from hispec.serving.session import Server
from hispec.serving.updates import Output, Status
from ui import charts, labels, render
from ui.panels.wiring import SETTINGS, bind
from ui.settings import PageSettings

# /compare's positional order, as before: the settings, the policy, then baselines, repeats, levels
READS = (*(n for n in SETTINGS if n not in ("baseline", "levels")), "baselines", "repeats", "levels")
WRITES = ("status", "compare_status", "compare_out", "compare_plot")


class Compare:
    """Reads READS, writes WRITES (the progress shows in the page's status too)."""

    def __init__(self, server: Server):
        self.server = server

    def wire(self, p) -> None:
        p.compare_btn.click(*bind(self.compare, p, READS, WRITES), concurrency_limit=None, api_name="compare")

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
