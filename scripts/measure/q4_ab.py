"""Two builds of the 4-bit kernel, side by side in one process: whole steps of the default model.

The kernel's source at a past commit (--base, default HEAD) and the working tree's are built with the
same flags for this host's instruction set, and the default model's 4-bit step (embedding, the 30
layers on the native route, final norm, LM head) over 1, 4 and 8 new tokens after a 128-token context
is timed with each, the builds taking turns (noise on a shared machine hits both alike). Reported per
token count: each build's median and minimum (ms, wall clock, torch's threads), the ratio of the
medians, and whether the two builds' logits are the same bits (expected where a change touches no
arithmetic, such as prefetching; a change of the sums would show here first).

    python scripts/measure/q4_ab.py --base d41e436 --json assets/bench/q4_ab_prefetch_avx512.json

`--format a8` times the a8 model instead (the same blocks with int8 activations, its LM head too), `--format
fp32` the float32 model on the same blocks (the wide arithmetic, the exact lane's), and
`--tokens` sets the token counts (default 1 4 8). `--in-thread` times the steps in a thread of their own, as the
app runs every generation (a worker thread per job, beside the main thread that loaded the model): where a
build's threads come from OpenMP, each such thread owns a team of its own (a past build's source that used
OpenMP is built with -fopenmp: q4_kernel.flags_for).

    python scripts/measure/q4_ab.py --base 1a80aab --format a8 --in-thread --json assets/bench/q4_ab_pool_a8.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hispec.evaluation import host  # noqa: E402
from hispec.evaluation import record  # noqa: E402
from hispec.evaluation.record import code_version  # noqa: E402
from hispec.model.formats import q4_kernel  # noqa: E402

TOKENS = (1, 4, 8)
SOURCE_IN_GIT = "hispec/model/formats/csrc/q4_kernel.cpp"


def build_at(rev: str, isa: str, workdir: Path) -> Path:
    """The kernel library built from the source at commit `rev` (raises where git has no such file)."""
    proc = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{SOURCE_IN_GIT}"], capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"q4_ab: no kernel source at {rev!r}: {proc.stderr.decode().strip()}")
    source = workdir / f"q4_kernel_{rev.replace('/', '_')}.cpp"
    source.write_bytes(proc.stdout)
    return q4_kernel.build(isa, source=source)


def matrices(ee) -> list:
    """Every 4-bit or 8-bit matrix the model's steps multiply with (each binds its kernel on first use)."""
    found = [m.matrix for m in ee.model.modules() if getattr(m, "matrix", None) is not None]
    if ee.lean is not None:
        found += [p.matrix for w in ee.lean.layers for p in (w.qkv, w.o, w.gate_up, w.down)]
    return found


def use(ee, lib) -> None:
    """Route the model's products, its native layers and an int8 LM head (a8) through `lib`."""
    q4_kernel._host_lib = lib  # what a matrix binds to (QuantizedMatrix._bind)
    for matrix in matrices(ee):
        matrix._calls = {}
    if ee.lean is not None and ee.lean.native is not None:
        ee.lean.native.lib = lib
    if ee.lean is not None and hasattr(ee.lean.lm_head, "lib"):  # the a8 head's packing is the same in both
        ee.lean.lm_head.lib = lib


def one_step(ee, cache, context: list[int], n: int) -> tuple[float, torch.Tensor]:
    t = time.perf_counter()
    hidden = ee.run_layers(ee.embed(context[-n:]), 0, ee.num_layers, cache)
    logits = ee.exit_logits(hidden, ee.num_layers)
    elapsed = (time.perf_counter() - t) * 1e3
    for layer in range(ee.num_layers):
        cache.crop(layer, len(context))
    return elapsed, logits


def compare(ee, libs: dict, context: list[int], rounds: int, per_turn: int = 3, tokens=TOKENS) -> dict:
    """Steps timed with each build in turn; per token count, medians, minima and whether the bits agree."""
    cache = ee.new_cache(len(context) + max(tokens) + 8)
    times = {name: {n: [] for n in tokens} for name in libs}
    last = {name: {} for name in libs}
    with torch.inference_mode():
        ee.run_layers(ee.embed(context), 0, ee.num_layers, cache)
        for _ in range(rounds):
            for name, lib in libs.items():
                use(ee, lib)
                for n in tokens:
                    for _ in range(per_turn):
                        ms, logits = one_step(ee, cache, context, n)
                        times[name][n].append(ms)
                    last[name][n] = logits
    base, new = list(libs)
    out = {}
    for n in tokens:
        row = {name: {"median_ms": round(statistics.median(times[name][n]), 3),
                      "min_ms": round(min(times[name][n]), 3), "steps": len(times[name][n])} for name in libs}
        row["new_over_base_median"] = round(row[new]["median_ms"] / row[base]["median_ms"], 3)
        row["same_bits"] = bool(torch.equal(last[base][n], last[new][n]))
        out[str(n)] = row
    return out


def in_thread(wanted: bool, work):
    """work() here, or in a thread of its own (what the app does with each generation)."""
    if not wanted:
        return work()
    import threading

    out = {}
    thread = threading.Thread(target=lambda: out.setdefault("steps", work()), name="q4-ab-steps")
    thread.start()
    thread.join()
    return out["steps"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="HEAD", help="the commit whose kernel source is the baseline (default HEAD)")
    p.add_argument("--rounds", type=int, default=12, help="turns of each build (each: 3 steps per token count)")
    p.add_argument("--json", default=None, help="write the report here")
    p.add_argument("--format", choices=("q4", "a8", "fp32"), default="q4",
                   help="the 4-bit model (float32 activations), its a8 view (int8 activations), or the float32 "
                        "model on the file's blocks (the wide arithmetic)")
    p.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS), help="new tokens per step")
    p.add_argument("--in-thread", action="store_true",
                   help="time the steps in a thread of their own, as the app runs a generation")
    args = p.parse_args(argv)
    isa = q4_kernel.host_isa()
    if isa is None:
        raise SystemExit("q4_ab: " + (q4_kernel.unavailable_reason() or "no 4-bit kernel on this host"))
    from hispec.model.loading import load_model

    with tempfile.TemporaryDirectory() as tmp:
        libs = {"base": q4_kernel.open_library(build_at(args.base, isa, Path(tmp))),
                "new": q4_kernel.open_library(q4_kernel.build(isa))}
        lm = load_model("default", device="cpu", weights=args.format, exits="none")
        text = "Summarise the history of the printing press in Europe, its inventors, and its effects. " * 8
        context = lm.encode(text)[:128]
        env = " ".join(f"{k}={os.environ[k]}" for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if k in os.environ)
        command = "python scripts/measure/q4_ab.py " + " ".join(argv if argv is not None else sys.argv[1:])
        report = {"command": f"{env} {command}".strip(),
                  "code": code_version(), "base": args.base, "isa": isa, "threads": torch.get_num_threads(),
                  "base_commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", args.base], capture_output=True,
                                                text=True).stdout.strip() or None,
                  "format": args.format, "in_thread": args.in_thread,
                  "native_route": lm.ee.lean is not None and lm.ee.lean.native is not None,
                  "host": host.describe(), "context": len(context),
                  "steps": in_thread(args.in_thread, lambda: compare(lm.ee, libs, context, args.rounds,
                                                                      tokens=tuple(args.tokens)))}
    host.finish(report["host"])
    print(json.dumps({k: v for k, v in report.items() if k != "host"}, indent=1))
    record.write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
