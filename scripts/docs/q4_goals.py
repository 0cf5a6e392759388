"""The 4-bit figures from a bench JSON (``bench --weights fp32,q4 --methods
autoregressive,hispec/auto,llamacpp,llamacpp_lookup``): ratios taken side by side (the geometric mean of
per-prompt ratios), each format's plain step against its memory bound, the goals of the 4-bit path (met
or missed; a peer that did not run leaves its goals unmeasured), and per prompt where 4-bit output
first parts from float32 (and llama.cpp's from both). Used by scripts/q4_report.py and by the README's
generated table (figures_tables.q4_table): repository tooling, outside the package."""

from __future__ import annotations

import math
import statistics

from hispec.evaluation.method import BenchMethod

AR32, AR4, HS32, HS4 = "autoregressive@fp32", "autoregressive@q4", "hispec/auto@fp32", "hispec/auto@q4"
LLAMA, LLAMA_LOOKUP = "llamacpp", "llamacpp_lookup"  # llama.cpp's plain decoding and its n-gram lookup (defaults)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first generated token where a and b differ; None when they are equal."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if a == b else i


def _per_prompt(report: dict, key: str = "tokens_per_s") -> dict[tuple[str, str], dict[str, float]]:
    """(set, prompt) -> method -> the record's `key` (tokens_per_s: end to end; decode_tokens_per_s:
    decode-only, recorded since 2026-12-07)."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for rec in report["records"]:
        if rec.get(key):
            out.setdefault((rec["set"], rec["prompt_id"]), {})[rec["method"]] = rec[key]
    return out


def median_rate(report: dict, method: str, key: str = "tokens_per_s") -> float | None:
    """The method's median `key` over the prompts it ran (None where no record holds it)."""
    values = [t[method] for t in _per_prompt(report, key).values() if method in t]
    return statistics.median(values) if values else None


def geomean_ratio(report: dict, a: str, b: str, key: str = "tokens_per_s") -> float | None:
    """The geometric mean over prompts of a's `key` (tokens/s end to end by default) over b's on the same
    prompt (None if not both ran, or the records hold no such figure)."""
    logs = [math.log(t[a] / t[b]) for t in _per_prompt(report, key).values() if a in t and b in t]
    return round(math.exp(statistics.mean(logs)), 3) if logs else None


def best_lookup(report: dict) -> str:
    """The fastest of llama.cpp's lookups the run measured (llamacpp_lookup at its defaults, llamacpp_lookup:N
    for other lengths), by the geometric mean of its per-prompt ratios over llama.cpp's plain decoding: the
    goal compares hispec with the best setting of the peer, not only its defaults."""
    ran = {rec["method"] for rec in report["records"]}
    lookups = sorted(m for m in ran if getattr(BenchMethod.parse(m).peer, "name", None) == LLAMA_LOOKUP)
    scored = [(geomean_ratio(report, m, LLAMA) or 0.0, m) for m in lookups]
    return max(scored)[1] if scored else LLAMA_LOOKUP


def ratios(report: dict) -> dict:
    per = _per_prompt(report)
    methods = sorted({m for t in per.values() for m in t})
    lookup = best_lookup(report)
    out = {"tokens_per_s": {m: statistics.median(t[m] for t in per.values() if m in t) for m in methods},
           "llamacpp_lookup_best": lookup}
    for key, (a, b) in {"q4_ar_over_fp32_ar": (AR4, AR32), "q4_hispec_over_fp32_ar": (HS4, AR32),
                        "q4_hispec_over_q4_ar": (HS4, AR4), "q4_hispec_over_llamacpp": (HS4, LLAMA),
                        "q4_ar_over_llamacpp": (AR4, LLAMA), "fp32_hispec_over_fp32_ar": (HS32, AR32),
                        "q4_hispec_over_llamacpp_lookup": (HS4, lookup),
                        "llamacpp_lookup_over_llamacpp": (lookup, LLAMA)}.items():
        out[key] = geomean_ratio(report, a, b)
    bound = (report.get("memory_bound") or {}).get("q4") or {}
    out["q4_step_over_bound"] = bound.get("step_over_bound")
    return out


def outputs_by_prompt(report: dict) -> dict[tuple[str, str], dict[str, list[int]]]:
    """Each prompt's (set, id) -> each method's generated token ids on it."""
    by: dict[tuple[str, str], dict[str, list[int]]] = {}
    for rec in report["records"]:
        by.setdefault((rec["set"], rec["prompt_id"]), {})[rec["method"]] = rec["token_ids"]
    return by


def output_pairs(report: dict, method: str, reference: str) -> list[tuple[list[int], list[int]]]:
    """(method's tokens, reference's tokens) on every prompt both ran."""
    return [(got[method], got[reference]) for got in outputs_by_prompt(report).values()
            if method in got and reference in got]


def divergence(report: dict) -> list[dict]:
    rows = []
    for (set_name, pid), got in sorted(outputs_by_prompt(report).items()):
        row = {"set": set_name, "prompt": pid, "tokens": len(got.get(AR32, []))}
        if AR32 in got and AR4 in got:
            row["q4_vs_fp32"] = first_difference(got[AR32], got[AR4])
        if LLAMA in got:
            for ref, key in ((AR4, "llamacpp_vs_q4"), (AR32, "llamacpp_vs_fp32")):
                if ref in got:
                    row[key] = first_difference(got[ref], got[LLAMA])
        rows.append(row)
    return rows


def host_line(report: dict) -> str:
    h = report.get("host") or {}
    env = report.get("environment") or {}
    bw = [h.get(k, {}).get("read_gbs") for k in ("bandwidth_start", "bandwidth_end")]
    return (f"{h.get('cpu', '?')}, {'AVX-512' if h.get('avx512') else 'no AVX-512'} (torch kernels "
            f"{h.get('torch_cpu_capability')}, 4-bit kernel {h.get('q4_kernel_isa')}), {env.get('threads')} threads, "
            f"read bandwidth {bw[0]} / {bw[1]} GB/s (start / end), load {h.get('loadavg_start')} -> {h.get('loadavg_end')}")


def _fastest(r: dict) -> str:
    """' (its fastest here, llamacpp_lookup:N)' where the goal's lookup is not the defaults' one."""
    best = r.get("llamacpp_lookup_best", LLAMA_LOOKUP)
    return f" (its fastest here, {best})" if best != LLAMA_LOOKUP else ""


def goals(r: dict) -> list[tuple[str, str, bool | None]]:
    def verdict(value, ok):
        return None if value is None else ok(value)

    def x(value):
        return "not measured" if value is None else f"{value}x"

    return [
        ("q4 autoregressive >= 3x fp32 autoregressive", x(r["q4_ar_over_fp32_ar"]),
         verdict(r["q4_ar_over_fp32_ar"], lambda v: v >= 3)),
        ("q4 autoregressive >= llama.cpp plain", x(r["q4_ar_over_llamacpp"]),
         verdict(r["q4_ar_over_llamacpp"], lambda v: v >= 1)),
        ("hispec(auto) q4 >= 1.3x llama.cpp plain", x(r["q4_hispec_over_llamacpp"]),
         verdict(r["q4_hispec_over_llamacpp"], lambda v: v >= 1.3)),
        ("hispec(auto) q4 >= llama.cpp with its lookup" + _fastest(r), x(r["q4_hispec_over_llamacpp_lookup"]),
         verdict(r["q4_hispec_over_llamacpp_lookup"], lambda v: v >= 1)),
        ("q4 plain step within 2x of the memory bound", x(r["q4_step_over_bound"]),
         verdict(r["q4_step_over_bound"], lambda v: v <= 2)),
    ]


