"""The 4-bit figures from bench JSONs (``bench --weights fp32,q4 --methods autoregressive,hispec/auto,llamacpp``).

For each report (scripts/q4_goals.py): the host, the tokens/s ratios measured side by side
(geometric means of per-prompt ratios), each format's plain step against its memory bound, the three
goals (met or missed), and per prompt where 4-bit output first parts from float32 (and llama.cpp's
from both). Several JSONs (repeated runs) are listed one by one and then summarised by the median of
their ratios. The README's table comes from `python scripts/figures.py` (block q4).

    python scripts/q4_report.py assets/bench/q4_cpu_default.json [more.json ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from q4_goals import divergence, goals, host_line, ratios  # noqa: E402


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
