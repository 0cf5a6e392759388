"""Compare: the chosen method and its baselines on one prompt, several runs each.

The runs of each pass go in the one fair order every comparison uses (evaluation.order: balanced over
passes, each pass followed by its mirror image, A B C, C B A, B C A, ...), so a machine that speeds up or
slows down favours no method, nor does following a given method. Each row names what ran (levels, policy, lengths, the adaptive policy's plans)
and keeps every run's speed; ratios against plain decoding are taken per pass (the two runs of a
pass are neighbours in time) and summarised by evaluation.pairs (a median, a range that holds, and
what they let one say). Every run is timed by evaluation.pairs, the helper all comparisons share.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import replace
from typing import Callable, Iterator

from hispec.engine.config import DecodeConfig, run_name
from hispec.engine.levels import level_words
from hispec.evaluation import pairs as timed_pairs
from hispec.model.shared import BOARD
from hispec.runs.record import acceptance_in_words
from hispec.runs.runner import plain_config

BASELINES = ("autoregressive", "layerskip")


def compare_configs(config: DecodeConfig, baselines: list[str], ee) -> list[DecodeConfig]:
    """The chosen method with its own settings and policy, then each baseline with its fixed
    meaning on this model: plain decoding, and LayerSkip at the model's own exit and length."""
    chosen = config.resolve_for(ee)
    others = [replace(config.as_preset(m), policy="fixed").resolve_for(ee) for m in baselines if m != config.method]
    return [chosen] + others


def label(config: DecodeConfig) -> str:
    return run_name(config.method, config.policy)


def what_ran(config: DecodeConfig) -> str:
    """The settings a row ran, in words: levels, policy, lengths."""
    if config.method == "autoregressive":
        return "the full model, one token per pass"
    levels = " → ".join([level_words(x).removeprefix("the ") for x in (config.levels or ())] + ["full model"])
    if config.adapts:
        return f"{levels}; adaptive policy (plans chosen each round)"
    k, t = config.lengths or (1, 1)
    lengths = f"{k} draft{'s' * (k != 1)} per round"
    if config.exit_layer("verify") is not None and config.exit_layer("draft") is not None:
        lengths += f", the full model at {t} tentative"
    return f"{levels}; fixed rounds, {lengths}"


def compare(lm, ids: list[int], configs: list[DecodeConfig], repeats: int,
            stop: threading.Event) -> Iterator[object]:
    """Yields progress text (str) before each run, then the comparison: {"rows", "order", "complete"}.
    Every run is timed by the one helper (evaluation.pairs); a pass cut short is not counted."""
    rows: dict[str, dict] = {}
    runs: list[str] = []
    total = repeats * len(configs)
    passes: list[dict[str, float]] = []  # each complete pass: method -> tokens/s
    for rep in range(repeats):
        this: dict[str, float] = {}
        for config in timed_pairs.order(configs, rep):
            if stop.is_set():
                break
            name = label(config)
            yield f"Running {name}… ({len(runs) + 1} of {total})"
            r = timed_pairs.run_timed(lm, ids, config, stop, eos_ids=lm.eos_ids)
            runs.append(name)
            if stop.is_set() and r.stats["finish_reason"] == "stopped":
                break  # cut: neither shown nor counted
            this[name] = r.stats["tokens_per_s"]
            _fold(rows.setdefault(name, {"method": name, "ran": what_ran(config), "runs": [], "plans": {}}), r)
        if len(this) == len(configs):
            passes.append(this)
    for name, row in rows.items():
        row["runs"] = [p[name] for p in passes] or row["runs"]
        row["tokens_per_s"] = statistics.median(row["runs"])
    plain = "autoregressive" if "autoregressive" in rows else None
    for name, row in rows.items():
        row["vs_plain"] = (timed_pairs.summary([p[name] / p[plain] for p in passes if p[plain]], repeats)
                           if plain and name != plain and passes else None)
    yield {"rows": list(rows.values()), "order": runs, "complete": len(passes) == repeats and not stop.is_set()}


def _fold(row: dict, r) -> None:
    """One run into its method's row (the last run's text and figures, every run's speed)."""
    row["runs"].append(r.stats["tokens_per_s"])
    for plan, n in (r.stats.get("policy_choices") or {}).items():
        row["plans"][plan] = row["plans"].get(plan, 0) + n
    row.update(new_tokens=len(r.token_ids), wall_s=r.stats["wall_s"], token_ids=r.token_ids, text=r.text,
               acceptance=acceptance_in_words(r.stats["acceptance"], r.settings), full_passes=r.stats["full_passes"],
               finish_reason=r.stats["finish_reason"], dtype=r.settings.get("dtype", "float32"),
               settings={k: r.settings.get(k) for k in ("levels", "lengths", "policy")})  # acceptance: by levels, in words


def vs_plain(lm, ids: list[int], config: DecodeConfig, new_tokens: int, pairs: int,
             stop: threading.Event, yield_to: Callable[[], bool] | None = None) -> Iterator[object]:
    """The method's speed over plain decoding's on this prompt, measured: `pairs` pairs of runs
    (evaluation.pairs: interleaved, timed alike, prefill included, nothing streamed to a viewer),
    both `new_tokens` long (plain decoding ignores end-of-text). Yields progress text, then
    {"vs_plain": pairs.summary(...) with "new_tokens", each pair's tokens/s and decode rates}; a pair
    cut short (a Stop, the time limit) is not counted, and the summary says how many were.

    `yield_to()`: whether someone else waits for the model (serving: another visitor); asked before
    every pair, and when it says so the pairs left are not run: the summary's "yielded" counts them
    (0 when every pair ran or was cut), apart from "cut". In a member of the pass board (a served generation
    sharing the model), "shared_calls": how many of the pairs' calls carried other visitors' passes too."""
    method = replace(config, max_new_tokens=new_tokens)
    plain = replace(plain_config(config), max_new_tokens=new_tokens).resolve_for(lm.ee)
    done: list[timed_pairs.Pair] = []
    yielded = 0
    items = timed_pairs.pairs(lm, ids, method, plain, pairs, new_tokens, stop, method_eos=lm.eos_ids)
    tally = BOARD.tally()  # a served generation sharing the model: how many of the pairs' calls carried others' passes
    before = tally.shared_calls if tally is not None else 0
    try:
        if yield_to is not None and yield_to():  # before the first pair: none runs
            yielded = pairs
        else:
            for item in items:
                if not isinstance(item, timed_pairs.Pair):
                    yield item
                    continue
                done.append(item)
                if len(done) < pairs and yield_to is not None and yield_to():  # the pairs left give way
                    yielded = pairs - len(done)
                    break
    finally:
        items.close()
    summary = timed_pairs.summary([p.ratio for p in done], pairs)
    if summary is None:
        verdict = ("not measured: another visitor was waiting for the model, and the timing pairs gave way"
                   if yielded else "not measured: the plain runs were cut short")
        yield {"vs_plain": {"runs": 0, "asked": pairs, "cut": pairs - yielded, "yielded": yielded,
                            "new_tokens": new_tokens, "verdict": verdict}}
        return
    summary = dict(summary, cut=max(0, summary["cut"] - yielded), yielded=yielded)
    shared = {"shared_calls": tally.shared_calls - before} if tally is not None else {}
    yield {"vs_plain": {**summary, **shared, "new_tokens": new_tokens,
                        "method_tokens_per_s": [p.method.stats["tokens_per_s"] for p in done],
                        "plain_tokens_per_s": [p.plain.stats["tokens_per_s"] for p in done],
                        "method_decode_tokens_per_s": [timed_pairs.decode_rate(p.method.stats) for p in done],
                        "plain_decode_tokens_per_s": [timed_pairs.decode_rate(p.plain.stats) for p in done],
                        "prefill_s": statistics.median(r.stats.get("prefill_s") or 0.0
                                                       for p in done for r in (p.method, p.plain))}}
