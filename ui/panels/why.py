"""The Why panel: "Why this speed", the run's measured speed plan by plan beside the cost model's estimates,
the acceptance sliders that ask what if (with the list of the run's plans that picks the one they vary), and
the run's acceptance by position in the block. It follows Generate and the Lesson (their `follow`): after a run,
the sliders take the run's own measured pairs and the views are drawn."""

from __future__ import annotations

import html

import gradio as gr

from hispec.errors import HiSpecError
from hispec.explain import what_if as what_ifs
from hispec.explain.positions import fall_sentence, falls
from hispec.runs.record import pair_words
from hispec.explain.why import explained_costs, slider_choices, slider_replay, slider_values, speed_story
from hispec.serving.session import Server
from ui import charts, render, why_view
from ui.panels.wiring import bind

WHY_HINT = render.message_html("Generate once: the run's acceptance and this machine's pass costs then explain its "
                               "speed here.", "info")
READS = ("last_run", "why_dv", "why_vt", "what_if_result", "why_plan")  # why()'s inputs, in its order
WRITES = ("why_out", "why_plot")
SLIDERS = (*WRITES, "what_if_levels", "why_dv", "why_vt")  # a plan's sliders: their values, names and views
# a what-if ran for the plan picked before: its views go with a new pick (its result would sit beside another plan)
WHAT_IF_STALE = ("what_if_status", "what_if_tokens", "what_if_stats", "what_if_plot", "what_if_plans", "what_if_result")
PICKED = (*SLIDERS, *WHAT_IF_STALE)  # plan_picked's outputs
POSITIONS = ("position_plot", "position_note")  # the run's acceptance by position: drawn once after a run
AFTER_RUN = (*SLIDERS, *POSITIONS, "why_plan", "last_run")  # why_after_run's outputs (the run keeps the costs its
# first explanation fetched, when it kept none of its own)


class Why:
    """Reads READS, writes WRITES (after a run the sliders, the list of plans and the what-if's list: AFTER_RUN;
    a plan picked from that list: PICKED)."""

    def __init__(self, server: Server, published_points: list[dict] | None = None):
        self.server = server
        self.published = published_points or []

    def wire(self, p) -> None:
        for slider in (p.why_dv, p.why_vt):
            slider.change(self.why, [getattr(p, n) for n in READS], [getattr(p, n) for n in WRITES], api_name=False,
                          trigger_mode="always_last")
        # a student's pick only (.input): the list set after a run does not fire it
        p.why_plan.input(*bind(self.plan_picked, p, ("last_run", "why_plan"), PICKED), api_name=False,
                         trigger_mode="always_last")

    def run_starts(self, p, trigger) -> None:
        """Nothing of its own: Generate's stale_panels empties this view as a run starts."""

    def run_ends(self, p, run) -> None:
        run.then(*bind(self.why_after_run, p, ("last_run",), AFTER_RUN), api_name=False)

    # ---- why this speed -------------------------------------------------------------------------
    def why(self, run, a_dv, a_vt, what_if=None, why_plan=None, request: gr.Request = None):
        """The run's measured speed, plan by plan, next to the cost model's estimates; at the sliders'
        acceptance, the estimate for the plan they vary (`why_plan`, its words; None: the one that committed the
        most tokens) and a what-if run's result if one ran there."""
        if run is None:
            return WHY_HINT, gr.skip()
        lanes, whose = explained_costs(run, run.exact_exits)  # kept with the run: later runs cannot rewrite them
        if lanes is None:
            try:
                lanes, whose = {None: self._costs(run.model, run.exact_exits, request)}, None
            except HiSpecError as exc:
                return render.message_html(str(exc)), gr.skip()
        story = speed_story(run, lanes, (float(a_dv), float(a_vt)), what_if, frozen=whose, pick=why_plan or None)
        if story.get("sliders") is None and what_if and tuple(what_if.get("rates") or ()) == (round(float(a_dv), 2),
                                                                                             round(float(a_vt), 2)):
            story["what_if"] = what_if  # no slider estimate for its plans: the what-if's row still joins the table
        view = why_view.why_html(story) + render.published_html(self.published)
        if not story.get("curves"):
            return view, gr.Plot(None, visible=False)
        return view, gr.Plot(charts.why_figure(story["curves"], story["points"], story["axis"], self.published),
                             visible=True)

    def _costs(self, model: str, exits_used: tuple[int, ...], request):
        """The model's pass costs for these exits (serving: those timed before, else measured in its turn)."""
        return self.server.pass_costs(self.server.caller(request), model, exits_used)

    def why_after_run(self, last_run, request: gr.Request = None) -> dict:
        """After a run, by name: the list of its plans (the sliders vary the one that committed the most tokens
        until another is picked), the sliders take that plan's own measured pairs (named after them), the what-if
        names the list it will run, and the view is redrawn."""
        if last_run is None:  # a new run starting, or an error: the last run's explanation goes too
            return ({"why_out": WHY_HINT, "why_plot": gr.Plot(None, visible=False), "what_if_levels": "",
                     "why_plan": gr.update(choices=[], value=None, visible=False)} | positions(None))
        out = positions(last_run)
        if explained_costs(last_run, last_run.exact_exits)[0] is None:  # kept from its first explanation on
            try:
                costs = self._costs(last_run.model, last_run.exact_exits, request)
            except HiSpecError:
                costs = None  # the view below says why
            if costs is not None:
                last_run = out["last_run"] = last_run.with_costs({None: costs}, "first")
        choices, pick = slider_choices(last_run)
        out["why_plan"] = gr.update(choices=choices, value=pick, visible=bool(choices))
        return out | self.sliders_for(last_run, pick, request)

    def plan_picked(self, last_run, why_plan, request: gr.Request = None) -> dict:
        """A plan picked from the run's list: the sliders take its measured pairs and names, the what-if names
        its list, the view and curve are redrawn for it, and a what-if of the plan picked before goes."""
        if last_run is None:
            return {}
        stale = {"what_if_status": "", "what_if_tokens": "", "what_if_stats": "",
                 "what_if_plot": gr.Plot(None, visible=False), "what_if_plans": "", "what_if_result": None}
        return self.sliders_for(last_run, why_plan or None, request) | stale

    def sliders_for(self, last_run, pick: str | None, request: gr.Request = None) -> dict:
        """SLIDERS for the plan `pick` of a finished run (None: the one that committed the most tokens)."""
        replay = None
        try:
            replay = slider_replay(last_run, pick)
            note = render.message_html(what_if_words(replay), "info")
        except HiSpecError as exc:
            note = render.message_html(f"What if: {exc}", "info")
        a_dv, a_vt, names = slider_values(last_run, pick)
        a_vt = 0.5 if a_vt is None else round(a_vt, 2)
        a_dv = a_vt if a_dv is None else round(a_dv, 2)
        view, plot = self.why(last_run, a_dv, a_vt, None, pick, request)
        out = {"why_out": view, "why_plot": plot, "what_if_levels": note}
        if names:  # the sliders vary the plan picked (or the one that committed the most tokens), named by its pairs
            out["why_dv"] = gr.update(value=a_dv, label=_low_label(names, replay),
                                      info=f"{names['words']}: its own pair, measured; move it to ask what if")
            out["why_vt"] = gr.update(value=a_vt, label=f"Acceptance {names['full_pair']}",
                                      info="the full model's verdicts on what reaches it, measured on this run")
        return out


def positions(run) -> dict:
    """The run's acceptance by position in the block (one line per level pair that judged) and one sentence on
    what its fall says about the block lengths the run chose; hidden for no run or one of plain steps only."""
    found = [] if run is None else falls(run)
    if not found:
        return {"position_plot": gr.Plot(None, visible=False), "position_note": ""}
    words = html.escape(fall_sentence(found, run.adapts))
    return {"position_plot": gr.Plot(charts.position_figure(run.pairs), visible=True),
            "position_note": f"<p class='hs-hint' id='hs-position-words'>{words}</p>"}


def _low_label(names: dict, replay: what_ifs.Replay | None) -> str:
    """The left slider's name: the varied plan's pair below the full model; a plan without one leaves the slider
    to the what-if's middle level, named as such."""
    if names["low_pair"]:
        return f"Acceptance {names['low_pair']}"
    if replay is not None and replay.dv_pair is not None:
        return f"Acceptance {pair_words(replay.dv_pair)} (the what-if's middle level; this plan has none)"
    return "Acceptance of a middle level (none in this run)"


def what_if_words(replay: what_ifs.Replay) -> str:
    """The plan a what-if will run, said above its button."""
    middle = (f"the left slider for {pair_words(replay.dv_pair)}, " if replay.dv_pair else "")
    return (f"What if runs the plan the sliders vary, on this run's own levels: {replay.words}, with verdicts drawn "
            f"at the sliders' acceptance ({middle}the right one for {pair_words(replay.vt_pair)}).")
