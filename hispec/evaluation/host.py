"""The machine a benchmark ran on, and the memory bound of a decode step on it.

Machines of this project's kind differ (with or without AVX-512, shared cores), so every absolute
figure carries its host: CPU model, whether it has AVX-512, which kernels torch and the 4-bit kernel
use, threads, and the memory bandwidth measured in the same process (a copy and a sum of 256 MiB
with torch, on the threads the models use). A plain decode step has to read every weight once, so
weight bytes / read bandwidth is the floor of its time: ``memory_bound`` sets the benchmark's
plain-decoding steps against it.
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from hispec.evaluation.method import BenchMethod

BANDWIDTH_BYTES = 256 * 2**20


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f.startswith(("avx", "fma", "f16c", "amx")))
    except OSError:
        pass
    return []


def bandwidth(repeats: int = 7) -> dict:
    """GB/s of a 256 MiB copy (read + write counted) and a 256 MiB sum (read), medians and bests."""
    src = torch.ones(BANDWIDTH_BYTES // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)  # touch every page once
    copy, read = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        copy.append(time.perf_counter() - t)
        t = time.perf_counter()
        src.sum()
        read.append(time.perf_counter() - t)
    gbs = lambda n, ts: (round(n / statistics.median(ts) / 1e9, 2), round(n / min(ts) / 1e9, 2))  # noqa: E731
    (copy_med, copy_best), (read_med, read_best) = gbs(2 * BANDWIDTH_BYTES, copy), gbs(BANDWIDTH_BYTES, read)
    return {"copy_gbs": copy_med, "copy_gbs_best": copy_best, "read_gbs": read_med, "read_gbs_best": read_best,
            "bytes": BANDWIDTH_BYTES, "threads": torch.get_num_threads()}


MATVEC_SHAPE = (49152, 576)  # the default model's LM head: a float32 matrix-vector product of a step's kind


def matvec(repeats: int = 7, shape: tuple[int, int] = MATVEC_SHAPE) -> dict:
    """GB/s of float32 weights streamed through a matrix-vector product (torch.mv, this process's threads):
    what bounds the float32 step when the product, not the read, is the slower of the two. On a host of this
    project's kind a 2-thread read streamed about 50 GB/s where a float32 product of the model's size reached
    16.5 (issue 51): the read bandwidth alone overstates how fast the float32 step can be."""
    w = torch.randn(*shape)
    x = torch.randn(shape[1])
    torch.mv(w, x)  # warm
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(8):
            torch.mv(w, x)
        ts.append((time.perf_counter() - t) / 8)
    nbytes = w.numel() * 4
    return {"gbs": round(nbytes / statistics.median(ts) / 1e9, 2), "gbs_best": round(nbytes / min(ts) / 1e9, 2),
            "shape": list(shape), "threads": torch.get_num_threads()}


def describe(measure_bandwidth: bool = True) -> dict:
    from hispec.model.formats import q4_kernel

    flags = cpu_flags()
    info = {"cpu": cpu_model(), "avx512": "avx512f" in flags, "flags": flags, "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "aten_cpu_capability_env": os.environ.get("ATEN_CPU_CAPABILITY"),
            "onednn_max_cpu_isa_env": os.environ.get("ONEDNN_MAX_CPU_ISA"), "q4_kernel_isa": q4_kernel.host_isa(),
            "loadavg_start": loadavg()}
    if measure_bandwidth:
        info["bandwidth_start"] = bandwidth()
        info["matvec_fp32_start"] = matvec()
    return info


def loadavg() -> list[float] | None:
    """The 1, 5 and 15-minute load averages (a shared machine: how busy it was)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def finish(host: dict, measure_bandwidth: bool = True) -> dict:
    """The end of a run: bandwidth and load again (a shared machine changes during a run)."""
    host["loadavg_end"] = loadavg()
    if measure_bandwidth:
        host["bandwidth_end"] = bandwidth()
        host["matvec_fp32_end"] = matvec()
    return host


def memory_bound(report: dict, weight_bytes: dict[str, int], float_bytes: dict[str, int] | None = None) -> dict:
    """Per weights format: bytes a plain step reads, the floor that sets at the run's read bandwidth
    (the higher of its start and end medians: what the machine can do, so the stricter floor), the
    measured plain step (1 / autoregressive tokens/s over the run, the prefill included) and their ratio.
    `float_bytes`: for a float32 model whose step reads fewer bytes than its float weights (on its file's
    blocks), the float weights' bytes, whose floor is recorded beside (``float_bound_ms``)."""
    host = report.get("host") or {}
    reads = [host.get(k, {}).get("read_gbs") for k in ("bandwidth_start", "bandwidth_end")]
    reads = [r for r in reads if r]
    if not reads:
        return {}
    read = max(reads)
    products = [host.get(k, {}).get("gbs") for k in ("matvec_fp32_start", "matvec_fp32_end")]
    products = [g for g in products if g]
    per = (report.get("summary") or {}).get("all", {}).get("methods", {})
    out = {}
    for fmt, nbytes in weight_bytes.items():
        bound_ms = nbytes / (read * 1e9) * 1e3
        entry = {"weight_bytes": nbytes, "read_gbs": read, "bound_ms": round(bound_ms, 3)}
        dense = (float_bytes or {}).get(fmt, nbytes)
        if dense != nbytes:
            entry.update(float_bytes=dense, float_bound_ms=round(dense / (read * 1e9) * 1e3, 3))
        if fmt.startswith("fp32") and products:  # the float32 weights through float32 products: the other floor
            entry.update(matvec_gbs=max(products), matvec_bound_ms=round(dense / (max(products) * 1e9) * 1e3, 3))
        ar = per.get(BenchMethod.plain(fmt).key) or (per.get(BenchMethod.plain().key) if len(weight_bytes) == 1
                                                     else None)
        if ar and ar.get("tokens_per_s"):
            step = 1e3 / ar["tokens_per_s"]
            entry.update(step_ms=round(step, 3), step_over_bound=round(step / bound_ms, 3))
            if "float_bound_ms" in entry:
                entry["step_over_float_bound"] = round(step / entry["float_bound_ms"], 3)
            if "matvec_bound_ms" in entry:
                entry["step_over_matvec_bound"] = round(step / entry["matvec_bound_ms"], 3)
        out[fmt] = entry
    return out


@contextlib.contextmanager
def busy_cores(processes: int):
    """`processes` other processes, each keeping one core busy (a busy loop), for the block's length:
    a loaded machine, as a Space shares its vCPUs. Yields what the report records of them ({}: none)."""
    if processes <= 0:
        yield {}
        return
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield {"processes": processes, "what": "another process per count, each a Python busy loop on one core"}
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
