"""Measure the adaptive policy's priors on the tuning split and ship them in the exit heads'
manifest (hispec/evaluation/priors.py says what is measured and how).

    python scripts/measure/measure_priors.py --prompts heldout-tune --max-new-tokens 128 \
        --json assets/policy/priors_cpu_tune.json --manifest assets/exits/smollm2-135m-instruct/manifest.json

Not a timing measurement: acceptance depends on the text, not on the machine (float32).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hispec.evaluation.record import run_record  # noqa: E402
from hispec.evaluation.priors import exit_priors, lookup_priors, measure  # noqa: E402
from hispec.data.prompts import apply_split  # noqa: E402
from hispec.model.loading import load_model  # noqa: E402
from hispec.training.heads.prompts import heldout_prompts  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--prompts", default="heldout-tune", choices=("heldout-tune", "heldout-report"),
                    help="heldout-tune: the priors (defaults never see the report split); heldout-report: the same "
                         "measurement on the report split, to report agreement (never written into a manifest)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", required=True)
    ap.add_argument("--manifest", default=None, help="write the priors into this exit-head manifest")
    ap.add_argument("--formats", default="", help="cheaper formats whose levels to measure too, e.g. q4 "
                    "([full@q4, full], [d@q4, full], [v@q4, full], [d@q4, full@q4, full], [v@q4, full@q4, full])")
    ap.add_argument("--full-only", action="store_true",
                    help="of each --formats format, measure only its full depth ([full@P, full]), not its exits")
    ap.add_argument("--weights", default="fp32", choices=("fp32", "q4"),
                    help="the exact model's format: q4 judges the cheaper levels (--formats a8) by the 4-bit model "
                         "(reporting only: the manifest's priors are judged by the float32 model)")
    ap.add_argument("--formats-only", action="store_true",
                    help="measure only the --formats runs; the manifest keeps its other priors, the new ones are added")
    args = ap.parse_args()
    split = args.prompts.partition("-")[2]
    if args.weights != "fp32" and args.manifest:
        ap.error("--manifest takes priors judged by the float32 model; --weights q4 is for reporting")
    if split == "report" and args.manifest:
        ap.error("--manifest takes priors from the tuning split only; the report split's figures are for reporting")
    formats = tuple(f for f in args.formats.split(",") if f)
    torch.set_num_threads(args.threads)
    lm = load_model(args.model, weights=args.weights, progress=lambda m: print(m, file=sys.stderr))
    sets = apply_split(heldout_prompts(lm), split)
    result = measure(lm, sets, args.max_new_tokens,
                     progress=lambda d, t, w: print(f"[{d}/{t}] {w}", file=sys.stderr, flush=True),
                     formats=formats, exact=not args.formats_only, full_only=args.full_only)
    command = "python scripts/measure/measure_priors.py " + shlex.join(sys.argv[1:])
    priors, exits = lookup_priors(result), exit_priors(result)
    report = {**run_record(lm, command), **result, "lookup_priors": priors,
              "exit_priors": exits}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({"lookup_priors": priors, "exit_priors": exits, "acceptance": result["acceptance"]}, indent=1))
    if args.manifest:
        path = Path(args.manifest)
        manifest = json.loads(path.read_text())
        if args.formats_only:  # the exact-format priors stay as measured before; these are added
            shipped = manifest.get("policy_priors") or {}
            shipped["exits"] = {**(shipped.get("exits") or {}), **exits}
            this = (f"levels in {', '.join(formats)}: per-token acceptance as above, on the same split "
                    f"({sum(len(v) for v in sets.values())} prompts, {args.max_new_tokens} new tokens): '{command}' "
                    f"({args.json})")
            # other formats' sources stay (one ' | ' separated entry per measurement)
            kept = [e for e in (shipped.get("formats_source") or "").split(" | ")
                    if e and not e.startswith(f"levels in {', '.join(formats)}:")]
            shipped["formats_source"] = " | ".join([*kept, this])
            manifest["policy_priors"] = shipped
        else:
            manifest["policy_priors"] = {
                "lookup": priors, "exits": exits,
                "source": f"per-token acceptance, in order up to each block's first rejection, in generations with "
                          f"fixed rounds on the tuning split ({sum(len(v) for v in sets.values())} prompts of "
                          f"'heldout-tune', {args.max_new_tokens} new tokens): lookup copies by the full model by "
                          f"n-gram length ([lookup, full]), each exit's drafts by the full model ([exit, full]), exit "
                          f"d's by exit v ([d, v, full]): '{command}' ({args.json})"}
        path.write_text(json.dumps(manifest, indent=2) + "\n")  # the manifest's own layout
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
