"""The a8 default's choice record, recomputed from the shipped artifacts (issue 57, item 7).

The float32 default's middle level became the 4-bit model with int8 activations (`lookup,full@a8`) in
place of the same blocks with float32 activations (`lookup,full@q4`). This prints, on both splits that
measured the two lists side by side, the geometric mean over prompts of the per-prompt ratio (a8 list's
tokens/s over the q4 list's, same prompt, same run) with a 95% bootstrap interval (prompts resampled
with replacement, 10,000 resamples, percentile interval, seed 0), and whether it is significant (the
interval excludes 1). It also prints the first heldout-fresh run's old default over plain q4 decoding,
the result the decision followed.

    python scripts/docs/choice_record.py
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUNE = "assets/bench/drafter_tune_cpu.json"  # tuning split, committed in 8cb528b (after the decision, 2737ce7)
FRESH = "assets/bench/headline_cpu_fresh_a8.json"  # heldout-fresh, the second run on that split (5073217)
FIRST_FRESH = "assets/bench/headline_cpu_fresh.json"  # heldout-fresh, the first run (b0a1212, before 2737ce7)
A8_LIST = {TUNE: "lookup+full@a8/auto@fp32", FRESH: "hispec/auto@fp32"}  # both ran ['lookup', 'full@a8']
Q4_LIST = "lookup+full@q4/auto@fp32"
RESAMPLES, SEED = 10_000, 0


def per_prompt(report: dict, a: str, b: str) -> list[float]:
    """tokens/s of method a over method b, prompt by prompt (prompts that ran both)."""
    by: dict[tuple, dict] = {}
    for r in report["records"]:
        by.setdefault((r["set"], r["prompt_id"]), {})[r["method"]] = r["tokens_per_s"]
    return [v[a] / v[b] for v in by.values() if a in v and b in v]


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def bootstrap(ratios: list[float], resamples: int = RESAMPLES, seed: int = SEED) -> tuple[float, float]:
    """The 95% percentile interval of the geometric mean, prompts resampled with replacement."""
    rng = random.Random(seed)
    means = sorted(geomean([rng.choice(ratios) for _ in ratios]) for _ in range(resamples))
    return means[int(0.025 * resamples) - 1], means[int(0.975 * resamples) - 1]


def load(path: str, root: Path = ROOT) -> dict:
    return json.loads((root / path).read_text(encoding="utf-8"))


def a8_over_q4(report: dict, path: str) -> dict:
    ratios = per_prompt(report, A8_LIST[path], Q4_LIST)
    low, high = bootstrap(ratios)
    return {"prompts": len(ratios), "geomean": geomean(ratios), "low": low, "high": high,
            "significant": not low <= 1.0 <= high}


def old_default_over_plain_q4(first_fresh: dict) -> dict:
    ratios = per_prompt(first_fresh, "hispec/auto@fp32", "autoregressive@q4")  # it ran ['lookup', 'full@q4']
    return {"prompts": len(ratios), "geomean": geomean(ratios)}


def words(r: dict) -> str:
    """'1.048× (95% CI 0.99–1.11×, 23 prompts): not significant'"""
    verdict = "significant" if r["significant"] else "not significant"
    return f"{r['geomean']:.3f}× (95% CI {r['low']:.2f}–{r['high']:.2f}×, {r['prompts']} prompts): {verdict}"


def main(root: Path = ROOT) -> None:
    first = old_default_over_plain_q4(load(FIRST_FRESH, root))
    print(f"first heldout-fresh run ({FIRST_FRESH}): the old default (lookup,full@q4) over plain q4 decoding "
          f"{first['geomean']:.2f}× ({first['prompts']} prompts)")
    for name, path in (("tuning split", TUNE), ("heldout-fresh", FRESH)):
        print(f"{name} ({path}): lookup,full@a8 over lookup,full@q4 {words(a8_over_q4(load(path, root), path))}")


if __name__ == "__main__":
    main()
