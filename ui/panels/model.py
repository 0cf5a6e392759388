"""The Model panel: Load (a model, then the controls set to its own settings), the presets, and the
settings column's controls (they follow the method, keep d < v < L, draw the depth strip)."""

from __future__ import annotations

import gradio as gr

from hispec.errors import HiSpecError
from hispec.serving.api import LoadRequest
from hispec.serving.session import Server
from hispec.serving.updates import Ended, Output, Status
from ui import controls, labels, render
from ui.model_view import model_defaults, model_info, settings_by_method, trained_layers
from ui.panels.wiring import bind

LOAD = ("status", "info", "draft_layer", "verify_layer", "num_layers", "draft_len", "verify_threshold", "head_layers",
        "method_settings", "levels")  # what Load writes
PRESET = ("status", "method", "policy", "draft_layer", "verify_layer", "draft_len", "verify_threshold", "levels")


class Model:
    """Load reads `model` and writes LOAD; a preset reads `preset_choice` and `model`, writes PRESET; the
    controls read and write the settings column (and the depth strip, the status)."""

    def __init__(self, server: Server):
        self.server = server

    def wire(self, p) -> None:
        p.load_btn.click(*bind(self.load, p, ("model",), LOAD), concurrency_limit=None, api_name="load_model")
        for control in (p.method, p.draft_layer, p.verify_layer, p.num_layers, p.head_layers, p.levels):
            control.change(controls.depth, [p.num_layers, p.draft_layer, p.verify_layer, p.method, p.head_layers,
                                            p.levels], [p.depth], api_name=False, queue=False)
        p.preset_choice.input(*bind(self.preset, p, ("preset_choice", "model"), PRESET), api_name=False)
        # a visitor's pick of a method sets its own defaults for this model (LayerSkip's exit is the benchmark's)
        # a list in the Levels box decides the exits, the adaptive policy the lengths: their sliders step aside
        for control in (p.method, p.levels, p.policy):
            control.change(controls.shown_for, [p.method, p.levels, p.policy],
                           [p.draft_layer, p.verify_layer, p.draft_len, p.verify_threshold], api_name=False, queue=False)
        p.method.change(controls.levels_box_for, [p.method], [p.levels], api_name=False, queue=False)
        p.method.input(controls.method_defaults, [p.method, p.method_settings],
                       [p.draft_layer, p.verify_layer, p.draft_len, p.verify_threshold], api_name=False, queue=False)
        p.draft_layer.release(controls.keep_below, [p.draft_layer, p.verify_layer, p.num_layers],
                              [p.draft_layer, p.verify_layer, p.status], api_name=False, queue=False)
        p.verify_layer.release(controls.keep_above, [p.draft_layer, p.verify_layer, p.num_layers],
                               [p.draft_layer, p.verify_layer, p.status], api_name=False, queue=False)
        for control in (p.method, p.policy, p.draft_layer, p.verify_layer, p.draft_len, p.verify_threshold, p.levels):
            control.input(controls.custom, None, [p.preset_choice], api_name=False, queue=False)

    # ---- the model ------------------------------------------------------------------------------
    def load(self, model, request: gr.Request = None):
        """Load a model (the allow-list applies), then set the controls (by name) to its own settings."""
        for update in self.server.submit(self.server.caller(request), LoadRequest, {"model": model}):
            if isinstance(update, Status):
                yield {"status": render.message_html(update.text, "info")}
            elif isinstance(update, Output) and update.items:
                lm = update.items[0]
                L, preset = lm.ee.num_layers, model_defaults(lm)
                yield {"status": render.message_html(f"Loaded {model}.", "info"), "info": model_info(model, lm),
                       "draft_layer": gr.update(maximum=L - 1, value=preset.draft_layer),
                       "verify_layer": gr.update(maximum=L - 1, value=preset.verify_layer), "num_layers": L,
                       "draft_len": gr.update(value=preset.draft_len),
                       "verify_threshold": gr.update(value=preset.verify_threshold),
                       "head_layers": trained_layers(lm), "method_settings": settings_by_method(lm),
                       # a list this model can run (no 4-bit copy: its own)
                       "levels": labels.default_levels(lm.ee.formats())}
            elif isinstance(update, Ended) and not update.ok:
                yield {"status": render.message_html(update.message)}

    def preset(self, preset_choice, model) -> dict:
        """HiSpec with fixed rounds at a named setting of this model (controls.PRESETS), by control name."""
        try:
            lm = self.server.loaded_model(model)
        except HiSpecError as exc:
            return {"status": render.message_html(str(exc))}
        return controls.preset_values(preset_choice, model_defaults(lm))
