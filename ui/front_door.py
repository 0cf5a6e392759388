"""The page's first words: what the default runs and how much faster it measured on the developers' machine
(not the host serving the page), read from the shipped benchmark reports (never typed in), and where the
paper's exit hierarchy is (the Teaching preset), with the figure measured at the Teaching preset's own
settings (its layers and lengths, fixed rounds), never another setting's.
A report that is missing or unreadable, or that did not measure the preset as it is, leaves its figure out
(and says where to measure it), never the page."""

from __future__ import annotations

import json
from pathlib import Path

from ui.controls import PAPER_LENGTHS

ASSETS = Path(__file__).resolve().parent.parent / "assets"
BENCH = ASSETS / "bench"
DEFAULT_REPORT = "headline_cpu_fresh2.json"  # the README's headline: the default on heldout-fresh-2
# the lengths sweep at the default exits, fixed rounds: its cell at the paper's lengths is the Teaching preset
TEACHING_REPORT = "sweep_cpu_tune_lengths.json"
EXITS_MANIFEST = ASSETS / "exits" / "smollm2-135m-instruct" / "manifest.json"  # the default's recommended exits
DEFAULT_METHOD, PLAIN = "hispec/auto@fp32", "autoregressive@fp32"
MEASURE_TEACHING = ("pick it with “pairs” above 0 to measure it on this server, or run `python -m hispec bench "
                    "--sweep lengths` at its layers and lengths")


def _report(name: str, folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _geomean(report: dict | None, method: str, key: str = "vs_reference") -> tuple[float, int] | None:
    """(geometric mean of the method's speed over plain decoding, prompts) over every prompt of a report;
    `key`: vs_reference (end to end) or vs_reference_decode (decode-only, in reports since 2026-12-07)."""
    try:
        vs = report["summary"]["all"]["methods"][method][key]
        return float(vs["geomean"]), int(vs["prompts"])
    except (KeyError, TypeError, ValueError):
        return None


def teaching(report: dict | None, manifest: dict | None) -> dict | None:
    """The lengths sweep's cell at the Teaching preset's settings (a sweep runs fixed rounds): the default's
    recommended exits (its manifest's), the paper's lengths; with its speed over plain decoding (geometric mean,
    `speedup_geomean`) and its prompts. None when the report did not measure exactly that."""
    if not report or not manifest:
        return None
    try:
        exits = (manifest["default_layers"]["draft"], manifest["default_layers"]["verify"])
        grid = report["grids"]["lengths"]
        if tuple(sorted(grid["fixed"].values())) != exits:  # the exits it held fixed (draft below verify)
            return None
        cells = report["summary"]["grids"]["lengths"]["cells"]
        return next((c for c in cells if (c[grid["rows_axis"]], c[grid["cols_axis"]]) == PAPER_LENGTHS), None)
    except (KeyError, TypeError, AttributeError):
        return None


def _teaching_words(folder: Path, manifest_path: Path) -> str:
    """The Teaching preset's measured speed, named with where and how it was measured; else where to measure it."""
    report = _report(TEACHING_REPORT, folder)
    measured = teaching(report, _report(manifest_path.name, manifest_path.parent))
    if measured is None:
        return f" (no shipped report measured it as it is: {MEASURE_TEACHING})"
    ratio, prompts = measured["speedup_geomean"], measured["prompts"]
    env = report.get("environment") or {}
    before = ("; measured before the float32 model multiplied from its file's blocks, against plain decoding through "
              "torch's products" if env.get("weights", "fp32") == "fp32" and "f32_products" not in env else "")
    return (f" (the Teaching preset's own settings, fixed rounds: {ratio:.2f}× plain decoding, geometric mean over "
            f"{prompts} tuning prompts, {report.get('max_new_tokens', '?')} tokens each, {_host(report)}{before}; "
            f"`assets/bench/{TEACHING_REPORT}`)")


def _host(report: dict) -> str:
    env = report.get("environment") or {}
    return ", ".join(str(x) for x in (env.get("cpu"), f"{env['threads']} threads" if env.get("threads") else None)
                     if x)


def intro(folder: Path = BENCH, manifest: Path = EXITS_MANIFEST) -> str:
    """The first screen's Markdown (`folder`: the benchmark reports; `manifest`: the default's exits)."""
    default = _report(DEFAULT_REPORT, folder)
    measured = _geomean(default, DEFAULT_METHOD)
    speed = ""
    if measured:
        ratio, prompts = measured
        decode = _geomean(default, DEFAULT_METHOD, "vs_reference_decode")
        after_first = f", {decode[0]:.2f}× after the first token" if decode else ""
        speed = (f" Measured on the developers' machine, not on this server: **{ratio:.2f}× plain decoding** end to "
                 f"end{after_first} (geometric mean over {prompts} prompts no "
                 f"development touched, {default.get('max_new_tokens', '?')} tokens each, {_host(default)}; "
                 f"`assets/bench/{DEFAULT_REPORT}`), with the same text.")
    agreement = sorted((default or {}).get("priors", {}).get("agreement", {}).values())
    agree = (f"its exits agree with the full model only {agreement[0]:.0%}–{agreement[-1]:.0%} of the time"
             if agreement else "its exits rarely agree with the full model")
    slower = _teaching_words(folder, manifest)
    return ("# HiSpec — hierarchical speculative decoding, token by token\n"
            "**What the default runs** (on the embedded SmolLM2-135M): a free lookup level copies earlier text, **the 4-bit model** (the same "
            "weights in 4-bit, multiplied with int8 activations) drafts and checks, and **the exact float32 model** (the GGUF file dequantised to float32 by "
            "transformers) decides every token, so the text is exactly the float32 model's. The adaptive policy chooses, round by round, which of them runs and "
            f"how much, from the acceptance and costs it measures as it goes.{speed}\n\n"
            "**The paper's hierarchy** (a shallow exit drafts, a deeper exit weeds out bad drafts, the full model "
            f"verifies) is the **Teaching** preset under Settings: every stage shows, but on this small model {agree}, "
            f"so it is slower than plain decoding{slower}. Every token is coloured by what happened to it; click one "
            "to read its story. Below the text: the run round by round, why it was (or was not) faster, and what "
            "each exit believed.")
