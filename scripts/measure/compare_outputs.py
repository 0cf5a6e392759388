"""How often, and how soon, the outputs of two benchmark runs differ prompt by prompt (for example
the same method in float32 and in bfloat16).

    python scripts/measure/compare_outputs.py assets/bench/bench_cpu_default.json assets/bench/bench_cpu_bf16.json \
        --method autoregressive --against autoregressive,layerskip,hispec
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hispec.evaluation.bench import first_difference  # noqa: E402


def outputs(path: str, method: str) -> dict[tuple[str, str], list[int]]:
    report = json.load(open(path))
    return {(r["set"], r["prompt_id"]): r["token_ids"] for r in report["records"] if r["method"] == method}


def compare(a: dict, b: dict) -> dict:
    """Prompts in both runs, how many differ, and the index of each first difference."""
    common = sorted(set(a) & set(b))
    firsts = []
    for key in common:
        x, y = a[key], b[key]
        if x != y:
            firsts.append(first_difference(x, y) + 1)  # token numbers: 1 = the first generated token
    return {"prompts": len(common), "differ": len(firsts), "first_divergence": sorted(firsts),
            "median_first_divergence": statistics.median(firsts) if firsts else None}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("first", help="benchmark JSON (python -m hispec bench --json)")
    p.add_argument("second", help="another benchmark JSON on the same prompts")
    p.add_argument("--method", default="autoregressive", help="the method of the first run to compare against")
    p.add_argument("--against", default="autoregressive", help="comma list of methods of the second run")
    args = p.parse_args()
    base = outputs(args.first, args.method)
    if not base:
        print(f"compare_outputs: no '{args.method}' records in {args.first}", file=sys.stderr)
        return 2
    for method in args.against.split(","):
        r = compare(base, outputs(args.second, method))
        print(f"{method:<16} vs {args.method} of the first run: {r['differ']} of {r['prompts']} differ, "
              f"median first difference at token {r['median_first_divergence']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
