"""Where the time goes in one generation: layer passes, exit heads and the rest (Python,
bookkeeping, syncs), per method, on a model built from a config (timing-only acceptance).

    python scripts/gpu/gpu_profile.py --shape llama3.2-1B --out profile.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import gpu_check  # noqa: E402

from hispec.engine.config import DecodeConfig, Preset  # noqa: E402
from hispec.model.early_exit import EarlyExitModel  # noqa: E402
from hispec.runs.runner import run  # noqa: E402
from hispec.runs.timing_only import SyntheticAcceptance  # noqa: E402


class Timed:
    """Wraps the EarlyExitModel's layer and head calls with synchronised timers."""

    def __init__(self, ee, device):
        self.ee, self.device, self.t = ee, device, {"layers": 0.0, "heads": 0.0}
        self._layers, self._heads = ee.run_layers, ee.exit_logits
        ee.run_layers = self._wrap(self._layers, "layers")
        ee.exit_logits = self._wrap(self._heads, "heads")

    def _wrap(self, fn, key):
        def inner(*a, **k):
            gpu_check.sync(self.device)
            t0 = time.perf_counter()
            out = fn(*a, **k)
            gpu_check.sync(self.device)
            self.t[key] += time.perf_counter() - t0
            return out
        return inner

    def reset(self):
        self.t = {"layers": 0.0, "heads": 0.0}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="llama3.2-1B")
    p.add_argument("--device", default="cuda")
    p.add_argument("--new", type=int, default=96)
    p.add_argument("--out", default="profile.json")
    p.add_argument("--cuda-graphs", action="store_true", help="replay layer passes from CUDA graphs")
    args = p.parse_args()
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    ee = EarlyExitModel(gpu_check.build(args.shape, dtype, args.device, std=0.02))
    if args.cuda_graphs:
        ee.set_graphs(gpu_check.graph_backend(args.device))
    L = ee.num_layers
    d, v = max(1, round(L / 8)), max(2, round(L / 4))
    prompt = list(range(3, 131))
    methods = {
        "autoregressive": (DecodeConfig(levels=(), preset=Preset("autoregressive"), max_new_tokens=args.new), None),
        "layerskip@0.9": (DecodeConfig(levels=(v,), lengths=(4, None), preset=Preset("layerskip"),
                                       max_new_tokens=args.new, policy="fixed"), (1.0, 0.9)),
        "hispec@0.9/0.9": (DecodeConfig(levels=(d, v), lengths=(2, 4), max_new_tokens=args.new, policy="fixed"),
                           (0.9, 0.9)),
    }
    import transformers

    from hispec.evaluation.record import code_version

    report = {"command": "python scripts/gpu/gpu_profile.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "env": {"torch": torch.__version__, "transformers": transformers.__version__, "device": args.device,
                      "gpu": torch.cuda.get_device_name(0) if args.device.startswith("cuda") else None},
              "new_tokens": args.new, "prompt_tokens": len(prompt), "dtype": str(dtype).removeprefix("torch."),
              "acceptance": "synthetic (timing only), random weights std 0.02",
              "shape": args.shape, "layers": L, "d": d, "v": v, "graphs": args.cuda_graphs, "runs": {}}
    for name, (cfg, rates) in methods.items():  # warm-up
        run(ee, prompt, cfg, judge=SyntheticAcceptance(*rates) if rates else None)
    for rep in range(3):  # plain timings, alternating methods
        for name, (cfg, rates) in methods.items():
            gpu_check.sync(args.device)
            r = run(ee, prompt, cfg, judge=SyntheticAcceptance(*rates, seed=rep) if rates else None)
            report["runs"].setdefault(name, []).append(round(r.stats["tokens_per_s"], 2))
    timed = Timed(ee, args.device)
    report["breakdown_s"] = {}
    for name, (cfg, rates) in methods.items():
        timed.reset()
        t0 = time.perf_counter()
        r = run(ee, prompt, cfg, judge=SyntheticAcceptance(*rates) if rates else None)
        total = time.perf_counter() - t0
        report["breakdown_s"][name] = {"total": round(total, 4), **{k: round(x, 4) for k, x in timed.t.items()},
                                       "other": round(total - sum(timed.t.values()), 4),
                                       "full_passes": r.stats["full_passes"], "rounds": r.stats["rounds"]}
    ee.run_layers, ee.exit_logits = timed._layers, timed._heads
    prof = cProfile.Profile()
    cfg, rates = methods["layerskip@0.9"]
    prof.enable()
    run(ee, prompt, cfg, judge=SyntheticAcceptance(*rates))
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    report["cprofile_layerskip"] = buf.getvalue()
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k != "cprofile_layerskip"}, indent=1))
    print(buf.getvalue()[:6000])


if __name__ == "__main__":
    main()
