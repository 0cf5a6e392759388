"""The Why panel: "Why this speed", the run's measured speed plan by plan beside the cost model's estimates,
and the acceptance sliders that ask what if. It follows Generate (Generate's `follow`): after a run, the
sliders take the run's own measured pairs and the view is drawn."""

from __future__ import annotations

import gradio as gr

from hispec.engine.levels import exits_by_role
from hispec.errors import HiSpecError
from hispec.explain import what_if as what_ifs
from hispec.explain.why import explained_costs, keep_costs, speed_story
from hispec.runs.metrics import pair_name
from hispec.serving.session import Server
from ui import charts, render, why_view
from ui.panels.wiring import bind
from ui.render import roles_of

WHY_HINT = render.message_html("Generate once: the run's acceptance and this machine's pass costs then explain its "
                               "speed here.", "info")
READS = ("last_run", "why_dv", "why_vt", "what_if_result")  # why()'s inputs, in its order
WRITES = ("why_out", "why_plot")
AFTER_RUN = (*WRITES, "what_if_levels", "why_dv", "why_vt")  # why_after_run's outputs


class Why:
    """Reads READS, writes WRITES (and after a run the sliders and the what-if's list: AFTER_RUN)."""

    def __init__(self, server: Server, published_points: list[dict] | None = None):
        self.server = server
        self.published = published_points or []

    def wire(self, p) -> None:
        for slider in (p.why_dv, p.why_vt):
            slider.change(self.why, [getattr(p, n) for n in READS], [getattr(p, n) for n in WRITES], api_name=False,
                          trigger_mode="always_last")

    def run_starts(self, p, trigger) -> None:
        """Nothing of its own: Generate's stale_panels empties this view as a run starts."""

    def run_ends(self, p, run) -> None:
        run.then(*bind(self.why_after_run, p, ("last_run",), AFTER_RUN), api_name=False)

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
        if story.get("shape") is None and what_if and tuple(what_if.get("rates") or ()) == (round(float(a_dv), 2),
                                                                                           round(float(a_vt), 2)):
            story["what_if"] = what_if  # a run with no fixed shape: the what-if's row still joins the table
        story["pairs_asked"] = run.get("pairs_asked", 0)
        story["run_acceptance"] = run["stats"].get("acceptance")
        view = why_view.why_html(story) + render.published_html(self.published)
        if not story.get("curves"):
            return view, gr.Plot(None, visible=False)
        return view, gr.Plot(charts.why_figure(story["curves"], story["points"], story["axis"], self.published),
                             visible=True)

    def _costs(self, model: str, exits_used: tuple[int, ...], request):
        """The model's pass costs for these exits (serving: those timed before, else measured in its turn)."""
        return self.server.pass_costs(self.server.caller(request), model, exits_used)

    def why_after_run(self, last_run, request: gr.Request = None) -> dict:
        """After a run, by name: the sliders take the run's own measured pairs (named after them), the
        what-if names the list it will run, and the view is redrawn."""
        if not last_run:  # a new run starting, or an error: the last run's explanation goes too
            return {"why_out": WHY_HINT, "why_plot": gr.Plot(None, visible=False), "what_if_levels": ""}
        try:
            replay = what_ifs.replay_of(last_run["settings"])
        except HiSpecError as exc:
            replay, measured, note = None, (None, None), render.message_html(f"What if: {exc}", "info")
        else:
            measured = replay.sliders(last_run["stats"]["acceptance"])
            note = render.message_html(what_if_words(replay), "info")
        a_dv, a_vt = measured
        a_vt = 0.5 if a_vt is None else round(a_vt, 2)
        a_dv = a_vt if a_dv is None else round(a_dv, 2)
        view, plot = self.why(last_run, a_dv, a_vt, None, request)
        out = {"why_out": view, "why_plot": plot, "what_if_levels": note}
        roles = roles_of(last_run["settings"])
        if replay is not None:
            out["why_dv"] = gr.update(value=a_dv, label=f"Acceptance {pair_name(replay.dv_pair, roles)}"
                                      if replay.dv_pair else "Acceptance draft → verify (no middle level in this run)",
                                      info="this run's own pair, measured: move it to ask what if")
            out["why_vt"] = gr.update(value=a_vt, label=f"Acceptance {pair_name(replay.vt_pair, roles)}",
                                      info="the full model's verdicts on what reaches it, measured on this run")
        return out


def what_if_words(replay: what_ifs.Replay) -> str:
    """The list a what-if will run, said above its button."""
    middle = "the left slider for the middle level's verdicts, " if replay.dv_pair else ""
    return (f"What if runs this run's own levels: {replay.words}, with verdicts drawn at the sliders' acceptance "
            f"({middle}the right one for the full model's, on whatever reaches it).")
