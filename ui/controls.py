"""The settings column's own behaviour: which controls a method uses, its defaults on this model,
d < v < L as the sliders move, the depth strip and the presets. Plain functions of the controls'
values; nothing here runs the model."""

from __future__ import annotations

import gradio as gr

from hispec.engine.levels import parse_levels
from hispec.engine.planning.policy import adapts
from hispec.errors import ConfigError
from ui import labels, render

# Named settings of HiSpec with fixed rounds. The fastest is what the model's trained exits recommend
# (measured on held-out prompts; on the default model draft_len 1 and threshold 1, where HiSpec is
# layerskip at v with a pre-filter at d and "tentative" never shows); the teaching preset is the
# paper's N_d = 2, N_i = 4, where drafts pile up as tentative tokens before the full model runs.
FASTEST, TEACHING = "Fastest measured", "Teaching (drafts pile up)"
PAPER_LENGTHS = (2, 4)
PRESETS = {FASTEST: "the trained exits' recommended layers and lengths (the fastest fixed setting measured).",
           TEACHING: "the same layers with the paper's draft_len 2 and verify_threshold 4: tentative tokens "
                     "pile up before the full model runs, slower here but every stage shows."}
CUSTOM = "Custom (your own settings)"  # shown once a setting a preset set is changed
PRESET_HELP = f"{FASTEST}: {PRESETS[FASTEST]} {TEACHING}: {PRESETS[TEACHING]}"


def custom():
    """A setting that a preset controls was changed by hand: the preset no longer holds."""
    return CUSTOM


def listed(method_label, levels_label) -> tuple | None:
    """The level list the Levels box holds for HiSpec (None: HiSpec's own, from the exit sliders; or a
    list the engine will refuse, which the run's own error then names)."""
    text = labels.levels_name(levels_label)
    if labels.METHODS.get(method_label, "hispec") != "hispec" or not text:
        return None
    try:
        return parse_levels(text)
    except ConfigError:
        return None


def exit_sliders_shown(method_label, levels_label="") -> bool:
    """A list in the Levels box decides the exits: the exit sliders then step aside."""
    return labels.METHODS.get(method_label, "hispec") in ("hispec", "layerskip") and \
        listed(method_label, levels_label) is None


def lengths_shown(method_label, policy_label) -> bool:
    """The lengths sliders are a fixed round's: the adaptive policy plans its own lengths every round."""
    return labels.METHODS.get(method_label, "hispec") in ("hispec", "layerskip") and \
        not adapts(labels.policy_name(policy_label))


def shown_for(method_label, levels_label="", policy_label=labels.FIXED):
    """Which of draft layer, verify layer, draft_len and verify_threshold the method uses, given the
    Levels box (see exit_sliders_shown) and the policy (see lengths_shown)."""
    method = labels.METHODS.get(method_label, "hispec")
    hierarchy = method == "hispec"
    sliders, lengths = exit_sliders_shown(method_label, levels_label), lengths_shown(method_label, policy_label)
    return (gr.update(visible=sliders, label="Draft layer d" if hierarchy else "Exit layer E"),
            gr.update(visible=sliders and hierarchy), gr.update(visible=lengths),
            gr.update(visible=lengths and hierarchy))


def levels_box_for(method_label):
    """The Levels box is HiSpec's."""
    return gr.update(visible=labels.METHODS.get(method_label, "hispec") == "hispec")


def method_defaults(method_label, by_method):
    """The model's own settings of the method just picked (model_view.settings_by_method)."""
    values = (by_method or {}).get(labels.METHODS.get(method_label, ""))
    if not values:
        return (gr.skip(),) * 4
    return tuple(gr.skip() if x is None else x for x in values)


def keep_below(d, v, L):
    """The draft layer moved: the verifier stays above it (or the draft stays below L - 1); the
    status says which slider gave way. (d, v, status)"""
    d, v, L = int(d), int(v), int(L)
    if d < v:
        return gr.skip(), gr.skip(), gr.skip()
    new_d, new_v = (d, d + 1) if d + 1 < L else (L - 2, L - 1)
    return new_d, new_v, _announce(d, v, new_d, new_v, L)


def keep_above(d, v, L):
    """The verify layer moved: the draft stays below it. (d, v, status)"""
    d, v, L = int(d), int(v), int(L)
    if d < v:
        return gr.skip(), gr.skip(), gr.skip()
    new_d, new_v = (v - 1, v) if v > 1 else (1, 2)
    return new_d, new_v, _announce(d, v, new_d, new_v, L)


def _announce(d, v, new_d, new_v, L) -> str:
    moved = []
    if new_d != d:
        moved.append(f"draft layer {d} → {new_d}")
    if new_v != v:
        moved.append(f"verify layer {v} → {new_v}")
    return render.message_html(f"Adjusted: {', '.join(moved)} (the exits must keep 0 < d < v < {L}).", "info")


def depth(L, d, v, method_label, heads=None, levels_label=""):
    """The depth strip, and a warning where an exit in use has no trained head (its raw exit then
    agrees with the full model far less: on the default model d 3, v 5 gave 0% acceptance). A list in
    the Levels box is drawn as it is: its exits on the strip, every level named under it."""
    method = labels.METHODS.get(method_label, "hispec")
    levels = listed(method_label, levels_label)
    if levels is not None:
        depths = [int(str(x).partition("@")[0]) for x in levels if str(x).partition("@")[0].isdigit()]
        d, v = (depths + [None, None])[:2]
        words = " → ".join([labels.level_words(x) for x in levels] + ["full model"])
        whole = [labels.level_words(x) for x in levels if str(x).startswith("full@")]
        if whole:  # a cheaper copy of the whole model: all layers, so the strip has no exit to mark for it
            words += f" ({' and '.join(whole)} {'runs' if len(whole) == 1 else 'run'} every layer, in a cheaper format)"
        used = tuple(depths)  # the exits, in any format, read their layer's head
        strip = render.depth_html(int(L), d, v, method, caption=f"Levels: {words}")
    else:
        used = {"hispec": (int(d), int(v)), "layerskip": (int(d),)}.get(method, ())
        strip = render.depth_html(int(L), int(d), int(v), method)
    untrained = [layer for layer in used if heads and layer not in heads]
    warning = ""
    if untrained:
        warning = render.message_html(
            (f"Exit {untrained[0]} has no trained head" if len(untrained) == 1 else
             f"Exits {' and '.join(map(str, untrained))} have no trained head")
            + ": a raw exit there rarely agrees with "
            f"the full model, so expect low acceptance. Trained exits: {', '.join(map(str, heads))}.", "warn")
    return strip + warning


def preset_values(choice, fastest) -> tuple:
    """(status, method, policy, d, v, draft_len, verify_threshold, levels) of a preset; `fastest`: the
    model's fixed HiSpec settings (model_view.model_defaults). A preset is HiSpec's own levels."""
    if choice not in PRESETS:
        return (gr.skip(),) * 8
    n_d, n_i = (fastest.draft_len, fastest.verify_threshold) if choice == FASTEST else PAPER_LENGTHS
    return (render.message_html(f"Preset: {choice}. {PRESETS[choice]}", "info"), "HiSpec", labels.FIXED,
            fastest.draft_layer, fastest.verify_layer, n_d, n_i, next(iter(labels.LEVELS)))
