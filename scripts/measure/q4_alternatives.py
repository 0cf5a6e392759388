"""The 4-bit kernel's alternatives, measured on this host: speed per product and batch invariance.

For the default model's two projection shapes (576 -> 1536 and 1536 -> 576), a product of x
([M, K], M = 1, 2, 4, 8, 16 rows) with a weight, through:

- `hispec_q4_1`: this project's kernel on the GGUF's own Q4_1 blocks (hispec/model/formats/q4_kernel.py);
- `torch_int4pack`: PyTorch's int4 weight-only CPU kernel (aten._weight_int4pack_mm_for_cpu, groups
  of 32 with a scale and a zero point each: the file's blocks carried over, not bit for bit);
- `torch_int8pack`: PyTorch's int8 weight-only kernel (aten._weight_int8pack_mm, one scale per
  output row: a re-quantisation of the file, not its weights);
- `fp32_dense`: the dequantised float32 weight (x @ W.T), what the float32 path reads.

Per candidate and M: the median time of a call, and whether row 0's bits are the same alone as among
M rows (batch invariance: what speculative decoding needs to equal plain decoding token for token).
A candidate this torch build cannot run is listed with its error.

    python scripts/measure/q4_alternatives.py --json assets/bench/q4_alternatives_cpu.json
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

from hispec.evaluation import host  # noqa: E402
from hispec.model.formats.q4 import quantize_q4_1  # noqa: E402

ROWS = (1, 2, 4, 8, 16)
SHAPES = ((1536, 576), (576, 1536))  # (out, in): gate/up, down


def _time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def candidates(w: torch.Tensor) -> dict:
    """name -> a function x -> y, or the error that stopped it."""
    q = quantize_q4_1(w)
    dense = q.dequantize()
    out: dict = {"hispec_q4_1": q.matmul, "fp32_dense": lambda x: x @ dense.T}
    try:  # int4 groups of 32: q in 0..15 with w = d * q + m  ->  (q - 8) * d + (m + 8 d)
        n, k = dense.shape
        blocks = dense.reshape(n, k // 32, 32)
        lo, hi = blocks.amin(-1), blocks.amax(-1)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        qi = ((blocks - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.int32).reshape(n, k)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(qi, 1)
        zeros = lo + 8 * scale
        sz = torch.stack([scale.T, zeros.T], dim=-1).contiguous()  # [k / 32, n, 2]
        out["torch_int4pack"] = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, 32, sz)
        out["torch_int4pack"](torch.randn(1, k))
    except Exception as e:  # noqa: BLE001 - record what this build refuses
        out["torch_int4pack"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    try:
        scales = (dense.abs().amax(1) / 127).clamp(min=1e-12)
        q8 = (dense / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
        out["torch_int8pack"] = lambda x: torch.ops.aten._weight_int8pack_mm(x, q8, scales)
        out["torch_int8pack"](torch.randn(1, dense.shape[1]))
    except Exception as e:  # noqa: BLE001
        out["torch_int8pack"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
    return out


def measure(repeats: int) -> dict:
    g = torch.Generator().manual_seed(0)
    results = {}
    for n, k in SHAPES:
        w = torch.randn(n, k, generator=g) * 0.05
        xs = torch.randn(max(ROWS), k, generator=g)
        shape = f"{k}->{n}"
        for name, fn in candidates(w).items():
            if isinstance(fn, str):
                results.setdefault(name, {})[shape] = {"error": fn}
                continue
            alone = fn(xs[:1].contiguous())[0]
            per = {}
            for m in ROWS:
                x = xs[:m].contiguous()
                per[str(m)] = {"ms": round(_time(lambda: fn(x), repeats), 4),
                               "row_0_same_bits": bool(torch.equal(fn(x)[0], alone))}
            results.setdefault(name, {})[shape] = per
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    report = {"command": "python scripts/measure/q4_alternatives.py " + " ".join(sys.argv[1:]),
              "host": host.describe(measure_bandwidth=False), "torch": torch.__version__, "threads": args.threads,
              "results": measure(args.repeats)}
    for name, shapes in report["results"].items():
        for shape, per in shapes.items():
            if "error" in per:
                print(f"{name:16} {shape:10} cannot run here: {per['error']}")
            else:
                cells = "  ".join(f"M={m} {v['ms']:.3f} ms{'' if v['row_0_same_bits'] else ' (row 0 differs)'}"
                                  for m, v in per.items())
                print(f"{name:16} {shape:10} {cells}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
