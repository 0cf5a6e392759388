"""Run one test many times in a row while other processes keep the cores busy: whether a test holds
on a loaded machine, counted, not hoped for (issue 37: the Stop test 20 times with both cores busy).

Each run is its own pytest process (a fresh server and browser every time, one worker: `-n 0`), so a
run that leaves something behind cannot make the next one pass or fail. The load is
hispec.evaluation.host.busy_cores: `--busy` Python busy loops, one per core, for the whole series.
Exit code 1 when any run failed or was skipped (a skipped run tested nothing); the JSON report holds
the host, the commit, the load, and every run's outcome, seconds and, for a failure, pytest's last
lines.

    python scripts/measure/repeat_under_load.py \\
        tests/ui/test_browser_speed.py::test_stop_ends_on_how_many_tokens_were_kept \\
        --times 20 --busy 2 --json assets/load/stop_test_under_load.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]

from hispec.evaluation.host import busy_cores, describe, loadavg  # noqa: E402
from hispec.evaluation.record import code_version  # noqa: E402

TAIL_LINES = 30


def outcome(rc: int, out: str) -> str:
    """'passed', 'failed' or 'skipped' from pytest's exit code and summary (a run that selected
    nothing, or skipped its test, is not a pass)."""
    if rc == 0 and " passed" in out and " skipped" not in out:
        return "passed"
    if rc in (0, 5) or " skipped" in out:
        return "skipped"
    return "failed"


def run_once(node: str, timeout_s: float) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", node]
    t = time.perf_counter()
    try:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
        rc, out = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, f"timed out after {timeout_s:.0f} s\n{exc.stdout or ''}"
    record = {"outcome": outcome(rc, out), "seconds": round(time.perf_counter() - t, 1),
              "loadavg_end": loadavg()}
    if record["outcome"] != "passed":
        record["tail"] = out.splitlines()[-TAIL_LINES:]
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("node", help="the test to repeat: tests/FILE.py::NAME (pytest's node id)")
    ap.add_argument("--times", type=int, default=20, help="runs in a row (default 20)")
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes beside the runs (default 2: "
                    "both cores of a 2-core host)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take (default 600)")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(argv)
    if args.times < 1 or args.busy < 0:
        ap.error("--times must be at least 1 and --busy at least 0")
    runs = []
    with busy_cores(args.busy) as load:
        for i in range(args.times):
            runs.append(run_once(args.node, args.timeout))
            print(f"run {i + 1} of {args.times}: {runs[-1]['outcome']} ({runs[-1]['seconds']} s)", flush=True)
    counts = {k: sum(r["outcome"] == k for r in runs) for k in ("passed", "failed", "skipped")}
    report = {"test": args.node, "times": args.times, "load": load, "counts": counts,
              "host": describe(measure_bandwidth=False), **code_version(), "runs": runs}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(counts))
    return 0 if counts["passed"] == args.times else 1


if __name__ == "__main__":
    sys.exit(main())
