"""Compare: the chosen method and its baselines on one prompt, several runs each.

The order reverses every other pass (A B C, C B A, ...), so a machine that speeds up or slows down
favours no method. Each row names what ran (levels, policy, lengths, the adaptive policy's plans)
and keeps every run's speed; ratios against plain decoding are taken per pass (the two runs of a
pass are neighbours in time) and summarised by their median and range.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import replace
from typing import Iterator

from hispec.engine.decoding import DecodeConfig
from hispec.evaluation.runner import plain_config, run
from hispec.text import Detokenizer

BASELINES = ("autoregressive", "layerskip")


def compare_configs(config: DecodeConfig, baselines: list[str], ee) -> list[DecodeConfig]:
    """The chosen method with its own settings and policy, then each baseline with its fixed
    meaning on this model: plain decoding, and LayerSkip at the model's own exit and length."""
    chosen = config.resolve_for(ee)
    others = [replace(config, method=m, levels=None, draft_layer=None, verify_layer=None, draft_len=None,
                      verify_threshold=None, policy="fixed").resolve_for(ee)
              for m in baselines if m != config.method]
    return [chosen] + others


def label(config: DecodeConfig) -> str:
    return config.method if config.policy == "fixed" else f"{config.method} ({config.policy})"


def what_ran(config: DecodeConfig) -> str:
    """The settings a row ran, in words: levels, policy, lengths."""
    if config.method == "autoregressive":
        return "the full model, one token per pass"
    levels = " → ".join(str(x) if x == "lookup" else f"exit {x}" for x in (config.levels or ())) + " → full model"
    if config.policy == "auto":
        return f"{levels}; adaptive policy (plans chosen each round)"
    lengths = f"draft_len {config.draft_len}"
    if config.verify_layer is not None:
        lengths += f", verify_threshold {config.verify_threshold}"
    return f"{levels}; fixed rounds, {lengths}"


def compare(lm, ids: list[int], configs: list[DecodeConfig], repeats: int,
            stop: threading.Event) -> Iterator[object]:
    """Yields progress text (str) before each run, then the comparison: {"rows", "order", "complete"}."""
    rows: dict[str, dict] = {}
    order: list[str] = []
    total = repeats * len(configs)
    for rep in range(repeats):
        for config in (configs if rep % 2 == 0 else configs[::-1]):
            if stop.is_set():
                break
            name = label(config)
            yield f"Running {name}… ({len(order) + 1} of {total})"
            r = run(lm.ee, ids, config, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer), stop=stop)
            order.append(name)
            row = rows.setdefault(name, {"method": name, "ran": what_ran(config), "runs": [], "plans": {}})
            row["runs"].append(r.stats["tokens_per_s"])
            for plan, n in (r.stats.get("policy_choices") or {}).items():
                row["plans"][plan] = row["plans"].get(plan, 0) + n
            row.update(tokens_per_s=statistics.median(row["runs"]), new_tokens=len(r.token_ids),
                       wall_s=r.stats["wall_s"], token_ids=r.token_ids, text=r.text,
                       acceptance=r.stats["acceptance"], full_passes=r.stats["full_passes"],
                       finish_reason=r.stats["finish_reason"], dtype=r.settings.get("dtype", "float32"),
                       settings={k: r.settings.get(k) for k in ("levels", "draft_layer", "verify_layer", "draft_len",
                                                                "verify_threshold", "policy")})
    plain = rows.get("autoregressive")
    for row in rows.values():
        row["vs_plain"] = ratios(row["runs"], plain["runs"]) if plain and row is not plain else None
    yield {"rows": list(rows.values()), "order": order, "complete": len(order) == total and not stop.is_set()}


def ratios(runs: list[float], plain_runs: list[float]) -> dict | None:
    """A method's speed over plain decoding's, pass by pass: median, low, high, runs."""
    pairs = [a / b for a, b in zip(runs, plain_runs) if b]
    if not pairs:
        return None
    return {"median": statistics.median(pairs), "low": min(pairs), "high": max(pairs), "runs": len(pairs)}


def in_words(vs: dict | None) -> str:
    """'19% slower', '7% faster, within noise', 'as fast': a ratio summary for readers."""
    if not vs:
        return "–"
    m = vs["median"]
    words = "as fast" if abs(m - 1) < 0.005 else f"{abs(m - 1):.0%} {'faster' if m > 1 else 'slower'}"
    if vs["runs"] > 1 and vs["low"] <= 1 <= vs["high"]:
        words += ", within noise"
    elif vs["runs"] == 1:
        words += " (one pair: noisy)"
    return words


def vs_plain(lm, ids: list[int], config: DecodeConfig, new_tokens: int, pairs: int,
             stop: threading.Event) -> Iterator[object]:
    """The method's speed over plain decoding's on this prompt, measured: `pairs` pairs of runs
    back to back (the order reversed every other pair), both `new_tokens` long and timed alike
    (prefill included, nothing streamed to a viewer). Yields progress text, then
    {"vs_plain": {"median", "low", "high", "runs", "method_tokens_per_s", "plain_tokens_per_s"}}."""
    method = replace(config, max_new_tokens=new_tokens)
    plain = replace(plain_config(config), max_new_tokens=new_tokens).resolve_for(lm.ee)
    detok = Detokenizer(lm.tokenizer)
    speeds: dict[str, list[float]] = {"method": [], "plain": []}
    decode: dict[str, list[float]] = {"method": [], "plain": []}  # after the first token: the prefill apart
    prefill: list[float] = []
    for i in range(pairs):
        for which in (("method", "plain") if i % 2 == 0 else ("plain", "method")):
            if stop.is_set():
                break
            yield f"Measuring the speed against plain decoding: pair {i + 1} of {pairs} ({which} run)…"
            # both runs write the same number of tokens: plain decoding ignores end-of-text here
            r = run(lm.ee, ids, method if which == "method" else plain, eos_ids=lm.eos_ids if which == "method" else (),
                    detok=detok, stop=stop)
            speeds[which].append(r.stats["tokens_per_s"])
            decode[which].append(decode_rate(r.stats))
            prefill.append(r.stats.get("prefill_s") or 0.0)
    n = min(len(speeds["method"]), len(speeds["plain"]))
    if n == 0:
        return
    summary = ratios(speeds["method"][:n], speeds["plain"][:n])
    yield {"vs_plain": {**summary, "new_tokens": new_tokens, "method_tokens_per_s": speeds["method"][:n],
                        "plain_tokens_per_s": speeds["plain"][:n], "method_decode_tokens_per_s": decode["method"][:n],
                        "plain_decode_tokens_per_s": decode["plain"][:n], "prefill_s": statistics.median(prefill)}}


def decode_rate(stats: dict) -> float:
    """Tokens per second after the first one (the prompt's prefill and the first round apart)."""
    seconds = (stats.get("wall_s") or 0.0) - (stats.get("prefill_s") or 0.0)
    return (stats["new_tokens"] - 1) / seconds if stats["new_tokens"] > 1 and seconds > 0 else 0.0
