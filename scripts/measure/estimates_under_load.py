"""Whether the page's estimate holds on a loaded machine (issue 58): default runs, one after another, with other
processes keeping cores busy, each explained as "Why this speed" explains it; does each run's estimate sit within
the spread the page states for the others?

Every run goes through the page's own code, without a browser: the app's server (app.serve over a ModelRegistry
that warms the model up as the app does), the page's default settings (ui.settings.PageSettings, the Levels box's
default list, the adaptive policy, the page's MIN_PAIRS timing pairs against plain decoding), serving's
GenerateRequest folded by the page's GenerateView into the run's record, and the Why panel's why_after_run (the
HTML the page shows). From the panel's story (hispec.explain.why.speed_story, the same call) each run records:

    estimate        "this run, estimated from its plans": the estimate and the range the page states beside it
                    (the acceptance's 90% interval)
    measured        "this run, measured against plain decoding": the median ratio of its pairs and the range
                    stated (their spread, widened to the noise floor)
    plain step      plain decoding measured on the pairs against the cost model's, and whether the page flags the
                    cost model as off by more than a quarter (ui.why_view.plain_step_flag); when it does, the page
                    withholds the run's estimate and says the machine is too busy to estimate (ui.why_view.TOO_BUSY)
    costs           the pass costs (ms per layer by new tokens, per head) of every lane the estimate used

and the report says whether every estimate lies inside every run's stated range, and whether the ranges overlap.
The load is hispec.evaluation.host.busy_cores (`--busy` Python busy loops), from before the model loads to the
end: the app's warm-up, which times the passes the estimates are made of, runs under it too. Run it alone.

    python scripts/measure/estimates_under_load.py --busy 1 --runs 3 --json assets/load/estimates_under_load.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

PROMPT = "Explain in two sentences why the sky is blue."  # the lesson's and the screenshots' prompt
ESTIMATE_ROW = re.compile(r"this run, estimated from its plans \(decoding only\)</td><td>[^<]*</td><td>([^<]*)</td>")
MEASURED_ROW = re.compile(r"this run, measured against plain decoding[^<]*</td><td>[^<]*</td><td><b>([^<]*)</b>")


def inside(x: float, span) -> bool:
    return span is not None and span[0] <= x <= span[1]


def one_run(server, settings, pairs: int) -> dict:
    """One page run of `settings` (the app's serving, the page's fold), explained by the page's Why panel."""
    from hispec.explain.why import explained_costs, slider_values, speed_story
    from hispec.serving.api import GenerateRequest
    from ui.generate_view import GenerateView
    from ui.panels.why import Why
    from ui.why_view import plain_step_flag

    from hispec.evaluation.host import loadavg

    start, t = loadavg(), time.perf_counter()
    view = GenerateView(settings.model, pairs=pairs)
    ended = None
    for update in server.submit(server.caller(None), GenerateRequest, settings.request()):
        view.update(update)
        ended = update
    if ended is None or not getattr(ended, "ok", False):
        raise SystemExit(f"the run did not end well: {ended}")
    record = view.kept()
    after = Why(server).why_after_run(record)  # the panel's own call after a run: the HTML the page shows
    record = after.get("last_run") or record  # with the costs its first explanation kept, where it had none
    lanes, whose = explained_costs(record, record.exact_exits)
    a_dv, a_vt, _ = slider_values(record)
    story = speed_story(record, lanes, (a_dv if a_dv is not None else a_vt or 0.5, a_vt or 0.5), frozen=whose)
    html = after["why_out"]
    measured = story["measured"] or {}
    plain = story["plain"]
    flag = plain_step_flag(plain)
    estimate_words = ESTIMATE_ROW.search(html)
    measured_words = MEASURED_ROW.search(html)
    return {
        "seconds": round(time.perf_counter() - t, 1), "loadavg_start": start, "loadavg_end": loadavg(),
        "new_tokens": len(record.token_ids), "finish_reason": record.finish_reason,
        "plans": [{"words": p["words"], "rounds": p["rounds"], "tokens": p["new_tokens"]} for p in story["plans"]],
        "estimate": story["predicted"], "estimate_range": story["predicted_range"],
        "estimate_on_page": estimate_words[1] if estimate_words else None,
        "measured": {k: measured.get(k) for k in ("median", "low", "high", "spread", "runs", "floor", "verdict")},
        "measured_on_page": measured_words[1] if measured_words else None,
        "plain_step": {"measured_decode_tokens_per_s": plain["measured_decode_tokens_per_s"],
                       "cost_model_tokens_per_s": plain["model_tokens_per_s"]},
        "plain_step_flagged": bool(flag), "costs_whose": whose,
        # the pass costs the estimate was made of, per lane (None: the exact model's), as the run kept them
        "costs_ms": {str(fmt or "exact"): cost.figures_ms() for fmt, cost in (lanes or {}).items()},
        "differences": dict(story["differences"]) if story["differences"] else {},
    }


def agreement(runs: list[dict]) -> dict:
    """Whether each run's estimate lies inside every run's stated range (its own included), and whether every two
    ranges overlap; the same for the measured ratios."""
    def judge(values, spans) -> dict:
        pairs = list(itertools.combinations(range(len(values)), 2))
        every = all(inside(v, s) for v in values for s in spans)
        overlap = all(s and t and max(s[0], t[0]) <= min(s[1], t[1]) for s, t in
                      ((spans[i], spans[j]) for i, j in pairs))
        outside = [{"run": i + 1, "value": values[i], "range_of_run": j + 1, "range": spans[j]}
                   for i, j in itertools.product(range(len(values)), repeat=2) if not inside(values[i], spans[j])]
        low, high = min(values), max(values)
        return {"values": values, "ranges": spans, "each_inside_every_range": every, "ranges_overlap": overlap,
                "outside": outside, "max_over_min": round(high / low, 3) if low else None}

    estimates = [r["estimate"] for r in runs]
    measured = [r["measured"]["median"] for r in runs]
    out = {}
    if None not in estimates:
        out["estimates"] = judge(estimates, [list(r["estimate_range"]) if r["estimate_range"] else None
                                             for r in runs])
    if None not in measured:
        out["measured"] = judge(measured, [[r["measured"]["low"], r["measured"]["high"]] for r in runs])
    out["plain_step_flagged"] = sum(r["plain_step_flagged"] for r in runs)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="default runs, one after another (default 3)")
    ap.add_argument("--busy", type=int, default=1, help="busy-loop processes beside them (default 1: one core)")
    ap.add_argument("--prompt", default=PROMPT, help="the prompt of every run (default: %(default)r)")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the page's Max new tokens")
    ap.add_argument("--json", type=Path, help="write the report here")
    args = ap.parse_args(argv)
    if args.runs < 2 or args.busy < 0:
        ap.error("--runs must be at least 2 and --busy at least 0")
    from hispec.evaluation.host import busy_cores, describe, loadavg
    from hispec.evaluation.pairs import MIN_PAIRS
    from hispec.evaluation.record import code_version

    host, before = describe(measure_bandwidth=False), loadavg()  # before the load starts
    with busy_cores(args.busy) as load:
        import app
        from hispec.runs.runner import warm_up
        from hispec.serving.limits import Limits
        from hispec.serving.registry import ModelRegistry
        from ui import labels
        from ui.model_view import model_defaults
        from ui.settings import PageSettings

        t = time.perf_counter()
        registry = ModelRegistry(device="cpu", prepare=warm_up)  # as app.main, which warms each model up
        registry.add("default", registry.get("default"))
        limits = Limits.from_env()
        server = app.serve(registry, "default", limits)
        lm = registry.get("default")
        started = round(time.perf_counter() - t, 1)
        # the page as it opens (ui.page): the Levels box's default list, the adaptive policy, its pairs and length
        settings = PageSettings(args.prompt, "default", "HiSpec", *model_defaults(lm),
                                max_new=args.max_new_tokens or min(96, limits.max_new_tokens), chat=True,
                                policy=labels.DEFAULT_POLICY_LABEL, baseline=MIN_PAIRS,
                                levels=labels.default_levels(lm.ee.formats()))
        runs = []
        for i in range(args.runs):
            runs.append(one_run(server, settings, MIN_PAIRS))
            r = runs[-1]
            rng = r["estimate_range"]
            print(f"run {i + 1}: estimate {r['estimate']:.2f}x" + (f" ({rng[0]:.2f}-{rng[1]:.2f}x)" if rng else "")
                  + f", measured {r['measured_on_page']}, load {r['loadavg_end']}, {r['seconds']} s", flush=True)
    report = {"command": "python scripts/measure/estimates_under_load.py " + " ".join(sys.argv[1:] if argv is None
                                                                                      else argv),
              **code_version(), "host": host, "load": load, "loadavg_before": before,
              "loadavg_end": loadavg(), "app_start_s": started, "prompt": args.prompt,
              "settings": settings.request() | {"prompt": None}, "runs": runs, "agreement": agreement(runs),
              "too_busy_words": "a flagged plain step (ui.why_view.plain_step_flag, counted in agreement.plain_step_flagged) "
                                "withholds the run's estimate: its row reads ui.why_view.TOO_BUSY (estimate_on_page)"}
    print(json.dumps(report["agreement"], indent=1))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
