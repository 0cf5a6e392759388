"""The 4-bit kernel's pass cost by pass width: 1 to 16 rows, both formats, both builds, side by side in one
process, against the step's roofline (its weight bytes over this host's measured read bandwidth).

Formats: ``q4`` (float32 activations, the exact 4-bit route) and ``a8`` (int8 activations per block of 32,
integer dot products). Builds: every kernel build this host runs (``avx512``, ``avx2``), loaded side by
side (``q4_kernel.load``), so a ratio between builds is taken under the same load. Each (build, format,
width) is timed two ways, interleaved round by round so that noise from other processes hits all alike:

- ``layer_products_ms``: one decoder layer's four products (qkv, o, gate+up, down) straight through the
  kernel's matmul entry points (for a8 the packed-weight entry, activation quantisation included);
- ``step_ms``: every decoder layer through the native route (one ``hispec_q4_layers`` call:
  norms, attention, cache writes included) plus the LM head product, after a 128-token context,
  rolled back after each call.

Each width's figure is also given over the same build and format's 1-row figure (``over_1``; medians,
and ``step_min_over_1`` from each one's quickest call, what a quiet machine does): the goal is at most
1.5 at 8 rows and 2 at 16. ``roofline_ms`` is the bytes one step reads (decoder
blocks plus the LM head's blocks) over the read bandwidth measured at the start and end of the run
(the higher of the two medians).

``decode`` (per thread count, this host's default build only): the engine's plain decoding of
--decode-tokens tokens, the median time between two tokens, against the bare step it takes per token
(embedding, layers, final norm, LM head, argmax), both formats taking turns: what the loop around the
model costs (the goal: decoding within 1.15x of the step).

    python scripts/measure/q4_widths.py --clock cpu --repeats 9 --json assets/bench/q4_widths_cpu.json
    python scripts/measure/q4_widths.py --json assets/bench/q4_widths_cpu.json      (wall clock, 2 and 1 threads)
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hispec.evaluation import host  # noqa: E402
from hispec.evaluation import record  # noqa: E402
from hispec.evaluation.record import code_version  # noqa: E402
from hispec.model.formats import q4_kernel, q4_layer  # noqa: E402
from hispec.model.loading import load_model  # noqa: E402

FORMATS = ("q4", "a8")


def _ptr(t):
    return t.data_ptr()


def product_calls(lib, mats, fmt: str, rows: int, threads: int):
    """(function, args) per matrix: `rows` rows through the kernel entry of `fmt` (inputs kept alive)."""
    calls, keep = [], []
    for m in mats:
        N, K = m.shape
        x, out = torch.randn(rows, K), torch.empty(rows, N)
        keep += [x, out]
        if m.kind == "Q8_0":
            if fmt == "a8" and hasattr(lib, "hispec_q80_matmul_a8p"):  # the a8 view's LM head (q4_layer.A8Head)
                head = q4_layer.A8Head(lib, m)
                keep.append(head)
                calls.append((lib.hispec_q80_matmul_a8p, (_ptr(x), rows, K, _ptr(head.packed), N, _ptr(out), N,
                                                           threads)))
            else:
                calls.append((lib.hispec_q80_matmul, (_ptr(x), rows, K, _ptr(m.qs), _ptr(m.d), N, _ptr(out), N,
                                                      threads)))
        elif fmt == "a8" and not hasattr(lib, "hispec_q41_matmul_a8p"):  # a build before the packed layout
            calls.append((lib.hispec_q41_matmul_a8, (_ptr(x), rows, K, _ptr(m.qs), _ptr(m.d), _ptr(m.m), N, _ptr(out),
                                                     N, threads)))
        elif fmt == "a8":
            packed = q4_layer.packed_a8(lib, m)
            keep.append(packed)
            calls.append((lib.hispec_q41_matmul_a8p, (_ptr(x), rows, K, _ptr(packed), N, _ptr(out), N, threads)))
        else:
            calls.append((lib.hispec_q41_matmul, (_ptr(x), rows, K, _ptr(m.qs), _ptr(m.d), _ptr(m.m), N, _ptr(out),
                                                  N, threads)))
    return calls, keep


def phase_ms(lib) -> dict[str, float]:
    """The native call's phase clock (thread 0, barrier to barrier; q4_layer.PHASES), then off."""
    buf = (ctypes.c_double * 8)()
    lib.hispec_q4_profile(0, 1, buf)
    return {name: buf[i] * 1e3 for i, name in enumerate(q4_layer.PHASES)}


NOW = time.perf_counter  # --clock cpu: time.thread_time (this thread's CPU time; 1 thread only)


def timed(calls) -> float:
    t = NOW()
    for fn, a in calls:
        fn(*a)
    return (NOW() - t) * 1e3


def decode_vs_step(lm, threads: int, context: list[int], tokens: int, repeats: int) -> dict:
    """Plain decoding through the engine (the Decoder's loop: sampling, bookkeeping, events) against the bare
    step it takes per token (embedding, every layer, final norm, LM head, argmax), for the 4-bit model and
    its a8 view on this host's build, the formats taking turns: what a token costs outside the layers."""
    from types import SimpleNamespace

    from hispec.engine.config import DecodeConfig
    from hispec.engine.events import TokenEvent
    from hispec.runs.runner import decoder_for

    torch.set_num_threads(threads)
    models = {"q4": lm, "a8": SimpleNamespace(ee=lm.ee.in_format("a8"), tokenizer=lm.tokenizer, eos_ids=set())}
    gaps, steps = {f: [] for f in models}, {f: [] for f in models}
    config = DecodeConfig(max_new_tokens=tokens).plain()
    for _ in range(repeats):
        for fmt, model in models.items():
            stamps = [NOW() for ev in decoder_for(model, context, config, eos_ids=()).events()
                      if isinstance(ev, TokenEvent)]
            gaps[fmt] += [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])]
            ee = model.ee
            cache = ee.new_cache(len(context) + tokens + 1)
            with torch.inference_mode():
                token = int(ee.exit_logits(ee.run_layers(ee.embed(context), 0, ee.num_layers, cache),
                                           ee.num_layers)[0, -1].argmax())
                for _ in range(tokens):
                    t = NOW()
                    hidden = ee.run_layers(ee.embed([token]), 0, ee.num_layers, cache)
                    token = int(ee.exit_logits(hidden, ee.num_layers)[0, -1].argmax())
                    steps[fmt].append((NOW() - t) * 1e3)
    out = {"isa": q4_kernel.host_isa(), "threads": threads, "tokens": tokens}
    for fmt in models:
        gap, step = statistics.median(gaps[fmt]), statistics.median(steps[fmt])
        out[fmt] = {"decode_ms_per_token": round(gap, 4), "step_ms": round(step, 4),
                    "decode_over_step": round(gap / step, 3)}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 12, 16])
    p.add_argument("--repeats", type=int, default=15, help="timed calls per (build, format, width), interleaved")
    p.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    p.add_argument("--isas", nargs="+", default=None, help="kernel builds (default: every one this host runs)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: perf_counter; cpu: this thread's CPU time, robust to other processes taking turns on "
                        "a shared machine (forces --threads 1: the kernel then runs on the calling thread)")
    p.add_argument("--json", default=None)
    p.add_argument("--decode-tokens", type=int, default=64,
                   help="plain decoding against the bare step, per token, this many tokens a run (0: skip)")
    args = p.parse_args()
    global NOW
    if args.clock == "cpu":
        NOW, args.threads = time.thread_time, [1]
    isas = args.isas or [i for i in ("avx512", "avx2") if q4_kernel.host_isa() == "avx512" or i == "avx2"]
    report = {"command": "python scripts/measure/q4_widths.py " + " ".join(sys.argv[1:]), "code": code_version(),
              "host": host.describe(), "isas": isas, "vnni": {}, "widths": args.widths,
              "clock": args.clock}
    lm = load_model("default", device="cpu", weights="q4", exits="none")
    ee = lm.ee
    lean = ee.lean
    layer0 = [p.matrix for p in (lean.layers[0].qkv, lean.layers[0].o, lean.layers[0].gate_up, lean.layers[0].down)]
    head = lean.lm_head.matrix
    block_bytes = sum(p.matrix.nbytes for w in lean.layers for p in (w.qkv, w.o, w.gate_up, w.down))
    report["weight_bytes"] = {"decoder_blocks": block_bytes, "lm_head_blocks": head.nbytes,
                              "step": block_bytes + head.nbytes}
    text = "Summarise the history of the printing press in Europe, its inventors, and its effects. " * 8
    context = lm.encode(text)[:128]
    natives = {}
    for isa in isas:
        lib = q4_kernel.load(isa)
        report["vnni"][isa] = bool(lib.hispec_q4_vnni())
        for fmt in FORMATS:
            natives[isa, fmt] = q4_layer.NativeLayers(lean, isa, act8=fmt == "a8")
    results, clock_mode = {}, 2 if args.clock == "cpu" else 1
    with torch.inference_mode():
        cache = ee.new_cache(len(context) + 64)
        ee.run_layers(ee.embed(context), 0, ee.num_layers, cache)
        saved = lean.native
        for threads in args.threads:
            torch.set_num_threads(threads)
            per = {}
            for n in args.widths:
                calls = {}
                for isa in isas:
                    lib = q4_kernel.load(isa)
                    for fmt in FORMATS:
                        calls[isa, fmt] = (product_calls(lib, layer0, fmt, n, threads),
                                           product_calls(lib, [head], fmt, n, threads))
                layer_t = {k: [] for k in calls}
                step_t = {k: [] for k in calls}
                head_t = {k: [] for k in calls}
                phase_t = {k: [] for k in calls}
                hidden = ee.embed(context[-n:])
                for _ in range(args.repeats):
                    for key, ((layer_calls, _), (head_calls, _)) in calls.items():
                        layer_t[key].append(timed(layer_calls))
                        lean.native = natives[key]
                        natives[key].lib.hispec_q4_profile(clock_mode, 1, None)  # the kernel's phase clock, zeroed
                        t = NOW()
                        ee.run_layers(hidden, 0, ee.num_layers, cache)
                        phase_t[key].append(phase_ms(natives[key].lib))
                        head_t[key].append(timed(head_calls))
                        step_t[key].append((NOW() - t) * 1e3)
                        for layer in range(ee.num_layers):
                            cache.crop(layer, len(context))
                per[n] = {f"{isa}/{fmt}": {"layer_products_ms": round(statistics.median(layer_t[isa, fmt]), 4),
                                           "layer_products_ms_min": round(min(layer_t[isa, fmt]), 4),
                                           "step_ms": round(statistics.median(step_t[isa, fmt]), 4),
                                           "step_ms_min": round(min(step_t[isa, fmt]), 4),
                                           "head_ms": round(statistics.median(head_t[isa, fmt]), 4),
                                           "layer_phases_ms": {ph: round(statistics.median(x[ph] for x in phase_t[isa, fmt]), 4)
                                                               for ph in q4_layer.PHASES}}
                          for isa, fmt in calls}
                print(threads, n, json.dumps(per[n]), file=sys.stderr)
            for n in args.widths:
                for key, row in per[n].items():
                    one = per[args.widths[0]][key]
                    row["layer_products_over_1"] = round(row["layer_products_ms"] / one["layer_products_ms"], 3)
                    row["step_over_1"] = round(row["step_ms"] / one["step_ms"], 3)
                    row["step_min_over_1"] = round(row["step_ms_min"] / one["step_ms_min"], 3)  # the quietest calls
            results[str(threads)] = {str(n): per[n] for n in args.widths}
        lean.native = saved
    if args.decode_tokens:
        report["decode"] = {str(t): decode_vs_step(lm, t, context, args.decode_tokens, max(3, args.repeats // 3))
                            for t in args.threads}
        print(json.dumps(report["decode"]), file=sys.stderr)
    host.finish(report["host"])
    reads = [report["host"].get(k, {}).get("read_gbs") for k in ("bandwidth_start", "bandwidth_end")]
    read = max(r for r in reads if r)
    bound = report["weight_bytes"]["step"] / (read * 1e9) * 1e3
    report["roofline"] = {"read_gbs": read, "step_bound_ms": round(bound, 3)}
    for threads, per in results.items():
        for n, rows in per.items():
            for row in rows.values():
                row["step_over_roofline"] = round(row["step_ms"] / bound, 3)
    report["threads"] = results
    print(json.dumps({"roofline": report["roofline"], "threads": results}, indent=1))
    record.write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
