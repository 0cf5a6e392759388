"""Where the time goes inside real generations: every layer-range call, exit-head call and
attention step is timed where the engine makes it (not in a loop of repeated calls, where weights
stay in the CPU caches), per method, on held-out prompts of the default model's trained exits.

    python scripts/measure/time_split.py --prompts 8 --max-new-tokens 128 --json split.json

Per method it prints milliseconds per generated token by kind of call (e.g. "layers [4,30) x2":
layers 4 to 29 over 2 new tokens; "exit 4 head": the exit head's logits; "attention step 4": an
attention exit head's own attention step), calls per token and milliseconds per call; "other" is
the rest of the wall time (token choice, events, bookkeeping). CPU timings without synchronisation:
on an accelerator use scripts/gpu/gpu_profile.py.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hispec.engine.config import preset  # noqa: E402
from hispec.model.loading import load_model  # noqa: E402
from hispec.evaluation.record import finish, run_record  # noqa: E402
from hispec.runs.runner import run  # noqa: E402
from hispec.text import Detokenizer  # noqa: E402
from hispec.training.heads.prompts import heldout_prompts  # noqa: E402


class CallTimer:
    """Wraps the model's layer ranges, heads and attention steps with timers keyed by call kind."""

    def __init__(self, ee):
        self.ms, self.calls = defaultdict(float), Counter()
        layers, logits = ee.run_layers, ee.exit_logits

        def run_layers(hidden, start, end, cache):
            n = hidden.shape[1]
            return self._timed(f"layers [{start},{end}) x{n if n < 4 else '4+'}", layers, hidden, start, end, cache)

        def exit_logits(hidden, layer):
            name = "final head" if layer == ee.num_layers else f"exit {layer} head"
            return self._timed(name, logits, hidden, layer)

        ee.run_layers, ee.exit_logits = run_layers, exit_logits
        for layer, head in ee.exit_heads.items():
            if getattr(head, "stateful", False):
                attend = head.attend
                head.attend = (lambda *a, _f=attend, _n=f"attention step {layer}", **k: self._timed(_n, _f, *a, **k))

    def _timed(self, name, fn, *args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        self.ms[name] += (time.perf_counter() - t0) * 1e3
        self.calls[name] += 1
        return out

    def reset(self):
        self.ms.clear()
        self.calls.clear()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="autoregressive,layerskip,hispec")
    p.add_argument("--prompts", type=int, default=8, help="held-out prompts, every 6th of the 47 (default 8)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("default")
    prompts = [q for qs in heldout_prompts(lm).values() for q in qs][::6][: args.prompts]
    timer = CallTimer(lm.ee)
    command = "python scripts/measure/time_split.py " + shlex.join(sys.argv[1:])
    report = {**run_record(lm, command), "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "threads": args.threads, "methods": {}}
    for method in args.methods.split(","):
        config = preset(method, max_new_tokens=args.max_new_tokens, policy="fixed")
        run(lm.ee, lm.encode(prompts[0].text, chat=prompts[0].chat), preset(method, max_new_tokens=8, policy="fixed"),
            eos_ids=lm.eos_ids)  # warm-up
        timer.reset()
        wall, tokens = 0.0, 0
        for prompt in prompts:
            ids = lm.encode(prompt.text, chat=prompt.chat)
            t0 = time.perf_counter()
            r = run(lm.ee, ids, config, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer))
            wall += time.perf_counter() - t0
            tokens += len(r.token_ids)
        rows = {name: {"ms_per_token": ms / tokens, "calls_per_token": timer.calls[name] / tokens,
                       "ms_per_call": ms / timer.calls[name]} for name, ms in timer.ms.items()}
        other = wall * 1e3 - sum(timer.ms.values())
        report["methods"][method] = {"tokens": tokens, "wall_s": wall, "ms_per_token": wall * 1e3 / tokens,
                                     "settings": r.settings, "calls": rows, "other_ms_per_token": other / tokens}
        print(f"== {method}: {tokens} tokens, {tokens / wall:.1f} tok/s, {wall * 1e3 / tokens:.2f} ms per token")
        for name in sorted(rows, key=lambda n: -rows[n]["ms_per_token"]):
            row = rows[name]
            print(f"  {name:<24}{row['ms_per_token']:>7.2f} ms/token {row['calls_per_token']:>6.2f} calls/token "
                  f"{row['ms_per_call']:>7.2f} ms/call")
        print(f"  {'other':<24}{other / tokens:>7.2f} ms/token")
    finish(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
