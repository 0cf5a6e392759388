"""The same figures for the same run, before and after runs became records (issue 56).

    python scripts/measure/record_parity.py --record DIR         # this tree: generate, save runs and figures
    git worktree add /tmp/old 759c6fa
    PYTHONPATH=/tmp/old python scripts/measure/record_parity.py --old DIR   # the old code on the same runs

`--record` runs the embedded default model on two prompts, each with the default configuration (lookup ->
the 4-bit model -> the exact model, adaptive) and the Teaching preset (exits 2 and 4, fixed rounds), and saves
each run in the page's old kept shape (settings, stats, events as JSON) with what this tree shows of it: the
plan table (/generate's `plans`), the replayed rounds, and the Why story's estimates on the run's own costs.
`--old` reads the same runs with the code of a tree from before the record (its dict-taking functions) and
compares every figure: the tokens, the plans chosen and every number in them. It prints one line per run and
exits non-zero on a difference. The old tree had no slider estimate for a plan with a 4-bit level: those runs
compare their plan tables and rounds, and the Teaching runs their slider estimates too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

PROMPTS = ("Repeat this list twice: red apple, green pear, yellow banana.",
           "Explain in two sentences why the sky is blue.")
FIGURES = ("words", "rounds", "new_tokens", "share", "measured_tokens_per_s", "predicted", "break_even",
           "predicted_tokens_per_s", "expected_gain")
NAMES = ("break_even_pair",)  # renamed on purpose: an exit by its layer ('exit 4 → full model'), not its role
SLIDERS = (0.3, 0.8)
# this tree, after PYTHONPATH: `--old` runs with the old tree's hispec first on the path
sys.path.append(str(Path(__file__).resolve().parents[2]))


def record(out: Path) -> None:
    from hispec.engine.config import DecodeConfig, preset
    from hispec.engine.events import event_to_dict
    from hispec.explain.why import explained_costs, plan_table, speed_story
    from hispec.model.loading import load_model
    from hispec.runs.record import build
    from hispec.runs.replay import rounds_of
    from hispec.runs.runner import run, warm_up

    lm = load_model("default", device="cpu")
    warm_up(lm)
    out.mkdir(parents=True, exist_ok=True)
    configs = {"default": DecodeConfig(max_new_tokens=48),
               "teaching": preset("hispec", 2, 4, 2, 4, max_new_tokens=48, policy="fixed")}
    for i, prompt in enumerate(PROMPTS):
        ids = lm.encode(prompt, chat=True)
        for name, config in configs.items():
            events = []
            r = run(lm.ee, ids, config.resolve_for(lm.ee), lm.eos_ids, on_event=events.append)
            rec = build(events, r.stats, model="default", prompt_ids=ids)
            lanes, whose = explained_costs(rec, rec.exact_exits)
            story = speed_story(rec, lanes, SLIDERS, frozen=whose) if lanes else None
            kept = {"model": "default", "settings": r.settings, "stats": r.stats, "prompt_ids": ids,
                    "token_ids": r.token_ids, "vs_plain": None, "events": [event_to_dict(e) for e in events]}
            new = {"plans": plan_table(rec), "rounds": rounds_of(rec),
                   "sliders": None if story is None or story.get("sliders") is None else story["sliders"]["predicted"],
                   "break_even": None if story is None or story.get("sliders") is None else story["sliders"]["break_even"],
                   "slider_plan": None if story is None else story.get("slider_plan")}
            (out / f"{name}-{i}.json").write_text(json.dumps({"kept": kept, "new": new}, default=list))
            print(f"{name}-{i}: {len(r.token_ids)} tokens, {len(new['plans'])} plans", flush=True)


def old(out: Path) -> int:
    from hispec.engine.planning.costs import CostModel
    from hispec.explain import why
    from hispec.runs.replay import replay_from_dicts  # the old tree's reader

    bad = 0
    for path in sorted(out.glob("*.json")):
        data = json.loads(path.read_text())
        kept, new = data["kept"], data["new"]
        kept["settings"] = {k: tuple(v) if isinstance(v, list) else v for k, v in kept["settings"].items()}
        plans = why.plan_table(kept)
        diffs = [f"plan {n} {key}: {a.get(key)!r} != {b.get(key)!r}" for n, (a, b) in enumerate(zip(plans, new["plans"]))
                 for key in FIGURES if not _same(a.get(key), b.get(key))]
        renamed = [f"plan {n} {key}: {a.get(key)!r} -> {b.get(key)!r}" for n, (a, b)
                   in enumerate(zip(plans, new["plans"])) for key in NAMES if a.get(key) != b.get(key)]
        if len(plans) != len(new["plans"]):
            diffs.append(f"{len(plans)} plans != {len(new['plans'])}")
        rounds = json.loads(json.dumps(replay_from_dicts(kept["events"])))
        if rounds != new["rounds"]:
            diffs.append("the replayed rounds differ")
        done = next(e for e in kept["events"] if e["type"] == "done")
        shape = why.shape_of(kept["settings"])
        if shape is not None and done.get("costs_ms"):  # the old tree's sliders: exact exits only
            story = why.speed_story(kept, CostModel.from_figures_ms(done["costs_ms"]), SLIDERS, frozen="run")
            for key, value in (("predicted", new["sliders"]), ("break_even", new["break_even"])):
                if not _same(story["sliders"][key], value):
                    diffs.append(f"sliders {key}: {story['sliders'][key]!r} != {value!r}")
        sliders = "old: no slider estimate" if shape is None else "sliders compared"
        print(f"{path.stem}: {'same' if not diffs else 'DIFFERENT'} ({len(plans)} plans, {len(rounds)} rounds, "
              f"{sliders}; new sliders vary {(new['slider_plan'] or {}).get('words')!r} at {new['sliders']})")
        for d in diffs:
            print("   ", d)
        for r in renamed:
            print("    renamed:", r)
        bad += bool(diffs)
    return 1 if bad else 0


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", type=Path, metavar="DIR", help="run the default model here and save the runs")
    group.add_argument("--old", type=Path, metavar="DIR", help="read the saved runs with an older tree's code")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record)
        return 0
    return old(args.old)


if __name__ == "__main__":
    sys.exit(main())
