"""scripts/measure/estimates_under_load.py judges what it says: an estimate outside another run's stated range
is named, ranges that do not meet are said not to overlap, and runs that agree are said to."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("estimates_under_load",
                                              ROOT / "scripts" / "measure" / "estimates_under_load.py")
estimates = importlib.util.module_from_spec(spec)
spec.loader.exec_module(estimates)


def run(estimate, low, high, measured=1.0, flagged=False) -> dict:
    return {"estimate": estimate, "estimate_range": [low, high], "plain_step_flagged": flagged,
            "measured": {"median": measured, "low": measured * 0.8, "high": measured * 1.2}}


def test_runs_within_each_others_ranges_agree():
    out = estimates.agreement([run(1.0, 0.9, 1.1), run(1.05, 0.95, 1.15), run(0.95, 0.85, 1.1, flagged=True)])
    assert out["estimates"]["each_inside_every_range"] and out["estimates"]["ranges_overlap"]
    assert out["estimates"]["outside"] == [] and out["plain_step_flagged"] == 1
    assert out["measured"]["each_inside_every_range"]


def test_an_estimate_outside_another_runs_range_is_named():
    out = estimates.agreement([run(1.0, 0.9, 1.1), run(1.3, 1.2, 1.4), run(1.05, 0.95, 1.25)])
    judged = out["estimates"]
    assert not judged["each_inside_every_range"]
    assert not judged["ranges_overlap"]  # 0.9-1.1 and 1.2-1.4 never meet
    assert {"run": 2, "value": 1.3, "range_of_run": 1, "range": [0.9, 1.1]} in judged["outside"]
    assert judged["max_over_min"] == 1.3


def test_overlapping_ranges_with_an_estimate_outside_one():
    judged = estimates.agreement([run(1.0, 0.9, 1.1), run(1.15, 1.05, 1.25)])["estimates"]
    assert judged["ranges_overlap"] and not judged["each_inside_every_range"]
