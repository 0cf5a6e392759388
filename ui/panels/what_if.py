"""The What-if panel: the real engine on the last run's own levels, with verdicts drawn at the Why
sliders' acceptance; its result joins the Why panel's table (the What-if holds the Why panel it feeds)."""

from __future__ import annotations

import gradio as gr

from hispec.errors import HiSpecError
from hispec.explain import what_if as what_ifs
from hispec.explain.why import slider_replay
from hispec.serving.api import WhatIfRequest
from hispec.serving.session import Server
from ui import render
from ui.generate_view import WHAT_IF_VIEWS, WhatIfView
from ui.panels import why as why_panel
from ui.panels.wiring import SETTINGS, bind
from ui.settings import PageSettings

READS = (*SETTINGS, "last_run", "why_dv", "why_vt", "what_if_takes", "why_plan")


class WhatIf:
    """Reads READS, writes WHAT_IF_VIEWS; then redraws the Why panel (`why`) with its result."""

    def __init__(self, server: Server, why: why_panel.Why):
        self.server, self.why = server, why

    def wire(self, p) -> None:
        what_if = p.what_if_btn.click(*bind(self.what_if, p, READS, WHAT_IF_VIEWS), concurrency_limit=None,
                                      api_name=False)
        # its result joins the prediction and the measured run in one table
        what_if.then(self.why.why, [getattr(p, n) for n in why_panel.READS], [getattr(p, n) for n in why_panel.WRITES],
                     api_name=False)

    def what_if(self, settings: PageSettings, last_run=None, why_dv=0.5, why_vt=0.5,
                what_if_takes=what_ifs.DEFAULT_TAKES, why_plan=None, request: gr.Request = None):
        """The real engine on the plan the Why sliders vary (`why_plan`, picked in the Why panel by its words; None:
        the one that committed the most tokens; its levels, in fixed rounds at its lengths), with
        TIMING ONLY verdicts at the sliders' acceptance on the pairs they name, each take after a real plain run:
        what better agreement would give here. A plan the drawn verdicts cannot model is named, and nothing runs."""
        try:
            replay = slider_replay(last_run, why_plan or None)
        except HiSpecError as exc:
            yield {"what_if_status": render.message_html(str(exc), "info")}
            return
        yield {"what_if_status": render.message_html(f"Starting a what-if run of {replay.words}…", "info"),
               "what_if_tokens": "", "what_if_stats": "", "what_if_plot": gr.Plot(None, visible=False),
               "what_if_plans": "", "what_if_result": None}
        own = replay.request_fields() | {"draft_layer": None, "verify_layer": None, "draft_len": None,
                                         "verify_threshold": None}  # the run's list and lengths, not the sliders'
        raw = {"generate": settings.request(**own), "policy": replay.policy,
               "a_dv": why_dv, "a_vt": why_vt, "takes": what_if_takes}
        view = WhatIfView()
        for update in self.server.submit(self.server.caller(request), WhatIfRequest, raw):
            yield view.update(update)
