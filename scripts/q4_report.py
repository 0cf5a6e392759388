"""The 4-bit figures from bench JSONs (``bench --weights fp32,q4 --methods autoregressive,hispec/auto,llamacpp``).

For each report: the host, the tokens/s ratios measured side by side, each format's plain step
against its memory bound, the issue's three goals (met or missed), and per prompt where 4-bit output
first parts from float32 (and llama.cpp's from both). Several JSONs (repeated runs) are listed one
by one and then summarised by the median of their ratios.

    python scripts/q4_report.py assets/bench/q4_cpu_default.json [more.json ...] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

AR32, AR4, HS32, HS4, LLAMA = "autoregressive@fp32", "autoregressive@q4", "hispec/auto@fp32", "hispec/auto@q4", "llamacpp"


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first generated token where a and b differ; None when equal over their common length."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def ratios(report: dict) -> dict:
    per = report["summary"]["all"]["methods"]
    tps = {m: s["tokens_per_s"] for m, s in per.items()}
    out = {"tokens_per_s": tps}

    def r(a, b):
        return round(tps[a] / tps[b], 3) if a in tps and b in tps and tps[b] else None

    out["q4_ar_over_fp32_ar"] = r(AR4, AR32)
    out["q4_hispec_over_fp32_ar"] = r(HS4, AR32)
    out["q4_hispec_over_q4_ar"] = r(HS4, AR4)
    out["q4_hispec_over_llamacpp"] = r(HS4, LLAMA)
    out["q4_ar_over_llamacpp"] = r(AR4, LLAMA)
    out["fp32_hispec_over_fp32_ar"] = r(HS32, AR32)
    bound = (report.get("memory_bound") or {}).get("q4") or {}
    out["q4_step_over_bound"] = bound.get("step_over_bound")
    return out


def divergence(report: dict) -> list[dict]:
    by = {}
    for rec in report["records"]:
        by.setdefault((rec["set"], rec["prompt_id"]), {})[rec["method"]] = rec["token_ids"]
    rows = []
    for (set_name, pid), got in sorted(by.items()):
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


def goals(r: dict) -> list[tuple[str, str, bool | None]]:
    def verdict(value, ok):
        return None if value is None else ok(value)

    return [
        ("q4 autoregressive >= 3x fp32 autoregressive", f"{r['q4_ar_over_fp32_ar']}x",
         verdict(r["q4_ar_over_fp32_ar"], lambda v: v >= 3)),
        ("hispec(auto) q4 faster than llama.cpp", f"{r['q4_hispec_over_llamacpp']}x",
         verdict(r["q4_hispec_over_llamacpp"], lambda v: v > 1)),
        ("q4 plain step within 1.5x of the memory bound", f"{r['q4_step_over_bound']}x",
         verdict(r["q4_step_over_bound"], lambda v: v <= 1.5)),
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("reports", nargs="+")
    args = p.parse_args()
    all_ratios = []
    for path in args.reports:
        report = json.loads(Path(path).read_text())
        r = ratios(report)
        all_ratios.append(r)
        print(f"== {path}\nhost: {host_line(report)}")
        print("tokens/s (median over prompts): " + ", ".join(f"{m} {v:.1f}" for m, v in r["tokens_per_s"].items()))
        for name, value, ok in goals(r):
            print(f"  {name}: {value} -> {'met' if ok else 'MISSED' if ok is not None else 'not measured'}")
        for fmt, b in (report.get("memory_bound") or {}).items():
            if b.get("step_ms"):
                print(f"  {fmt}: plain step {b['step_ms']:.2f} ms vs bound {b['bound_ms']:.2f} ms "
                      f"({b['weight_bytes'] / 1e6:.1f} MB at {b['read_gbs']} GB/s) = {b['step_over_bound']}x")
        print("  first divergence (generated token index; - = equal throughout):")
        for row in divergence(report):
            cells = [f"{k} {row[k] if row[k] is not None else '-'}" for k in ("q4_vs_fp32", "llamacpp_vs_q4",
                                                                             "llamacpp_vs_fp32") if k in row]
            print(f"    {row['set']:<20} {row['prompt']:<12} {row['tokens']:>4} tokens   " + "   ".join(cells))
    if len(all_ratios) > 1:
        print(f"== median over {len(all_ratios)} runs")
        for key in ("q4_ar_over_fp32_ar", "q4_hispec_over_fp32_ar", "q4_hispec_over_q4_ar", "q4_hispec_over_llamacpp",
                    "q4_ar_over_llamacpp", "fp32_hispec_over_fp32_ar", "q4_step_over_bound"):
            values = [r[key] for r in all_ratios if r[key] is not None]
            if values:
                print(f"  {key}: {statistics.median(values):.3f} (runs: {', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
