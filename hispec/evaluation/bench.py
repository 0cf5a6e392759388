"""Side-by-side benchmarks: several methods on the same prompts in one process.

Every prompt is one pass of every method, after a warm-up, timed by the loop bench and sweep share
(evaluation.timed_passes), the order of each pass balanced over passes (evaluation.order) and recorded,
so that machine noise hits the methods alike. Our methods run on the engine and its event stream; the
peers (transformers' `generate()` and its early exit and lookup, llama.cpp) are external references,
named in one table (evaluation.peers). The JSON report is rewritten after every prompt, so an
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
from hispec.engine.config import METHODS, DecodeConfig, Preset, default_exits, recommended_settings
from hispec.engine.levels import LOOKUP, parse_method, split_level
from hispec.errors import ConfigError
from hispec.data.prompts import Prompt
from hispec.evaluation import peers
from hispec.evaluation.record import run_record
from hispec.evaluation.timed_passes import Items, time_passes
from hispec.runs.runner import run
from hispec.model.loading import WEIGHTS, LoadedModel  # METHOD@FORMAT: a method on the model in that format
from hispec.text import Detokenizer

# A bench without a method list: ours and the peers of the default set (transformers'); every peer of the
# table (llama.cpp's too) by name (evaluation.peers)
BENCH_METHODS = ("autoregressive", *peers.DEFAULT_SET, "layerskip", "lookup", "hispec")


def split_weights(method: str) -> tuple[str, str | None]:
    """The weights tag after the method: 'hispec/auto@q4' -> ('hispec/auto', 'q4'); no tag -> (method, None).

    '@' also names a level's precision ('lookup+full@q4/auto': lookup, then the whole model in 4-bit).
    The last '@X' is the weights tag when it follows a policy ('lookup+4/auto@q4'), a plain method
    name ('hispec@q4', 'llamacpp@q4'), a level that already has its precision ('full@q4@fp32'), or
    when X is fp32 (never a level's precision); otherwise it is a level's: 'lookup+4@q4' runs exit 4
    in 4-bit under the float32 model (write 'lookup+4/auto@q4' for those levels on 4-bit weights)."""
    head, sep, tail = method.rpartition("@")
    if not sep or "/" in tail or "+" in tail:
        return method, None
    plain = head.partition("/")[0] in METHODS or peers.is_peer(head)
    if "/" in head or plain or "@" in head or tail == "fp32":
        return head, tail or None
    return method, None


def check_methods(methods: list[str]) -> None:
    """Each name a bench method, one of ours with /fixed or /auto, or a level list (see levels.parse_method)."""
    for m in methods:
        m, weights = split_weights(m)
        if weights is not None and weights not in WEIGHTS:
            raise ConfigError(f"'{m}@{weights}': the weights after @ are {', '.join(WEIGHTS)}")
        if peers.is_peer(m):
            peer, _ = peers.find(m)  # a malformed count is refused here
            if weights is not None and not peer.on_weights:
                raise ConfigError(f"'{m}@{weights}': {m} runs its own file, whatever the weights; write it without @")
            continue
        name = m.partition("/")[0]
        if name not in METHODS and "+" not in name and "@" not in name and not name.startswith("exit") \
                and not name.isdigit():
            raise ConfigError(f"unknown benchmark method '{m}'; choose from {', '.join(BENCH_METHODS)} (ours "
                              "optionally with /fixed or /auto), or a level list such as lookup+2+4")
        parse_method(m, METHODS)
    peers.check([split_weights(m)[0] for m in methods])  # a peer that cannot run here, said once


def bench_exit(lm: LoadedModel) -> int:
    """The single exit of layerskip and generate(assistant_early_exit): the model's recommended
    one (trained exits), else L/4."""
    return recommended_settings(lm.ee).get("layerskip_exit") or default_exits(lm.ee.num_layers)[1]


def method_config(lm: LoadedModel, method: str, base: DecodeConfig, layerskip_exit: int | None = None) -> DecodeConfig:
    """The configuration one of our methods runs with in a benchmark (not resolved). Autoregressive
    is always the fixed plain loop: a policy there would only add planning to the baseline."""
    spec = parse_method(split_weights(method)[0], METHODS)
    policy = "fixed" if spec.method == "autoregressive" else spec.policy or base.policy
    return replace(base, levels=spec.levels, policy=policy, preset=_preset(lm, spec.method, base, layerskip_exit))


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


def run_one(lm: LoadedModel, method: str, ids: list[int], base: DecodeConfig, layerskip_exit: int | None = None,
            costs: CostSnapshot | None = None) -> dict:
    """One generation of one method; the record the report aggregates. `base` holds hispec's
    layers; layerskip and generate(assistant_early_exit) use `layerskip_exit` (default L/4).
    `costs`: the cost model to start from (restored before the run, outside its timing)."""
    method = split_weights(method)[0]
    if peers.is_peer(method):
        return peers.run(lm, method, ids, base.max_new_tokens, layerskip_exit or bench_exit(lm))
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


def _with_policy(method: str, policy: str) -> str:
    """A level list without a policy gets its '/policy' spelled out before a weights tag, so the tag is
    not read as a level's precision ('lookup+4' -> 'lookup+4/auto' when auto is the policy)."""
    name = method.partition("/")[0]
    if "/" in method or name in METHODS or peers.is_peer(name):
        return method
    return f"{method}/{policy}"


def expand_weights(methods: list[str], formats: list[str], policy: str | None = None) -> list[str]:
    """With several weight formats, every method without a tag once per format (METHOD@FORMAT),
    format by format; peers that run their own file (llama.cpp) and tagged methods as written. One format:
    the methods unchanged. `policy`: that of methods named without one (default DecodeConfig's)."""
    policy = policy or DecodeConfig().policy
    if len(formats) < 2:
        return list(methods)
    per_format = [m for m in methods if split_weights(m)[1] is None and _on_weights(m)]
    return [f"{_with_policy(m, policy)}@{fmt}" for fmt in formats for m in per_format] + [
        m for m in methods if m not in per_format]


def _on_weights(method: str) -> bool:
    """Whether a method runs on the bench's loaded weights (ours, transformers' peers), so @FORMAT applies."""
    return not peers.is_peer(method) or peers.find(method)[0].on_weights


def benchmark(lm: LoadedModel, sets: dict[str, list[Prompt]], methods: list[str], base: DecodeConfig,
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
    peers.check([split_weights(m)[0] for m in methods], lm)  # before any prompt runs
    on = lambda method: models.get(split_weights(method)[1], lm)  # noqa: E731
    resolved = replace(base, preset=_preset(lm, "hispec", base, None)).resolve_for(lm.ee)
    report = {**run_record(lm, command, base), "methods": methods, "max_new_tokens": base.max_new_tokens,
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
    ours = [m for m in methods if not peers.is_peer(split_weights(m)[0])]
    snapshots = _snapshots(lm, models, ours, base, layerskip_exit, report)
    costs_of = lambda method: snapshots.get(id(on(method)))  # noqa: E731

    def one(method: str, ids: list[int], new_tokens: int | None) -> dict:
        config = base if new_tokens is None else replace(base, max_new_tokens=new_tokens)
        return run_one(on(method), method, ids, config, layerskip_exit, costs_of(method))

    def saved() -> None:
        report["summary"] = summarise(report["records"], methods)
        if json_path:
            Path(json_path).write_text(json.dumps(report, indent=1))

    time_passes(lm, sets, Items(methods, one, lambda m: {"method": m}, str), report, base.max_new_tokens,
                warmup=warmup, stop=stop, progress=progress, saved=saved)
    if report["records"]:
        report["summary"] = summarise(report["records"], methods)
    if host:
        from hispec.model.formats.q4 import weight_bytes

        host_info.finish(report["host"])
        formats = {split_weights(m)[1] for m in methods if split_weights(m)[1]} or {getattr(lm, "weights", "fp32")}
        report["memory_bound"] = host_info.memory_bound(report, {f: weight_bytes(models.get(f, lm).model)
                                                                 for f in sorted(formats)})
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1))
    return report


def _snapshots(lm: LoadedModel, models: dict, ours: list[str], base: DecodeConfig, layerskip_exit: int | None,
               report: dict) -> dict[int, CostSnapshot]:
    """One calibration per model (weights format) our methods run on, before anything runs, keyed by the
    model's id; each described in the report's `cost_model` (how, the exits, the calibrated figures)."""
    on = lambda method: models.get(split_weights(method)[1], lm)  # noqa: E731
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


def summarise(records: list[dict], methods: list[str]) -> dict:
    """Per prompt set (and 'all'): per method tokens/s median and spread, ratios to every other
    method (of the medians), the geometric mean of its per-prompt ratios to the reference
    (`vs_reference`: the headline figure), acceptance, tokens per full pass, work, and output equality."""
    out = {}
    for set_name in sorted({r["set"] for r in records}) + ["all"]:
        rows = [r for r in records if set_name == "all" or r["set"] == set_name]
        reference = "autoregressive" if "autoregressive" in methods else methods[0]
        per = {}
        for m in methods:
            mine = [r for r in rows if r["method"] == m]
            if not mine:
                continue
            own = f"autoregressive@{split_weights(m)[1]}"  # a format's methods against its own plain decoding
            ref_name = own if own in methods else reference
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
