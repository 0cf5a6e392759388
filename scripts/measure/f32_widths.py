"""The float32 model's step by pass width, before and after its products moved onto the file's blocks, beside
the 4-bit formats: one process, the default model, interleaved round by round.

Formats (each a full-model pass: embedding, every decoder layer, final norm and LM head, after a
--context-token prompt, rolled back after each call):

- ``fp32-torch``: the float32 model through torch's products on its float weights (oneDNN, prepacked: the
  float32 route until 2026-12-07);
- ``fp32``: the same model on the GGUF's blocks, widened in registers to the same float32 values (the wide
  arithmetic of csrc/q4_kernel.cpp; the native route in mode 2);
- ``q4`` (the blocks, float32 activations, the 4-bit arithmetic) and ``a8`` (int8 activations).

Per format and width: the median ms, the same over the format's 1-row figure (``over_1``), and the roofline
(the bytes a step reads over the read bandwidth measured at the start and end, the higher: ``roofline_ms``)
with ``fp32``'s float weights' floor (``float_roofline_ms``: what the float32 route must read). Also the
largest |logit| difference of each format's 8-row pass from ``fp32-torch``'s and whether their argmaxes agree.

    python scripts/measure/f32_widths.py --json assets/bench/f32_widths_cpu.json
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

from hispec.evaluation import host as host_info  # noqa: E402
from hispec.evaluation.record import code_version  # noqa: E402
from hispec.model.formats.q4 import step_bytes, weight_bytes  # noqa: E402
from hispec.model.loading import load_model  # noqa: E402


def pass_fn(ee, ids: list[int], context: int, width: int):
    """A callable running one `width`-row full pass after `context` cached positions (rolled back each time)."""
    cache = ee.new_cache(context + 64)
    ee.run_layers(ee.embed(ids[:context]), 0, ee.num_layers, cache)
    new = ids[context : context + width]

    def run():
        for layer in range(ee.num_layers):
            cache.crop(layer, context)
        hidden = ee.run_layers(ee.embed(new), 0, ee.num_layers, cache)
        return ee.exit_logits(hidden, ee.num_layers)
    return run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--repeats", type=int, default=15, help="timed calls per (format, width), interleaved")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    host = host_info.describe()
    lm = load_model("default", device="cpu", weights="fp32")
    torch_lm = load_model("default", device="cpu", weights="fp32-torch")
    if lm.ee.blocks is None:
        raise SystemExit(f"the float32 model did not load on its blocks here: {lm.ee.f32_route_reason}")
    models = {"fp32-torch": torch_lm.ee, "fp32": lm.ee, "q4": lm.ee.in_format("q4"), "a8": lm.ee.in_format("a8")}
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 40000, (args.context + max(args.widths),), generator=g).tolist()
    runs = {(f, w): pass_fn(ee, ids, args.context, w) for f, ee in models.items() for w in args.widths}
    logits = {f: runs[(f, 8)]() for f in models} if 8 in args.widths else {}
    for fn in runs.values():  # warm up every pass once
        fn()
    times: dict[tuple[str, int], list[float]] = {k: [] for k in runs}
    for _ in range(args.repeats):  # round by round: noise hits every (format, width) alike
        for key, fn in runs.items():
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    host_info.finish(host)
    read = max(host[k]["read_gbs"] for k in ("bandwidth_start", "bandwidth_end"))
    out = {"command": "python " + " ".join(sys.argv), "code": code_version(), "host": host,
           "environment": {"cpu": host["cpu"], "avx512": host["avx512"], "cpus": host["cpus"], "threads": args.threads,
                           "torch": torch.__version__},
           "context": args.context, "repeats": args.repeats, "read_gbs": read, "formats": {}}
    for f, ee in models.items():
        nbytes = step_bytes(ee)
        entry = {"step_bytes": nbytes, "roofline_ms": round(nbytes / (read * 1e9) * 1e3, 3), "ms": {}, "over_1": {}}
        if f.startswith("fp32"):
            dense = weight_bytes(ee.model)
            entry.update(float_bytes=dense, float_roofline_ms=round(dense / (read * 1e9) * 1e3, 3))
        for w in args.widths:
            entry["ms"][w] = round(statistics.median(times[(f, w)]) * 1e3, 3)
        for w in args.widths:
            entry["over_1"][w] = round(entry["ms"][w] / entry["ms"][args.widths[0]], 3)
        if logits:
            diff = (logits[f] - logits["fp32-torch"]).abs().max().item()
            entry["vs_fp32_torch_8rows"] = {"max_abs_logit_diff": diff,
                                            "argmax_equal": bool(torch.equal(logits[f].argmax(-1),
                                                                             logits["fp32-torch"].argmax(-1)))}
        out["formats"][f] = entry
        print(f"{f:>10}: " + "  ".join(f"{w}: {entry['ms'][w]:.2f} ms" for w in args.widths)
              + f"  (roofline {entry['roofline_ms']:.2f} ms)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
