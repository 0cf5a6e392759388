"""What the page shows of a model: its settings by method, its trained exits and their measured
agreement (or raw exits), and the line naming it."""

from __future__ import annotations

import html
from typing import NamedTuple

from hispec.engine.config import preset


def _pct(value) -> str:
    return "–" if value is None else f"{value:.1%}"


def exits_html(info: dict | None) -> str:
    """`info`: the manifest of the attached exit heads (EarlyExitModel.exit_info), or None."""
    if not info:
        return ('<div class="hs-exits"><b>Exits:</b> raw (final norm + LM head at every depth); no trained exit '
                'heads for this model. Train some with <code>python -m hispec train-exits</code>.</div>')
    pair = info.get("default_layers") or {}
    suggested = (f"; suggested exits: draft {int(pair['draft'])}, verify {int(pair['verify'])}"
                 if pair.get("draft") and pair.get("verify") else "")
    if not info.get("layers"):  # e.g. a model fine-tuned to exit early: its own head at every depth
        how = " (the model's weights were trained for early exits)" if info.get("kind") else ""
        return (f'<div class="hs-exits"><b>Exits:</b> final norm + LM head at every depth{html.escape(how)}'
                f"{html.escape(suggested)}.</div>")
    ev = info.get("evaluation") or {}
    agreement = ev.get("agreement") or {}
    layers = [int(x) for x in info.get("layers") or []]
    vocab = (info.get("vocab") or {}).get("size")
    head = (info.get("head") or {}).get("description") or "trained head"
    rows = "".join(
        f"<tr><td>{layer}</td><td>{_pct((agreement.get(str(layer)) or {}).get('raw'))}</td>"
        f"<td>{_pct((agreement.get(str(layer)) or {}).get('trained'))}</td></tr>"
        for layer in layers)
    notes = [f"head: {html.escape(str(head))}"]
    if vocab:
        notes.append(f"exits score the {int(vocab):,} most frequent tokens"
                     + (f" (they cover {ev['subset_coverage']:.0%} of the full model's tokens)"
                        if ev.get("subset_coverage") is not None else ""))
    pair = ev.get("draft_vs_verify")
    if pair:
        notes.append(f"draft {pair['draft']} vs verify {pair['verify']} agree {_pct(pair.get('trained'))} "
                     f"(raw {_pct(pair.get('raw'))})")
    if ev.get("tokens"):
        notes.append(f"measured on {ev['tokens']:,} held-out tokens")
    notes = "".join(f"<li>{n}</li>" for n in notes)
    return ('<div class="hs-exits"><b>Trained exit heads</b> (top-1 agreement with the full model)'
            '<table class="hs-stats"><tr><th>exit layer</th><th>raw exit</th><th>trained</th></tr>'
            f"{rows}</table><ul>{notes}</ul></div>")


class Sliders(NamedTuple):
    """The page's four sliders, in the paper's names (the preset's)."""

    draft_layer: int | None
    verify_layer: int | None
    draft_len: int | None
    verify_threshold: int | None


def _sliders(config) -> Sliders:
    return Sliders(config.preset.draft_layer, config.preset.verify_layer, config.preset.draft_len,
                   config.preset.verify_threshold)


def model_defaults(lm) -> Sliders:
    """HiSpec's settings for this model: its trained exits' recommendation, else the engine's defaults."""
    return _sliders(preset("hispec", policy="fixed").resolve_for(lm.ee))


def settings_by_method(lm) -> dict[str, list]:
    """(d, v, draft_len, verify_threshold) each exit method resolves to on this model, as the
    benchmark runs it (None: not used): LayerSkip's exit is its own, not HiSpec's draft exit."""
    hispec = model_defaults(lm)
    layerskip = _sliders(preset("layerskip", policy="fixed").resolve_for(lm.ee))
    return {"hispec": list(hispec), "layerskip": [layerskip.draft_layer, None, layerskip.draft_len, None]}


def trained_layers(lm) -> list[int]:
    """The exits with a trained head (empty: raw exits everywhere, or a model trained to exit early)."""
    return sorted(int(layer) for layer in (getattr(lm.ee, "exit_heads", None) or {}))


def weights_words(lm) -> str:
    """The format the page runs, named: float32 is the exact reference, 4-bit is exact only to itself."""
    if getattr(lm, "weights", "fp32") == "q4":
        return "4-bit weights (the GGUF file's own Q4_1 blocks: exact to 4-bit decoding, not to float32)"
    if getattr(lm, "weights", "fp32") == "a8":
        return ("4-bit weights with int8 activations (the GGUF file's own blocks, activations quantised as llama.cpp does: "
                "exact to its own decoding in this kernel build, AVX-512 or AVX2, whose texts differ; not to float32)")
    if str(lm.dtype) == "float32":
        if getattr(lm.ee, "blocks", None) is not None:
            return ("float32 weights (the exact reference: greedy output equals transformers' own), multiplied from "
                    "the GGUF file's blocks widened in registers to those very float32 values")
        return "float32 weights (the exact reference: greedy output equals transformers' own)"
    return f"{lm.dtype} weights"


def model_info(name: str, lm) -> str:
    words = weights_words(lm)
    return (f"**{html.escape(name)}** · {lm.ee.num_layers} layers · {lm.device} · {html.escape(words)} · "
            f"loaded in {lm.load_s:.1f} s\n\n" + exits_html(getattr(lm.ee, "exit_info", None)))
