"""The page's first words: what the default runs and how much faster it measured on the developers' machine
(not the host serving the page), read from the shipped benchmark reports (never typed in), and where the
paper's exit hierarchy is (the Teaching preset).
A report that is missing or unreadable leaves its figure out, never the page."""

from __future__ import annotations

import json
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "assets" / "bench"
DEFAULT_REPORT = "headline_cpu_fresh2.json"  # the README's headline: the default on heldout-fresh-2
EXITS_REPORT = "levels_cpu_report.json"  # the level lists in float32, the paper's fixed hierarchy among them
DEFAULT_METHOD, PLAIN = "hispec/auto@fp32", "autoregressive@fp32"


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


def _host(report: dict) -> str:
    env = report.get("environment") or {}
    return ", ".join(str(x) for x in (env.get("cpu"), f"{env['threads']} threads" if env.get("threads") else None)
                     if x)


def intro(folder: Path = BENCH) -> str:
    """The first screen's Markdown."""
    default, exits = _report(DEFAULT_REPORT, folder), _report(EXITS_REPORT, folder)
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
    fixed = _geomean(exits, "hispec/fixed")
    slower = f" (fixed exit rounds: {fixed[0]:.2f}× plain decoding, `assets/bench/{EXITS_REPORT}`)" if fixed else ""
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
