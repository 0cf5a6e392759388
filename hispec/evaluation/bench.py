"""Side-by-side benchmarks: several methods on the same prompts in one process.

Every prompt is one pass of every method, after a warm-up, timed by the loop bench and sweep share
(evaluation.timed_passes), the order of each pass balanced over passes (evaluation.order) and recorded,
so that machine noise hits the methods alike. Our methods run on the engine and its event stream; the
peers (transformers' `generate()` and its early exit and lookup, llama.cpp) are external references,
named in one table (evaluation.peers); each method is a value (evaluation.method: BenchMethod), its text
kept only as the report's key. The JSON report is rewritten after every prompt, so an
interrupted run keeps what it measured.

Fair by construction: autoregressive is always the fixed plain loop (no policy, whatever the run's
policy); every method starts from the same calibrated cost model (``CostSnapshot``: calibrated
once, restored before every run, so no method inherits what another's passes taught it); every
run is timed from before its decoder is built (transformers' methods from before `generate()`);
and the summary's headline ratio is the geometric mean of per-prompt ratios (each method's tokens/s
over the reference's on the same prompt), computed here and stored per set and for all.
"""

from __future__ import annotations

import copy
import json
import math
import statistics
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable

from hispec.engine.planning.costs import CostModel
from hispec.engine.config import DecodeConfig, Preset, default_exits, recommended_settings
from hispec.engine.levels import LOOKUP, split_level
from hispec.data.prompts import Prompt
from hispec.evaluation import peers
from hispec.evaluation.method import BenchMethod
from hispec.evaluation.record import run_record
from hispec.evaluation.timed_passes import Items, time_passes
from hispec.runs.runner import run
from hispec.model.loading import LoadedModel
from hispec.text import Detokenizer


def bench_exit(lm: LoadedModel) -> int:
    """The single exit of layerskip and generate(assistant_early_exit): the model's recommended
    one (trained exits), else L/4."""
    return recommended_settings(lm.ee).get("layerskip_exit") or default_exits(lm.ee.num_layers)[1]


def method_config(lm: LoadedModel, method: BenchMethod, base: DecodeConfig,
                  layerskip_exit: int | None = None) -> DecodeConfig:
    """The configuration one of our methods runs with in a benchmark (not resolved). Autoregressive
    is always the fixed plain loop: a policy there would only add planning to the baseline."""
    policy = "fixed" if method.method == "autoregressive" else method.policy or base.policy
    return replace(base, levels=method.levels, policy=policy, preset=_preset(lm, method.method, base, layerskip_exit))


def _preset(lm: LoadedModel, method: str, base: DecodeConfig, layerskip_exit: int | None) -> Preset:
    """A bench method's preset: hispec at the base's layers (None: the model's), layerskip at the bench's exit."""
    return (base.preset or Preset()).as_method(method, layerskip_exit or bench_exit(lm))


class CostSnapshot:
    """One calibrated cost model (engine.planning.costs) that every method of a benchmark starts from.

    Left alone, the model's cost model is shared and refined by every pass of every method, so a
    method's estimates would depend on which methods ran before it. Here it is calibrated once, for
    every exit the methods use, and a copy of that calibration is put back before every run."""

    def __init__(self, lm: LoadedModel, exits: tuple[int, ...], formats: dict[str, tuple[int, ...]] | None = None):
        """`exits`: the exact model's exits the methods use; `formats`: each cheaper format's (levels are
        (depth, precision)): every format's copy of the model is calibrated once and restored alike."""
        self.exits = tuple(sorted(set(exits)))
        self.formats = {p: tuple(sorted(set(e))) for p, e in (formats or {}).items()}
        t0 = time.perf_counter()
        self.costs = CostModel()
        self.costs.calibrate(lm.ee, self.exits)
        self.lane_costs = {}
        for p, lane_exits in self.formats.items():
            self.lane_costs[p] = CostModel()
            self.lane_costs[p].calibrate(lm.ee.in_format(p), lane_exits)
        self.seconds = time.perf_counter() - t0

    @classmethod
    def for_methods(cls, lm: LoadedModel, configs: list[DecodeConfig]) -> CostSnapshot:
        exits, formats = set(), {}
        for config in configs:
            resolved = config.resolve_for(lm.ee)
            for item in resolved.levels or ():
                layer, precision = (None, None) if item == LOOKUP else split_level(item)
                if precision is not None:
                    formats.setdefault(precision, set()).update({layer} if layer is not None else set())
                elif layer is not None:
                    exits.add(layer)
        return cls(lm, tuple(exits), formats)

    def restore(self, lm: LoadedModel) -> None:
        lm.ee.cost_model = copy.deepcopy(self.costs)
        for p, costs in self.lane_costs.items():
            lm.ee.in_format(p).cost_model = copy.deepcopy(costs)

    def describe(self) -> dict:
        return {"how": "calibrated once before the warm-up (layer passes and heads for every exit the methods use), "
                       "then restored from that snapshot before every run, warm-ups included: every method "
                       "starts from the same cost model and none inherits another's refinements",
                "exits": list(self.exits), "calibration_s": round(self.seconds, 3), "figures_ms": self.costs.figures_ms(),
                **({"formats": {p: {"exits": list(self.formats[p]), "figures_ms": c.figures_ms()}
                                for p, c in self.lane_costs.items()}} if self.lane_costs else {})}


def run_one(lm: LoadedModel, method: BenchMethod, ids: list[int], base: DecodeConfig,
            layerskip_exit: int | None = None, costs: CostSnapshot | None = None) -> dict:
    """One generation of one method; the record the report aggregates. `base` holds hispec's
    layers; layerskip and generate(assistant_early_exit) use `layerskip_exit` (default L/4).
    `costs`: the cost model to start from (restored before the run, outside its timing)."""
    return (_run_peer if method.peer else _run_ours)(lm, method, ids, base, layerskip_exit, costs)


def _run_peer(lm: LoadedModel, method: BenchMethod, ids: list[int], base: DecodeConfig,
              layerskip_exit: int | None, costs: CostSnapshot | None) -> dict:
    """A peer's generation (evaluation.peers): its own record; our cost model plays no part."""
    return method.peer.run(lm, ids, base.max_new_tokens, layerskip_exit or bench_exit(lm), method.count)


def _run_ours(lm: LoadedModel, method: BenchMethod, ids: list[int], base: DecodeConfig,
              layerskip_exit: int | None, costs: CostSnapshot | None) -> dict:
    """One of our methods on the engine, from the cost model `costs` holds."""
    config = method_config(lm, method, base, layerskip_exit)
    detok = Detokenizer(lm.tokenizer)
    if costs is not None:
        costs.restore(lm)
    r = run(lm.ee, ids, config, eos_ids=lm.eos_ids, detok=detok)  # timed from before the decoder is built
    s = r.stats
    return {"token_ids": r.token_ids, "wall_s": s["wall_s"], "setup_s": s["setup_s"], "tokens_per_s": s["tokens_per_s"],
            "ttft_s": s["ttft_s"], "decode_tokens_per_s": s["decode_tokens_per_s"],
            "acceptance": s["acceptance"], "tokens_per_full_pass": s["tokens_per_full_pass"],
            "full_passes": s["full_passes"], "useful": s["layer_tokens"]["useful"],
            "wasted": s["layer_tokens"]["wasted"], "stage_s": s["stage_s"], "layers_share": s["layers_share"],
            "policy_choices": s["policy_choices"], "settings": r.settings}


def expand_weights(methods: list[BenchMethod], formats: list[str], policy: str | None = None) -> list[BenchMethod]:
    """With several weight formats, every method without a tag once per format (METHOD@FORMAT, BenchMethod.on),
    format by format; peers that run their own file (llama.cpp) and tagged methods as written. One format:
    the methods unchanged. `policy`: that of level lists named without one (default DecodeConfig's)."""
    policy = policy or DecodeConfig().policy
    if len(formats) < 2:
        return list(methods)
    per_format = [m for m in methods if m.weights is None and m.on_weights]
    return [m.on(fmt, policy) for fmt in formats for m in per_format] + [m for m in methods if m not in per_format]


def benchmark(lm: LoadedModel, sets: dict[str, list[Prompt]], methods: list[BenchMethod], base: DecodeConfig,
              layerskip_exit: int | None = None, json_path: str | None = None, warmup: bool = True,
              progress: Callable[[int, int, str], None] | None = None,
              stop: threading.Event | None = None, models: dict[str, LoadedModel] | None = None,
              host: bool = False, command: str | None = None, background: dict | None = None) -> dict:
    """Run `methods` on every prompt of `sets`; `progress(done, total, what)` is called after every
    prompt (after the JSON is written). `stop`, once set, ends the run before the next method: the
    prompt in progress is dropped (its methods would not be comparable) and the report says `stopped`.
    `models`: the same model in other weight formats by name ('fp32', 'q4'): a method written
    METHOD@FORMAT runs on that one (the others on `lm`). `host`: record the machine and its memory
    bandwidth at the start and the end, and each format's plain step against its memory bound.
    `command`: the command line that asked for this run, kept in the report (the README's figures cite it).
    `background`: the load other processes put on the machine meanwhile (host.busy_cores), recorded."""
    models = dict(models or {})
    peers.check(methods, lm)  # before any prompt runs
    on = lambda method: models.get(method.weights, lm)  # noqa: E731
    resolved = replace(base, preset=_preset(lm, "hispec", base, None)).resolve_for(lm.ee)
    report = {**run_record(lm, command, base), "methods": [m.key for m in methods],
              "max_new_tokens": base.max_new_tokens,
              "settings": {"policy": base.policy, "lookup_len": base.lookup_len,
                           "levels": resolved.levels,  # hispec's list (each record names its own)
                           "layerskip_exit": layerskip_exit or bench_exit(lm),
                           "lengths": resolved.lengths,
                           "layerskip_lengths": replace(base, preset=_preset(lm, "layerskip", base, layerskip_exit)
                                                        ).resolve_for(lm.ee).lengths},
              "records": [], "summary": {}, "complete": False}
    if models:
        report["weights"] = {fmt: getattr(m, "weights", "fp32") for fmt, m in models.items()}
    if host:
        from hispec.evaluation import host as host_info

        report["host"] = host_info.describe()
        if background:
            report["host"]["background_load"] = background
    ours = [m for m in methods if m.peer is None]
    snapshots = _snapshots(lm, models, ours, base, layerskip_exit, report)
    costs_of = lambda method: snapshots.get(id(on(method)))  # noqa: E731

    def one(method: BenchMethod, ids: list[int], new_tokens: int | None) -> dict:
        config = base if new_tokens is None else replace(base, max_new_tokens=new_tokens)
        return run_one(on(method), method, ids, config, layerskip_exit, costs_of(method))

    def saved() -> None:
        report["summary"] = summarise(report["records"], methods)
        if json_path:
            Path(json_path).write_text(json.dumps(report, indent=1))

    time_passes(lm, sets, Items(methods, one, lambda m: {"method": m.key}, lambda m: m.key), report,
                base.max_new_tokens, warmup=warmup, stop=stop, progress=progress, saved=saved)
    if report["records"]:
        report["summary"] = summarise(report["records"], methods)
    if host:
        from hispec.model.formats.q4 import step_bytes, weight_bytes

        host_info.finish(report["host"])
        formats = {m.weights for m in methods if m.weights} or {getattr(lm, "weights", "fp32")}
        named = {f: models.get(f, lm) for f in sorted(formats)}
        report["memory_bound"] = host_info.memory_bound(report, {f: step_bytes(m.ee) for f, m in named.items()},
                                                        {f: weight_bytes(m.model) for f, m in named.items()})
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))
    return report


def _snapshots(lm: LoadedModel, models: dict, ours: list[BenchMethod], base: DecodeConfig,
               layerskip_exit: int | None, report: dict) -> dict[int, CostSnapshot]:
    """One calibration per model (weights format) our methods run on, before anything runs, keyed by the
    model's id; each described in the report's `cost_model` (how, the exits, the calibrated figures)."""
    on = lambda method: models.get(method.weights, lm)  # noqa: E731
    named = {getattr(lm, "weights", "fp32"): lm, **models}
    snapshots: dict[int, CostSnapshot] = {}
    report["cost_model"] = {}
    for m in ours:
        model = on(m)
        if id(model) not in snapshots:
            snapshots[id(model)] = CostSnapshot.for_methods(
                model, [method_config(model, x, base, layerskip_exit) for x in ours if on(x) is model])
            name = next((f for f, x in named.items() if x is model), "model")
            report["cost_model"][name] = snapshots[id(model)].describe()
    return snapshots


def summarise(records: list[dict], methods: list[BenchMethod]) -> dict:
    """Per prompt set (and 'all'): per method tokens/s median and spread, ratios to every other
    method (of the medians), the geometric mean of its per-prompt ratios to the reference
    (`vs_reference`: the headline figure), acceptance, tokens per full pass, work, and output equality."""
    out, keys = {}, [m.key for m in methods]
    for set_name in sorted({r["set"] for r in records}) + ["all"]:
        rows = [r for r in records if set_name == "all" or r["set"] == set_name]
        reference = "autoregressive" if "autoregressive" in keys else keys[0]
        per = {}
        for method in methods:
            m = method.key
            mine = [r for r in rows if r["method"] == m]
            if not mine:
                continue
            own = method.weights and BenchMethod.plain(method.weights).key  # a format's against its own plain decoding
            ref_name = own if own in keys else reference
            ref_ids = {r["prompt_id"]: r["token_ids"] for r in rows if r["method"] == ref_name}
            ref_rows = {(r["set"], r["prompt_id"]): r for r in rows if r["method"] == ref_name}
            tps = [r["tokens_per_s"] for r in mine]
            decode = [r["decode_tokens_per_s"] for r in mine if r.get("decode_tokens_per_s")]
            ttft = [r["ttft_s"] for r in mine if r.get("ttft_s") is not None]
            acc: dict[str, list[float]] = {}
            for r in mine:
                for k, v in (r.get("acceptance") or {}).items():
                    if v is not None:
                        acc.setdefault(k, []).append(v)
            per[m] = {
                "prompts": len(mine),
                "tokens_per_s": statistics.median(tps),
                "tokens_per_s_min": min(tps), "tokens_per_s_max": max(tps),
                "tokens_per_s_iqr": iqr(tps),
                "vs_reference": per_prompt_ratios(mine, ref_rows, ref_name),
                # decode-only: the tokens after the first over the time after it (runs.metrics.decode_rate);
                # None in records made before 2026-12-07, which kept no time to first token
                "decode_tokens_per_s": statistics.median(decode) if decode else None,
                "ttft_s": statistics.median(ttft) if ttft else None,
                "vs_reference_decode": per_prompt_ratios(mine, ref_rows, ref_name, "decode_tokens_per_s"),
                "acceptance": {k: statistics.mean(v) for k, v in acc.items()},
                "tokens_per_full_pass": mean_or_none([r.get("tokens_per_full_pass") for r in mine]),
                "layers_share": mean_or_none([r.get("layers_share") for r in mine]),  # None for transformers' methods
                "useful_layer_tokens": sum(r.get("useful", 0) for r in mine),
                "wasted_layer_tokens": sum(r.get("wasted", 0) for r in mine),
                "outputs_equal": all(ref_ids.get(r["prompt_id"]) == r["token_ids"] for r in mine),
                # where outputs differ (half precision: near-ties rounded differently): how often, and the
                # index of each first difference (0 = the first generated token)
                "outputs_differ": sum(ref_ids.get(r["prompt_id"]) != r["token_ids"] for r in mine),
                "first_divergence": sorted(first_difference(ref_ids.get(r["prompt_id"]), r["token_ids"])
                                           for r in mine if ref_ids.get(r["prompt_id"]) != r["token_ids"]),
            }
        for m, s in per.items():
            s["speedup_vs"] = {o: s["tokens_per_s"] / t["tokens_per_s"] for o, t in per.items()
                               if o != m and t["tokens_per_s"] > 0}
        out[set_name] = {"methods": per, "all_outputs_equal": all(s["outputs_equal"] for s in per.values()),
                         "reference": reference}
    return out


def per_prompt_ratios(mine: list[dict], ref_rows: dict, ref_name: str, key: str = "tokens_per_s") -> dict:
    """Each prompt's `key` (tokens/s end to end, or decode-only) over the reference's on the same prompt
    (`ref_rows`: (set, prompt id) -> record): their geometric mean (the mean of log ratios, so a prompt
    twice as fast and one half as fast cancel), median, min, max."""
    ref = {k: r.get(key) for k, r in ref_rows.items()}
    ratios = [r[key] / ref[(r["set"], r["prompt_id"])] for r in mine
              if ref.get((r["set"], r["prompt_id"])) and r.get(key)]
    if not ratios:
        return {"method": ref_name, "prompts": 0, "geomean": None, "median": None, "min": None, "max": None}
    return {"method": ref_name, "prompts": len(ratios), "geomean": geomean(ratios),
            "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def first_difference(a: list[int] | None, b: list[int]) -> int:
    """Index of the first generated token where two outputs differ (or the shorter one's length)."""
    a = a or []
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def iqr(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def mean_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None
