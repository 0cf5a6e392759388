"""Where a decode step's time goes, both weight formats, the 1-token and the k-token step, side by side in one process.

A full step (embedding, layers [0, L), final norm and LM head) after a 128-token context, rolled back
after every call. Each route is timed three ways, interleaved round by round so that noise from other
processes hits every route alike:

- ``step``: the engine's own call (``ee.run_layers`` + ``ee.exit_logits``), untouched;
- ``split``: the same arithmetic re-run op by op (the lean kernel's order, ``kernel.decoder_layer``),
  each op timed with perf_counter into one of: products (the projections, each through its kernel
  call and wrapper), attention (SDPA), norms/rotary/activations (RMSNorm, rotary, SiLU * up, residual
  adds), cache writes (``LayerKVCache.update``), head (final norm + LM head); what the step's median
  has beyond the timed ops is Python/dispatch (views, transposes, splits, loop glue, the timers' own
  cost is subtracted);
- ``kernel_only`` (4-bit): the products' C kernel called straight from ctypes with the same shapes, so
  that "products" splits into the kernel's arithmetic and its Python wrapper.

With the native layer (``HISPEC_Q4_NATIVE``, hispec/model/formats/q4_layer.py) the 4-bit route is also timed
through one native call per step, and its own phase clock (products, attention, norms/rotary/act, cache
writes, measured inside the C++ by thread 0 at each phase's barrier) is recorded.

    python scripts/measure/q4_profile.py --json assets/bench/q4_profile_avx512.json
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python scripts/measure/q4_profile.py --json assets/bench/q4_profile_avx2.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hispec.evaluation import host  # noqa: E402
from hispec.evaluation import record  # noqa: E402
from hispec.evaluation.record import code_version  # noqa: E402
from hispec.model import kernel as K  # noqa: E402
from hispec.model.loading import load_model  # noqa: E402

CATEGORIES = ("products", "attention", "norms_rotary_act", "cache_writes", "head")


NOW = time.perf_counter  # --clock cpu: time.thread_time (one thread's CPU time)


class Clock:
    def __init__(self):
        self.t = {c: 0.0 for c in CATEGORIES}
        self.calls = 0

    def __call__(self, cat, fn, *args):
        t = NOW()
        out = fn(*args)
        self.t[cat] += NOW() - t
        self.calls += 1
        return out


def timer_cost() -> float:
    """Seconds one Clock call adds beyond the op it wraps (perf_counter twice, a dict update)."""
    c = Clock()
    f = lambda: None  # noqa: E731
    n = 20000
    t = NOW()
    for _ in range(n):
        c("products", f)
    return (NOW() - t) / n


def split_step(lean, ee, hidden, cache, clock: Clock):
    """The lean path's step, op by op, each op timed (llama layout: no q/k norms)."""
    past, q_len = cache.lengths[0], hidden.shape[1]
    cos, sin = lean.rotary.rows(past, q_len, hidden.device)
    mask, causal = K.causal_mask(past, q_len, hidden.device)
    for idx in range(ee.num_layers):
        w = lean.layers[idx]
        x = clock("norms_rotary_act", K.rms_norm, hidden, w.input_norm)
        qkv = clock("products", w.qkv, x)
        B = 1
        H, KV = w.n_heads, w.n_kv
        qkv = qkv.view(B, q_len, H + 2 * KV, -1)
        qk = clock("norms_rotary_act", K.rotate, qkv[:, :, : H + KV], cos, sin)
        q, k = qk[:, :, :H], qk[:, :, H:]
        keys, values = clock("cache_writes", cache.update, k.transpose(1, 2), qkv[:, :, H + KV:].transpose(1, 2), idx)
        out = clock("attention", lambda: F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, is_causal=causal, scale=w.scaling, enable_gqa=H != KV))
        attn = out.transpose(1, 2).reshape(B, q_len, -1)
        o = clock("products", w.o, attn)
        hidden = clock("norms_rotary_act", torch.add, hidden, o)
        x = clock("norms_rotary_act", K.rms_norm, hidden, w.post_norm)
        gate, up = clock("products", w.gate_up, x).split(w.intermediate, dim=-1)
        a = clock("norms_rotary_act", lambda: w.act(gate) * up)
        d = clock("products", w.down, a)
        hidden = clock("norms_rotary_act", torch.add, hidden, d)
    clock("head", ee.exit_logits, hidden, ee.num_layers)
    return hidden


def kernel_only_ms(lean, q_len: int, repeats: int) -> float:
    """The 4-bit products of one step (all layers and the LM head) through the C kernel only."""
    from hispec.model.formats import q4_kernel

    lib, threads = q4_kernel.lib(), torch.get_num_threads()
    mats = [p.matrix for w in lean.layers for p in (w.qkv, w.o, w.gate_up, w.down)] + [lean.lm_head.matrix]
    xs = {m.shape[1]: torch.randn(q_len, m.shape[1]) for m in mats}
    outs = [torch.empty(q_len, m.shape[0]) for m in mats]
    calls = []
    for m, o in zip(mats, outs):
        N, Kd = m.shape
        x = xs[Kd]
        if m.kind == "Q4_1":
            calls.append((lib.hispec_q41_matmul, (x.data_ptr(), q_len, Kd, m.qs.data_ptr(), m.d.data_ptr(),
                                                  m.m.data_ptr(), N, o.data_ptr(), N, threads)))
        else:
            calls.append((lib.hispec_q80_matmul, (x.data_ptr(), q_len, Kd, m.qs.data_ptr(), m.d.data_ptr(), N,
                                                  o.data_ptr(), N, threads)))
    times = []
    for _ in range(repeats):
        t = NOW()
        for fn, a in calls:
            fn(*a)
        times.append(NOW() - t)
    return statistics.median(times) * 1e3


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=30, help="timed calls per route and size (interleaved)")
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 4])
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="wall: perf_counter on the threads asked for; cpu: one thread's CPU time (robust to other "
                        "processes on a shared machine; forces 1 thread)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    global NOW
    if args.clock == "cpu":
        NOW = time.thread_time
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    env = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "HISPEC_Q4_ISA", "HISPEC_Q4_NATIVE")
           if k in os.environ}
    prefix = " ".join(f"{k}={v}" for k, v in env.items())
    report = {"command": f"{prefix} python scripts/measure/q4_profile.py {' '.join(sys.argv[1:])}".strip(),
              "code": code_version(), "env": env,
              "host": host.describe(), "loadavg_start": os.getloadavg(), "threads": torch.get_num_threads(),
              "clock": args.clock}
    models = {w: load_model("default", device="cpu", weights=w, exits="none") for w in ("fp32", "q4")}
    text = "Summarise the history of the printing press in Europe, its inventors, and its effects. " * 8
    context = models["fp32"].encode(text)[:128]
    report["context"] = len(context)
    native = None
    try:
        from hispec.model.formats import q4_layer

        native = q4_layer if q4_layer.unavailable_reason() is None else None
    except ImportError:
        pass

    routes = {"fp32": models["fp32"], "q4": models["q4"]}
    state = {}
    with torch.inference_mode():
        for name, lm in routes.items():
            ee = lm.ee
            cache = ee.new_cache(len(context) + 64)
            ee.run_layers(ee.embed(context), 0, ee.num_layers, cache)
            state[name] = (lm, cache)
        tc = timer_cost()
        results = {}
        for n in args.tokens:
            rows = {}
            keys = ["fp32", "q4"] + (["q4_native"] if native else [])
            step = {k: [] for k in keys}
            splits = {k: [] for k in ("fp32", "q4")}
            phases = []
            for _ in range(args.repeats):
                for key in keys:
                    lm, cache = state["q4" if key.startswith("q4") else "fp32"]
                    ee = lm.ee
                    new = context[-n:]
                    if key == "q4_native":
                        native.set_enabled(ee, True)
                        native.profile_reset(2 if args.clock == "cpu" else 1)
                    elif key == "q4" and native:
                        native.set_enabled(ee, False)
                    t = NOW()
                    h = ee.run_layers(ee.embed(new), 0, ee.num_layers, cache)
                    ee.exit_logits(h, ee.num_layers)
                    step[key].append((NOW() - t) * 1e3)
                    if key == "q4_native":
                        phases.append(native.profile_read())
                    for layer in range(ee.num_layers):
                        cache.crop(layer, len(context))
                    if key in splits:
                        clock = Clock()
                        t = NOW()
                        split_step(ee.lean, ee, ee.embed(new), cache, clock)
                        total = (NOW() - t) * 1e3
                        for layer in range(ee.num_layers):
                            cache.crop(layer, len(context))
                        splits[key].append({**{c: v * 1e3 for c, v in clock.t.items()}, "total": total,
                                            "timers": clock.calls * tc * 1e3})
            if native:
                native.set_enabled(state["q4"][0].ee, True)
            for key in keys:
                med = statistics.median(step[key])
                row = {"step_ms_median": round(med, 3), "step_ms_min": round(min(step[key]), 3)}
                if key in splits:
                    parts = {c: statistics.median(s[c] for s in splits[key]) for c in CATEGORIES}
                    timed = sum(parts.values())
                    row["split_ms"] = {c: round(v, 3) for c, v in parts.items()}
                    row["split_ms"]["python_dispatch"] = round(max(0.0, med - timed), 3)
                    row["split_timed_ops_total_ms"] = round(statistics.median(s["total"] for s in splits[key]), 3)
                    row["split_timer_cost_ms"] = round(statistics.median(s["timers"] for s in splits[key]), 3)
                if key == "q4":
                    row["products_kernel_only_ms"] = round(kernel_only_ms(state["q4"][0].ee.lean, n, 15), 3)
                if key == "q4_native" and phases:
                    row["native_phases_ms"] = {c: round(statistics.median(ph[c] for ph in phases), 3) for c in phases[0]}
                rows[key] = row
            rows["q4_over_fp32"] = round(rows["fp32"]["step_ms_median"] / rows["q4"]["step_ms_median"], 3)
            if native:
                rows["native_speedup_over_q4_python"] = round(rows["q4"]["step_ms_median"] / rows["q4_native"]["step_ms_median"], 3)
            results[str(n)] = rows
    report["timer_cost_us"] = round(tc * 1e6, 3)
    report["tokens"] = results
    report["loadavg_end"] = os.getloadavg()
    host.finish(report["host"])
    print(json.dumps(results, indent=1))
    print("load", report["loadavg_start"], report["loadavg_end"], "q4 kernel", report["host"].get("q4_kernel_isa"),
          file=sys.stderr)
    record.write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
