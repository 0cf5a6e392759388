"""Streaming handlers of the app. They yield plain dicts (strings, numbers, lists), so they can
run under ZeroGPU's decorator; app.py turns the dicts into components and figures."""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import replace
from functools import partial
from typing import Iterator

from hispec.engine.decoding import DecodeConfig, recommended_settings
from hispec.engine.events import DoneEvent, event_to_dict
from hispec.engine.policy import plain_rate
from hispec.errors import HiSpecError
from hispec.evaluation.metrics import StatsCollector
from hispec.evaluation.runner import run
from hispec.evaluation.timing_only import SyntheticAcceptance
from hispec.evaluation.trace import Trace
from hispec.serving.limits import Limits
from hispec.serving.registry import ModelRegistry
from hispec.serving.session import (
    OPEN,
    Guard,
    admitted,
    decode_in_background,
    error_update,
    finite_number,
    whole_number,
)
from hispec.text import Detokenizer

from .render import legend_html, tokens_html

log = logging.getLogger("hispec.app")

METHODS = {"HiSpec": "hispec", "LayerSkip (single exit)": "layerskip", "Lookup (copies earlier text)": "lookup",
           "Autoregressive": "autoregressive"}
FIXED = "Fixed (the settings below)"
POLICIES = {"Adaptive (auto)": "auto", FIXED: "fixed"}
MAX_NEW_TOKENS = Limits.from_env().max_new_tokens


def make_config(method_label: str, draft_layer, verify_layer, draft_len, verify_threshold, max_new_tokens,
                temperature=0.0, top_k=0, top_p=1.0, seed=None, limit: int = MAX_NEW_TOKENS,
                policy_label: str = "Fixed (the settings below)") -> DecodeConfig:
    """A DecodeConfig from UI values, with errors a visitor can read."""
    if method_label not in METHODS:
        raise HiSpecError(f"unknown method '{method_label}'; choose from {', '.join(METHODS)}")
    if policy_label not in POLICIES:
        raise HiSpecError(f"unknown policy '{policy_label}'; choose from {', '.join(POLICIES)}")
    # None (the API's empty fields): the model's recommended setting, filled in when the model is known
    d, v, n_d, n_i = (None if value is None else whole_number(name, value) for name, value in (
        ("draft layer", draft_layer), ("verify layer", verify_layer), ("draft length", draft_len),
        ("verify threshold", verify_threshold)))
    n_new = whole_number("max new tokens", max_new_tokens)
    if n_new > limit:
        raise HiSpecError(f"max new tokens {n_new} is over this app's limit of {limit}")
    temperature, top_p = finite_number("temperature", temperature), finite_number("top-p", top_p)
    top_k = whole_number("top-k", top_k or 0)
    seed = None if seed in (None, "", -1) else whole_number("seed", seed)
    method = METHODS[method_label]
    config = DecodeConfig(method, d, v if method == "hispec" else None, n_d, n_i, n_new,
                          temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, policy=POLICIES[policy_label])
    config.validate()
    return config


def generation_stream(registry: ModelRegistry, model_name: str, prompt: str, config: DecodeConfig, chat: bool,
                      stop: threading.Event, throttle_s: float = 0.3, charts_every_s: float = 1.0,
                      guard: Guard = OPEN, visitor: str = "local",
                      what_if: tuple[float, float] | None = None) -> Iterator[dict]:
    """Snapshots of one generation: coloured tokens, stats, history rows, status; the last one also
    holds the run's JSON trace (`events`) and its prompt's token ids.
    `charts` in a snapshot says whether to redraw the charts (at most every `charts_every_s`).
    `what_if`: (draft → verify, → full model) acceptance: a TIMING ONLY run whose verdicts are drawn at
    these rates (hispec.evaluation.timing_only), measured against a plain run of the same budget
    first; its snapshots carry `timing_only` and `baseline`, and its text is not the model's."""
    if not isinstance(prompt, str) or not prompt.strip():
        yield error_update("The prompt is empty: type something or pick an example.")
        return
    if isinstance(model_name, str) and model_name.strip() and model_name.strip() not in registry.loaded():
        yield {"status": f"Loading model {model_name}… (the first start of the default model converts it, ~20 s)"}

    def prepare():
        lm = registry.get(model_name)
        resolved = config.resolve(lm.ee.num_layers, recommended_settings(lm.ee))
        ids = lm.encode(prompt, chat=chat)
        guard.admit(visitor, len(ids), resolved.max_new_tokens)
        return lm, resolved, ids

    prepared = yield from admitted(prepare, registry, model_name, stop, "generation")
    if prepared is None:
        return
    lm, config, ids = prepared
    lock = registry.generation_lock(model_name)
    stats, trace, done, charted = StatsCollector(config.method), Trace(), None, 0.0
    events, extra = [], {}
    judge = before = None
    if what_if is not None:
        judge = SyntheticAcceptance(verify=what_if[0], target=what_if[1], seed=config.seed or 0)
        before = partial(_plain_baseline, lm, ids, config, stop)
    timer, expired = guard.timer(stop)
    timer.start()
    try:
        for batch in decode_in_background(lm, ids, config, lock, stop, throttle_s, judge=judge, before=before):
            notes = [ev for ev in batch if isinstance(ev, dict)]  # from the plain baseline of a what-if run
            for note in notes:
                if "baseline" in note:
                    extra["baseline"] = note["baseline"]
                else:
                    yield note
            batch = [ev for ev in batch if not isinstance(ev, dict)]
            if not batch and done is None:
                continue
            for ev in batch:
                stats.add(ev)
                trace.add(ev)
                events.append(event_to_dict(ev))
                done = ev if isinstance(ev, DoneEvent) else done
            snap = _snapshot(stats, trace, config, done, lm) | extra
            if done is not None:
                snap.update(events=events, prompt_ids=list(ids))
            if judge is not None:
                snap["timing_only"] = judge.describe()
            if done is not None and expired.is_set():
                snap["status"] = f"Stopped at this server's time limit of {guard.limits.max_seconds:g} s per request."
            snap["charts"] = done is not None or time.perf_counter() - charted >= charts_every_s
            charted = time.perf_counter() if snap["charts"] else charted
            yield snap
    except Exception as exc:  # one failed generation must not take the app down
        log.exception("generation failed")
        yield error_update(f"Generation failed ({type(exc).__name__}: {exc}). The app is still running; try again.")
    finally:
        timer.cancel()
        if done is None:  # the visitor went away or it failed: end the worker's generation
            stop.set()


def _plain_baseline(lm, ids: list[int], config: DecodeConfig, stop: threading.Event, emit) -> None:
    """A plain run (the full model, one token per pass) of the same prompt and budget, timed just
    before a what-if run under the same lock: the what-if's speed is a ratio to it."""
    emit({"status": "Timing plain decoding first (the baseline of this what-if run)…"})
    # From the resolved config only what plain decoding uses: its level list (the exits) must go too,
    # or the "plain" run would still draft at them.
    plain = replace(config, method="autoregressive", levels=None, draft_layer=None, verify_layer=None,
                    draft_len=None, verify_threshold=None, policy="fixed").resolve(lm.ee.num_layers)
    r = run(lm.ee, ids, plain, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer), stop=stop)
    emit({"baseline": {"tokens_per_s": r.stats["tokens_per_s"], "new_tokens": len(r.token_ids),
                       "wall_s": r.stats["wall_s"], "levels": list(r.settings.get("levels") or [])}})


def _snapshot(stats: StatsCollector, trace: Trace, config: DecodeConfig, done: DoneEvent | None, lm) -> dict:
    summary = stats.summary()
    status = (f"Done: {summary['finish_reason'].replace('_', ' ')}." if done
              else f"Generating… {summary['new_tokens']} tokens")
    return {
        "html": tokens_html(trace, config.draft_layer, config.verify_layer),
        "legend": legend_html(trace.counts()),
        "stats": summary,
        "history": list(stats.history),
        "status": status,
        "done": done is not None,
        "text": done.text if done else None,
        "settings": done.settings if done else None,
        "num_layers": lm.ee.num_layers,
        "plain_tokens_per_s": _plain_rate(lm),
    }


def _plain_rate(lm) -> float | None:
    """Plain decoding's tokens/s by this machine's cost model of the model, if it was timed (the
    adaptive policy times it; so does "Why this speed")."""
    costs = getattr(lm.ee, "cost_model", None)
    return plain_rate(costs, lm.ee.num_layers) if costs is not None else None


def compare_stream(registry: ModelRegistry, model_name: str, prompt: str, config: DecodeConfig, chat: bool,
                   baselines: list[str], stop: threading.Event, guard: Guard = OPEN,
                   visitor: str = "local", repeats: int = 1) -> Iterator[dict]:
    """Run the chosen method and each baseline on the same prompt, `repeats` times each, the order
    reversed every other pass (a machine that speeds up or slows down then favours no method).
    Each row holds every run's speed; the final update says the order the runs went in."""
    if not isinstance(prompt, str) or not prompt.strip():
        yield error_update("The prompt is empty: type something or pick an example.")
        return
    methods = [config.method] + [METHODS[b] for b in baselines if b in METHODS and METHODS[b] != config.method]
    if len(methods) < 2:
        yield error_update("Pick at least one baseline that differs from the chosen method.")
        return
    def prepare():
        lm = registry.get(model_name)
        # The chosen method keeps its settings and policy; baselines keep their fixed meaning: a plain
        # full model, and LayerSkip at the model's own single exit and length (the benchmark's).
        rec, L = recommended_settings(lm.ee), lm.ee.num_layers
        configs = [config.resolve(L, rec)] + [
            replace(config, method=m, draft_layer=None, verify_layer=None, draft_len=None, verify_threshold=None,
                    policy="fixed").resolve(L, rec) for m in methods[1:]]
        ids = lm.encode(prompt, chat=chat)
        guard.admit(visitor, len(ids), config.max_new_tokens)
        return lm, configs, ids

    prepared = yield from admitted(prepare, registry, model_name, stop, "comparison")
    if prepared is None:
        return
    lm, configs, ids = prepared
    lock = registry.generation_lock(model_name)
    timer, expired = guard.timer(stop)
    timer.start()
    try:
        rows, order, total = {}, [], repeats * len(configs)
        for rep in range(repeats):
            for c in (configs if rep % 2 == 0 else configs[::-1]):
                if stop.is_set():
                    break
                name = c.method if c.policy == "fixed" else f"{c.method} ({c.policy})"
                yield {"status": f"Running {name}… ({len(order) + 1} of {total})"}
                r = run(lm.ee, ids, c, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer), stop=stop)
                order.append(name)
                row = rows.setdefault(name, {"method": name, "runs": []})
                row["runs"].append(r.stats["tokens_per_s"])
                row.update(tokens_per_s=statistics.median(row["runs"]), new_tokens=len(r.token_ids),
                           wall_s=r.stats["wall_s"], token_ids=r.token_ids, text=r.text,
                           acceptance=r.stats["acceptance"], full_passes=r.stats["full_passes"],
                           finish_reason=r.stats["finish_reason"], dtype=r.settings.get("dtype", "float32"),
                           settings={k: r.settings.get(k) for k in ("draft_layer", "verify_layer", "draft_len",
                                                                    "verify_threshold", "policy")})
        complete = len(order) == total and not stop.is_set()
        status = ("Comparison done." if complete
                  else f"Stopped at this server's time limit of {guard.limits.max_seconds:g} s per request."
                  if expired.is_set() else "Stopped.")
        yield {"rows": list(rows.values()), "order": order, "done": True, "sampling": config.temperature > 0,
               "status": status}
    except Exception as exc:
        log.exception("comparison failed")
        yield error_update(f"Comparison failed ({type(exc).__name__}: {exc}). The app is still running; try again.")
    finally:
        timer.cancel()
        lock.release()
