"""Several visitors at once: the machine's tokens/s when N generations share their passes (model.shared's
board), against the same N requests one after another, in one process (`python -m hispec bench --visitors`).

For each method and each N: N prompts (the sets' first N, repeated if fewer) run one after another, each
alone, then all N at once, each in its own thread, a member of the pass board: their passes through the same
layers run as one call of the batch-invariant native route. Recorded per series: the wall clock from the
first start to the last end, the tokens, the machine's tokens/s (both count prompt evaluation: each
generation's wall clock starts before its prompt is read), and per visitor its tokens/s, first-token time
and whether its token ids equal its solo run's. Plus the board's calls: how many members' passes each
carried, and the rounds by plan that the visitors' policies chose (alone and beside each other). The order alternates from N to N (alone first, then together first), so that a drift of the
machine does not favour one side.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from hispec.errors import HiSpecError
from hispec.evaluation.bench import CostSnapshot, method_config, run_one
from hispec.evaluation.method import BenchMethod
from hispec.evaluation.record import finish, run_record
from hispec.model.shared import BOARD

MAX_VISITORS = 32


def visitor_counts(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]; each between 1 and MAX_VISITORS, no repeats."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or len(set(counts)) < len(counts) or not all(1 <= n <= MAX_VISITORS for n in counts):
        raise HiSpecError(f"--visitors {text}: give visitor counts between 1 and {MAX_VISITORS}, comma-separated "
                          "without repeats, e.g. 1,2,4,8")
    return counts



def _series(runs: list[Callable[[], dict]], together: bool) -> dict:
    """Run the generations one after another or all at once (each a board member in its own thread)."""
    before = Counter(BOARD.counts.by_width)
    records: list[dict | BaseException | None] = [None] * len(runs)
    t0 = time.perf_counter()
    if together:
        gate = threading.Barrier(len(runs))

        def member(i):
            with BOARD.member():
                gate.wait()
                try:
                    records[i] = runs[i]()
                except BaseException as exc:  # noqa: BLE001 - reported below
                    records[i] = exc

        threads = [threading.Thread(target=member, args=(i,), name=f"visitor-{i}") for i in range(len(runs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i, one in enumerate(runs):
            records[i] = one()
    wall = time.perf_counter() - t0
    failed = [r for r in records if isinstance(r, BaseException)]
    if failed:
        raise HiSpecError(f"{len(failed)} of {len(runs)} visitors failed: {failed[0]!r}") from failed[0]
    tokens = sum(len(r["token_ids"]) for r in records)
    widths = Counter(BOARD.counts.by_width) - before
    plans = sum((Counter(r.get("policy_choices") or {}) for r in records), Counter())  # what the policy chose
    return {"wall_s": round(wall, 4), "tokens": tokens, "machine_tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "visitors": [{"tokens": len(r["token_ids"]), "tokens_per_s": r["tokens_per_s"], "wall_s": r["wall_s"],
                          "ttft_s": r["ttft_s"], "token_ids": r["token_ids"]} for r in records],
            "shared_calls": {str(k): v for k, v in sorted(widths.items())},
            "plans": {str(k): v for k, v in plans.most_common()}}


def visitors_bench(models: dict, prompts: list[list[int]], methods: list[BenchMethod], base, counts: list[int],
                   first: str, json_path: str | None = None, progress: Callable[[str], None] | None = None,
                   command: str | None = None, host: bool = True) -> dict:
    """`models`: the loaded model by weights format; `first`: the format of methods without one; `prompts`:
    token ids (at least one). The report: per method and N, both series and their ratio."""
    if any(m.peer is not None for m in methods):
        raise HiSpecError("--visitors runs HiSpec's own methods (the pass board is the engine's): drop the peers "
                          f"({', '.join(m.key for m in methods if m.peer is not None)})")
    lm = models[first]
    report = {**run_record(lm, command, base), "kind": "visitors", "counts": counts, "methods": [m.key for m in methods],
              "max_new_tokens": base.max_new_tokens, "prompts": len(prompts), "results": [], "complete": False}
    if host:
        from hispec.evaluation import host as host_info

        report["host"] = host_info.describe()
    for method in methods:
        on = models[method.weights or first]
        costs = CostSnapshot.for_methods(on, [method_config(on, method, base)])
        run_one(on, method, prompts[0], base, costs=costs)  # warm-up
        for k, n in enumerate(counts):
            chosen = [prompts[i % len(prompts)] for i in range(n)]
            runs = [lambda ids=ids: run_one(on, method, ids, base) for ids in chosen]
            series = {}
            for together in ((False, True) if k % 2 == 0 else (True, False)):
                costs.restore(on)  # the same cost model for both series (the board's members share it)
                series["together" if together else "alone"] = _series(runs, together)
            alone, shared = series["alone"], series["together"]
            same = [a["token_ids"] == b["token_ids"] for a, b in zip(alone["visitors"], shared["visitors"])]
            per_visitor = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(alone["visitors"], shared["visitors"])
                           if a["tokens_per_s"] > 0]
            report["results"].append({
                "method": method.key, "visitors": n, "alone": alone, "together": shared,
                "machine_ratio": shared["machine_tokens_per_s"] / alone["machine_tokens_per_s"],
                "visitor_ratio_median": statistics.median(per_visitor) if per_visitor else None,
                "visitor_ratio_min": min(per_visitor) if per_visitor else None,
                "all_equal_to_solo": all(same), "differ": [i for i, ok in enumerate(same) if not ok]})
            if progress:
                r = report["results"][-1]
                progress(f"{method.key} x{n}: {r['machine_ratio']:.2f}x the machine's tokens/s, "
                         f"outputs equal: {'yes' if r['all_equal_to_solo'] else 'NO'}")
            _save(report, json_path)
    report["complete"] = True
    finish(report)
    if host:
        host_info.finish(report["host"])
    _save(report, json_path)
    return report


def _save(report: dict, path: str | None) -> None:
    if path:
        Path(path).write_text(json.dumps(report, indent=1))


def table(report: dict) -> str:
    """The report as a text table (the CLI prints it; docs/hosting.md's is generated from the JSON)."""
    lines = ["method                     N  alone tok/s  together tok/s  machine x  each visitor x (median, min)  "
             "equal to solo"]
    for r in report["results"]:
        lines.append(f"{r['method']:<25}{r['visitors']:>3}  {r['alone']['machine_tokens_per_s']:>11.1f}  "
                     f"{r['together']['machine_tokens_per_s']:>14.1f}  {r['machine_ratio']:>8.2f}x  "
                     f"{r['visitor_ratio_median'] or 0:>13.2f}x, {r['visitor_ratio_min'] or 0:.2f}x  "
                     f"{'yes' if r['all_equal_to_solo'] else 'NO ' + str(r['differ'])}")
    return "\n".join(lines)
