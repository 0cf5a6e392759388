"""Record the acceptance pattern of real generations, for the GPU timings' recorded mode.

Runs the default model with its trained exit heads on the held-out prompts, with the settings
scripts/gpu/gpu_check.py times (layerskip: 4 drafts per round; hispec: lengths (2, 4)), and
writes the runs of accepted tokens per stage (hispec.runs.timing_only.RecordedAcceptance) to one JSON
file. gpu_check.py replays them on models built from configs: the acceptance of a real, small
early-exit setup on a GPU's step costs. The text such a replay writes is not the model's.

    python scripts/gpu/record_acceptance.py --out assets/gpu/acceptance_default_heldout.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hispec.engine.config import DecodeConfig, Preset  # noqa: E402
from hispec.runs.runner import decoder_for  # noqa: E402
from hispec.evaluation.record import finish, run_record  # noqa: E402
from hispec.model.loading import load_model  # noqa: E402
from hispec.runs.timing_only import RecordedAcceptance  # noqa: E402
from hispec.training.heads.prompts import heldout_prompts  # noqa: E402

PATTERNS = {  # gpu_check.py's settings, at this model's exits
    "layerskip": dict(preset=Preset("layerskip"), lengths=(4, None), policy="fixed"),
    "hispec": dict(preset=Preset("hispec"), lengths=(2, 4), policy="fixed"),
}


def record(lm, prompts, config: DecodeConfig) -> tuple[dict[str, list[int]], int]:
    """Runs per stage over all prompts, and the tokens generated."""
    runs: dict[str, list[int]] = {"verify": [], "target": []}
    tokens = 0
    for prompt in prompts:
        decoder = decoder_for(lm, lm.encode(prompt.text, chat=prompt.chat), config)
        done = list(decoder.events())[-1]
        tokens += len(done.token_ids)
        for stage, stage_runs in RecordedAcceptance.runs_from(decoder.decisions).items():
            runs[stage] += stage_runs
    return runs, tokens


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--prompts", type=int, default=47, help="how many held-out prompts (47: all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default="acceptance.json")
    args = p.parse_args()
    lm = load_model(args.model, progress=lambda m: print(m, file=sys.stderr))
    prompts = [q for qs in heldout_prompts(lm).values() for q in qs][: args.prompts]
    patterns = {}
    for name, settings in PATTERNS.items():
        config = DecodeConfig(max_new_tokens=args.max_new_tokens, **settings).resolve_for(lm.ee)
        runs, tokens = record(lm, prompts, config)
        model = "SmolLM2-135M-Instruct" if lm.name == "default" else lm.name
        d, v = config.exit_layer("draft"), config.exit_layer("verify")
        exits = f"d={d} v={v}" if name == "hispec" else f"exit {d}"
        source = f"{model} with trained exit heads, {name} {exits}, {len(prompts)} held-out prompts"
        patterns[name] = RecordedAcceptance(runs, source).to_dict(
            settings={k: v for k, v in vars(config).items() if k != "stop_strings"}, generated_tokens=tokens)
        print(f"{name}: {RecordedAcceptance(runs, source).describe()}", file=sys.stderr)
    run = finish(run_record(lm, "python scripts/gpu/record_acceptance.py " + shlex.join(sys.argv[1:])))
    Path(args.out).write_text(json.dumps({**run, "model": lm.name, "exits": lm.ee.exit_info.get("layers")
                                          if lm.ee.exit_info else None, "patterns": patterns}))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
