"""Step costs of the default model in both weight formats, side by side in one process.

A full step (embedding, layers [0, L), final norm and LM head) over 1, 2, 4, 8 and 16 new tokens
after a 128-token context, rolled back after every call, as the engine meets it; and the 4-bit
kernel's batch invariance on this host's build. Two clocks: wall time on the threads asked for
(what a user sees; noisy on a shared machine), and, with --cpu-time, the CPU time of one thread
(robust to other processes on the machine; no threading). Medians and minima of --repeats calls.

    python scripts/measure/q4_steps.py --json assets/bench/q4_steps_avx512.json
    (with --a8: also the 4-bit blocks with int8 activations, the 'a8' level, on the same steps)
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python scripts/measure/q4_steps.py --json assets/bench/q4_steps_avx2.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hispec.evaluation import host, record  # noqa: E402
from hispec.model.loading import load_model  # noqa: E402

TOKENS = (1, 2, 4, 8, 16)


def step_times(lm, context: list[int], repeats: int, clock) -> dict[int, list[float]]:
    ee = lm.ee
    cache = ee.new_cache(len(context) + 32)
    with torch.inference_mode():
        ee.run_layers(ee.embed(context), 0, ee.num_layers, cache)
        out: dict[int, list[float]] = {n: [] for n in TOKENS}
        for _ in range(repeats):
            for n in TOKENS:
                new = context[-n:]
                t = clock()
                h = ee.run_layers(ee.embed(new), 0, ee.num_layers, cache)
                ee.exit_logits(h, ee.num_layers)
                out[n].append((clock() - t) * 1e3)
                for layer in range(ee.num_layers):
                    cache.crop(layer, len(context))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--threads", type=int, default=None, help="wall-clock threads (default: torch's)")
    p.add_argument("--cpu-time", action="store_true", help="also one-thread CPU time")
    p.add_argument("--json", default=None)
    p.add_argument("--a8", action="store_true", help="also time the a8 view of the 4-bit model (int8 activations)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    models = {w: load_model("default", device="cpu", weights=w, exits="none") for w in ("fp32", "q4")}
    if args.a8:
        from types import SimpleNamespace

        models["a8"] = SimpleNamespace(ee=models["q4"].ee.in_format("a8"))
    text = "Summarise the history of the printing press in Europe, its inventors, and its effects. " * 8
    context = models["fp32"].encode(text)[:128]
    from hispec.evaluation.record import code_version

    report = {"command": "python scripts/measure/q4_steps.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "host": host.describe(), "context": len(context), "repeats": args.repeats, "wall_ms": {}, "cpu_ms": {}}
    for name, clock, threads in (("wall_ms", time.perf_counter, torch.get_num_threads()),
                                 ("cpu_ms", time.thread_time, 1)):
        if name == "cpu_ms" and not args.cpu_time:
            continue
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        runs = {w: [] for w in models}
        for _ in range(3):  # interleave the formats: noise hits both alike
            for w, lm in models.items():
                runs[w].append(step_times(lm, context, max(1, args.repeats // 3), clock))
        torch.set_num_threads(before)
        report[name]["threads"] = threads
        for w in models:
            merged = {n: [t for r in runs[w] for t in r[n]] for n in TOKENS}
            report[name][w] = {n: {"median": round(statistics.median(v), 3), "min": round(min(v), 3)}
                               for n, v in merged.items()}
        report[name]["fp32_over_q4_median"] = {n: round(report[name]["fp32"][n]["median"] / report[name]["q4"][n]["median"], 2)
                                               for n in TOKENS}
        # a k-token pass against a 1-token step, per format: what verifying k drafts costs
        report[name]["k_over_1_median"] = {w: {n: round(report[name][w][n]["median"] / report[name][w][1]["median"], 2)
                                               for n in TOKENS} for w in models}
        if "a8" in models:
            report[name]["a8_over_q4_median"] = {n: round(report[name]["a8"][n]["median"] / report[name]["q4"][n]["median"], 2)
                                                 for n in TOKENS}
    host.finish(report["host"])
    print(json.dumps({k: v for k, v in report.items() if k != "host"}, indent=1))
    print("host:", report["host"]["cpu"], "avx512" if report["host"]["avx512"] else "no avx512",
          "torch", report["host"]["torch_cpu_capability"], "q4 kernel", report["host"]["q4_kernel_isa"],
          "bandwidth", report["host"]["bandwidth_start"], file=sys.stderr)
    record.write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
