"""The page's layout: every component, in reading order, and nothing that runs (app.py wires them).

`build_page(setup)` must be called inside a `gr.Blocks` context; it returns a Page whose attributes
are the components the handlers read and write.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import gradio as gr

from hispec.evaluation import pairs
from hispec.explain import what_if as what_ifs
from hispec.runs.trace import Trace
from hispec.serving.api import MAX_REPEATS
from ui import controls, front_door, labels, render, stepper, token_story

ASSETS = Path(__file__).resolve().parent.parent / "assets"
HOW_IT_WORKS = (ASSETS / "how_it_works.md").read_text(encoding="utf-8")
INTRO = front_door.intro()  # what the default runs and how fast, read from the shipped reports


@dataclass(frozen=True)
class Setup:
    """What the page starts with: the model loaded at start and the server's limits."""

    model_name: str
    model_choices: list[str]
    allow_custom_model: bool
    num_layers: int
    preset: object  # the model's fixed HiSpec settings (a resolved DecodeConfig)
    trained: list[int]
    by_method: dict
    model_info: str
    max_new_tokens: int
    max_prompt_chars: int
    limits_text: str
    levels: str = next(iter(labels.LEVELS))  # the Levels box's first value (labels.default_levels)
    lessons: tuple[str, ...] = ()  # the titles of the recorded runs the page can replay (hispec.runs.lessons)


def build_page(setup: Setup) -> SimpleNamespace:
    p = SimpleNamespace()
    gr.Markdown(INTRO)
    with gr.Accordion("How it works (read this first)", open=False, elem_id="hs-how"):
        gr.Markdown(HOW_IT_WORKS)
        gr.HTML(render.legend_html())
    with gr.Tabs():
        with gr.Tab("Demo"):
            p.num_layers, p.head_layers = gr.State(setup.num_layers), gr.State(setup.trained)
            p.method_settings = gr.State(setup.by_method)
            _ask(p, setup)
            # The settings come first in the page's order, so that on a narrow screen (the columns
            # stacked) they sit under Generate, not below the results; on a wide one the stylesheet
            # puts them on the right (assets/app.css, #hs-settings-col).
            with gr.Row(elem_id="hs-main-row"):
                with gr.Column(scale=2, elem_id="hs-settings-col"):
                    with gr.Accordion("Settings: method, policy, exits, lengths", open=True,
                                      elem_id="hs-settings-box"):
                        _settings_column(p, setup)
                with gr.Column(scale=3, elem_id="hs-run-col"):
                    _results(p)
            with gr.Row():
                p.acc_plot = gr.Plot(label="Acceptance", elem_id="hs-acc-plot")
                p.speed_plot = gr.Plot(label="Speed", elem_id="hs-speed-plot")
                p.work_plot = gr.Plot(label="Work", elem_id="hs-work-plot")
            # this run against plain decoding on one clock, once its timing pairs measured plain decoding
            p.race_plot = gr.Plot(label="Race against plain decoding", elem_id="hs-race-plot", visible=False)
            # where the time went: each level's passes as blocks on the run's clock, plain decoding's lane last
            p.lanes_plot = gr.Plot(label="Passes by level", elem_id="hs-lanes-plot", visible=False)
            p.lanes_note = gr.HTML("", elem_id="hs-lanes-note")
            p.last_run = gr.State(None)  # the finished run (settings, stats, events), for the views below
            p.rounds_state, p.playing = gr.State(None), gr.State(False)
            _stepper(p)
            _why(p)
            with gr.Accordion("What each exit believes", open=False, elem_id="hs-beliefs-box"):
                p.beliefs_view = gr.HTML(stepper.BELIEFS_HINT, elem_id="hs-beliefs")
            _compare(p)
            gr.Markdown(setup.limits_text, elem_id="hs-limits")
        p.bench_tab = gr.Tab("Benchmark")
    return p


def _ask(p, setup: Setup) -> None:
    """The prompt, its examples, the buttons and the status, across the page."""
    examples = json.loads((ASSETS / "examples.json").read_text(encoding="utf-8"))
    # no max_length: the box would cut a long paste silently; serving names the limit and the length instead
    p.prompt = gr.Textbox(label="Prompt", lines=4, elem_id="hs-prompt",
                          placeholder=f"Ask something, or pick an example below (up to {setup.max_prompt_chars:,} "
                                      "characters)")
    gr.Examples([[e["prompt"]] for e in examples], inputs=[p.prompt], example_labels=[e["kind"] for e in examples],
                label="Examples")
    with gr.Row():
        p.generate_btn = gr.Button("Generate", variant="primary", elem_id="hs-generate")
        p.stop_btn = gr.Button("Stop", variant="stop", elem_id="hs-stop")
        p.compare_btn = gr.Button("Compare with baseline", elem_id="hs-compare-btn")
    with gr.Row(visible=bool(setup.lessons), elem_id="hs-lesson-row"):
        p.lesson_choice = gr.Dropdown(list(setup.lessons), value=setup.lessons[0] if setup.lessons else None,
                                      label="Lesson: watch a recorded run", elem_id="hs-lesson", scale=4,
                                      info="replayed at its recorded pace with every view below, no model time spent: "
                                           "a whole class can watch at once (its figures are the recorded machine's)")
        p.lesson_btn = gr.Button("Replay the lesson", elem_id="hs-lesson-btn", scale=1)
    p.status = gr.HTML(render.message_html("Ready.", "info"), elem_id="hs-status")
    # the Stop button's own reply: the status line above has one writer, the run, whose last word
    # (Done, Stopped after N tokens) a Stop's reply arriving late can never overwrite
    p.stop_note = gr.HTML("", elem_id="hs-stop-note")


def _results(p) -> None:
    """The run: its coloured tokens, their stories, the legend, the committed text, the stats."""
    p.tokens = gr.HTML(render.tokens_html(Trace()), elem_id="hs-tokens")
    p.explain_all = gr.HTML(token_story.HINT, elem_id="hs-explain-all")
    p.show_rejected = gr.Checkbox(True, label="Show rejected tokens (struck through)")
    p.legend = gr.HTML(render.legend_html(), elem_id="hs-legend")
    p.final = gr.Textbox(label="Output (committed text only)", lines=3, interactive=False, elem_id="hs-final")
    p.stats = gr.HTML("", elem_id="hs-stats")


def _settings_column(p, setup: Setup) -> None:
    L, preset = setup.num_layers, setup.preset
    # the page starts on the adaptive policy, which no preset is: "Custom" until one is picked
    p.preset_choice = gr.Radio([*controls.PRESETS, controls.CUSTOM], value=controls.CUSTOM, label="Presets (HiSpec, fixed rounds)",
                               elem_id="hs-preset", info=controls.PRESET_HELP)
    p.method = gr.Radio(list(labels.METHODS), value="HiSpec", label="Method", elem_id="hs-method")
    p.policy = gr.Radio(list(labels.POLICIES), value=labels.DEFAULT_POLICY_LABEL, label="Policy", elem_id="hs-policy",
                        info="Adaptive: each round, the plan with the most expected tokens per second from this run's "
                             "acceptance and this machine's pass costs (HiSpec then also has a free lookup level at "
                             "the bottom); Fixed: the paper's rounds with the settings below")
    p.levels = gr.Dropdown(list(labels.LEVELS), value=setup.levels, label="Levels (HiSpec)",
                           allow_custom_value=True, elem_id="hs-levels",
                           info="bottom first, the exact full model always on top and always deciding: or type a "
                                "list such as lookup,2,4 or lookup,full@a8 (full@q4: the same weights in the GGUF's "
                                "4-bit blocks; full@a8: those blocks with int8 activations; the default model on "
                                "float32 only)")
    sliders = controls.exit_sliders_shown("HiSpec", setup.levels)  # a list in the Levels box decides the exits
    p.draft_layer = gr.Slider(1, L - 1, value=preset.draft_layer, step=1, label="Draft layer d", visible=sliders,
                              info="exit that drafts (LayerSkip: its single exit)", elem_id="hs-draft-layer")
    p.verify_layer = gr.Slider(1, L - 1, value=preset.verify_layer, step=1, label="Verify layer v", visible=sliders,
                               info="intermediate verifier exit, d < v < L", elem_id="hs-verify-layer")
    lengths = controls.lengths_shown("HiSpec", labels.DEFAULT_POLICY_LABEL)  # fixed rounds' (adaptive: planned)
    p.draft_len = gr.Slider(1, 8, value=preset.draft_len, step=1, label="draft_len", info="tokens drafted per block",
                            elem_id="hs-draft-len", visible=lengths)
    p.verify_threshold = gr.Slider(1, 16, value=preset.verify_threshold, step=1, label="verify_threshold",
                                   info="tentative tokens that trigger the full model", elem_id="hs-verify-threshold",
                                   visible=lengths)
    p.depth = gr.HTML(controls.depth(L, preset.draft_layer, preset.verify_layer, "HiSpec", setup.trained, setup.levels),
                      elem_id="hs-depth")
    p.max_new = gr.Slider(1, setup.max_new_tokens, value=min(96, setup.max_new_tokens), step=1, label="Max new tokens", elem_id="hs-max-new")
    p.chat = gr.Checkbox(True, label="Use the chat template")
    p.baseline = gr.Slider(0, MAX_REPEATS, value=pairs.MIN_PAIRS, step=1, label="Speed measured against plain decoding: pairs",
                           info="after the run, pairs of runs (this method, plain decoding) on the same prompt and "
                                f"length give the speed ratio the page states (fewer than {pairs.MIN_PAIRS}: not enough "
                                "to tell); 0: none", elem_id="hs-baseline")
    with gr.Accordion("Sampling (temperature 0 = greedy, exact)", open=False):
        p.temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature",
                                  info="> 0 samples; every stage then uses speculative sampling, so the output is "
                                       "distributed exactly as the full model's")
        p.top_k = gr.Number(0, precision=0, minimum=0, label="Top-k (0 = off)")
        p.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p (1 = off)")
        p.seed = gr.Number(-1, precision=0, minimum=-1, label="Seed (-1 = random)")
    with gr.Accordion("Compare: baselines and repeats", open=False):
        p.baselines = gr.CheckboxGroup(list(labels.BASELINES), value=["Autoregressive"], label="Baselines for Compare")
        p.repeats = gr.Slider(1, MAX_REPEATS, value=3, step=1, label="Runs of each method",
                              info="one run is noise: the median and range of several, the order reversed every "
                                   "other pass", elem_id="hs-repeats")
    with gr.Accordion("Model and its exit heads", open=False):
        with gr.Row():
            p.model = gr.Dropdown(setup.model_choices, value=setup.model_name, label="Model", scale=3,
                                  allow_custom_value=setup.allow_custom_model,
                                  info="the models this server offers ('default': the embedded SmolLM2-135M)")
            p.load_btn = gr.Button("Load", scale=1)
        p.info = gr.Markdown(setup.model_info)


def _stepper(p) -> None:
    with gr.Accordion("Step through the run, round by round", open=True, elem_id="hs-step-box"):
        gr.Markdown("Each round replayed from the run's recorded events (nothing is generated again): what the drafter "
                    "proposed, what the verifier kept, when the full model ran and what it committed, the layers each "
                    "step ran and their time, and the KV cache of every layer before and after.")
        with gr.Row():
            p.prev_btn = gr.Button("◀ Previous", elem_id="hs-step-prev", scale=1)
            p.play_btn = gr.Button("Play ▶", elem_id="hs-step-play", scale=1)
            p.next_btn = gr.Button("Next ▶", elem_id="hs-step-next", scale=1)
            p.step_round = gr.Slider(0, 1, value=0, step=1, label="Round (0 = the prompt's prefill)",
                                     elem_id="hs-step-round", scale=4)
        p.step_view = gr.HTML(stepper.STEP_HINT, elem_id="hs-step-view")
        p.timer = gr.Timer(1.0, active=False)


def _why(p) -> None:
    with gr.Accordion("Why this speed: the cost model of this machine", open=True, elem_id="hs-why-box"):
        gr.Markdown("Speculation pays when a round commits more tokens per second than plain steps. After a run, the "
                    "sliders hold the measured acceptance of the plan picked below (at first the one that committed the "
                    "most tokens; named on them); move them to see what better (or worse) agreement between its levels "
                    "would give with the costs measured here.")
        # the run's plans by their words in the table (a plain step has no pair to vary); set after each run
        p.why_plan = gr.Dropdown([], value=None, label="Plan the sliders vary", elem_id="hs-why-plan", visible=False,
                                 info="each plan of this run but plain steps, as the table below names it; the "
                                      "sliders, the estimate, its curve and the what-if follow the one picked")
        with gr.Row():
            p.why_dv = gr.Slider(0, 1, value=0.5, step=0.01, label="Acceptance draft → verify",
                                 info="how often the middle level keeps what the level below it proposed", elem_id="hs-a-dv")
            p.why_vt = gr.Slider(0, 1, value=0.5, step=0.01, label="Acceptance → full model",
                                 info="how often the full model keeps what the level below it proposed",
                                 elem_id="hs-a-vt")
        p.why_out = gr.HTML(render.message_html("Generate once: the run's acceptance and this machine's pass costs "
                                                "then explain its speed here.", "info"), elem_id="hs-why")
        p.why_plot = gr.Plot(label="Predicted speedup vs acceptance", elem_id="hs-why-plot", visible=False)
        # the run's acceptance by position in the block, per level pair, and one sentence on its fall
        p.position_plot = gr.Plot(label="Acceptance by position in the block", elem_id="hs-position-plot",
                                  visible=False)
        p.position_note = gr.HTML("", elem_id="hs-position-note")
        with gr.Column(elem_id="hs-what-if-box"):
            gr.Markdown("**What if the levels agreed more (or less)?** Run the real engine on this prompt, on the "
                        "run's own levels and policy, with verdicts drawn at the sliders' acceptance instead of the model's (timing only: every pass runs, the text is not "
                        "the model's), after a real plain run of the same length. Its figures stay here, labelled, "
                        "apart from the real ones.")
            # the list it will run, named after each run (the run's own levels, or why it cannot)
            p.what_if_levels = gr.HTML("", elem_id="hs-what-if-levels")
            with gr.Row(equal_height=True):
                p.what_if_btn = gr.Button("What if: run at the sliders' acceptance (synthetic)",
                                          elem_id="hs-what-if-btn", scale=3)
                p.what_if_takes = gr.Slider(1, what_ifs.MAX_TAKES, value=what_ifs.DEFAULT_TAKES, step=1, label="Takes",
                                            info="each: a real plain run, then the synthetic one",
                                            elem_id="hs-what-if-takes", scale=2)
            p.what_if_status = gr.HTML("", elem_id="hs-what-if-status")
            p.what_if_tokens = gr.HTML("", elem_id="hs-what-if-tokens")
            p.what_if_stats = gr.HTML("", elem_id="hs-what-if-stats")
            p.what_if_plot = gr.Plot(label="What if (synthetic)", visible=False, elem_id="hs-what-if-plot")
            # the synthetic run's own plan table: which plans it ran (the real run's table type)
            p.what_if_plans = gr.HTML("", elem_id="hs-what-if-plans")
            p.what_if_result = gr.State(None)  # the takes' summary, for the table above


def _compare(p) -> None:
    with gr.Accordion("Compare with a baseline", open=True):
        p.compare_status = gr.HTML("<p class='hs-hint'>“Compare with baseline” runs the same prompt with the baselines "
                                   "chosen on the right, several times each, and compares tokens/s and tokens.</p>",
                                   elem_id="hs-compare-status")
        p.compare_out = gr.HTML("", elem_id="hs-compare")
        p.compare_plot = gr.Plot(label="Comparison", visible=False)  # shown with the first result
