"""The 4-bit CPU kernel (csrc/q4_kernel.cpp): built at first use, loaded with ctypes.

The source is plain C++ with x86 intrinsics and its own thread pool, no torch headers, so a build takes a few
seconds. It is compiled once per instruction set and cached as
``<build dir>/q4_kernel-<isa>-<hash>.so`` (the hash covers the source, the flags and the compiler),
written to a temporary name and renamed into place, so concurrent first uses never load half a file.
The build dir is ``$HISPEC_BUILD_DIR``, else ``.build/`` in the repository (git-ignored), else
``<HiSpec cache>/build``. Compiled files are never committed.

Two builds of one source:

- ``avx512`` (``-mavx512f -mavx512bw -mavx512vl``), chosen on hosts with AVX-512;
- ``avx2`` (``-mavx2 -mfma -mf16c``), chosen on the others, and wherever torch's own kernels are held
  to AVX2 (``ATEN_CPU_CAPABILITY=avx2``), so that one environment variable emulates a host without
  AVX-512 for every kernel at once. ``HISPEC_Q4_ISA=avx2|avx512`` overrides the choice.

The two give different last bits (different lane sums); each is batch-invariant on its own (see the
source's header). Its threads are its own (a pool started at first use, csrc/q4_kernel.cpp says why not
OpenMP): torch's OpenMP teams, one per Python thread that ran a torch operation, no longer slow its barriers.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from hispec.errors import ModelLoadError

SOURCE = Path(__file__).resolve().parent / "csrc" / "q4_kernel.cpp"
REPO_BUILD = Path(__file__).resolve().parents[3] / ".build"
ISA_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
}
# VNNI (dpbusd) for the int8-activation products where the AVX-512 host has it; without it the same
# integers come from maddubs + madd, so the flag changes speed, never a bit.
VNNI_FLAG = "-mavx512vnni"
COMMON_FLAGS = ["-O3", "-std=c++17", "-shared", "-fPIC", "-pthread", "-ffp-contract=off", "-fno-math-errno"]

NO_COMPILER = ("the 4-bit kernel is compiled at first use and needs a C++ compiler (g++), which this host lacks: "
               "install g++ (apt-get install g++)")
NO_ISA = "the 4-bit kernel needs an x86-64 CPU with AVX2, FMA and F16C (or AVX-512 for its AVX-512 build)"

_lock = threading.Lock()
_libs: dict[str, ctypes.CDLL] = {}
_failures: dict[str, str] = {}


class KernelUnavailable(ModelLoadError):
    """The 4-bit kernel cannot run here (no x86 AVX2, no C++ compiler, a failed build)."""


@functools.lru_cache(maxsize=1)
def _cpu_flags() -> frozenset[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_isa() -> str | None:
    """The build this process uses: 'avx512', 'avx2', or None where neither can run."""
    forced = os.environ.get("HISPEC_Q4_ISA", "").strip().lower()
    flags = _cpu_flags()
    has_avx2 = {"avx2", "fma", "f16c"} <= flags
    has_avx512 = has_avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    if forced in ISA_FLAGS:
        return forced if (forced == "avx2" and has_avx2) or (forced == "avx512" and has_avx512) else None
    if os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower() in ("avx2", "default"):
        return "avx2" if has_avx2 else None
    return "avx512" if has_avx512 else "avx2" if has_avx2 else None


def isa_flags(isa: str) -> list[str]:
    flags = list(ISA_FLAGS[isa])
    if isa == "avx512" and "avx512_vnni" in _cpu_flags():
        flags.append(VNNI_FLAG)
    return flags


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")


def build_dir() -> Path:
    if os.environ.get("HISPEC_BUILD_DIR"):
        return Path(os.environ["HISPEC_BUILD_DIR"])
    if os.access(REPO_BUILD.parent, os.W_OK) and (REPO_BUILD.parent / "hispec").is_dir():
        return REPO_BUILD
    from hispec.paths import cache_root

    return cache_root() / "build"


def _compiler_version(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def library_path(isa: str, cxx: str, source: Path = SOURCE) -> Path:
    digest = hashlib.sha1()
    for part in (source.read_bytes(), " ".join(flags_for(source) + isa_flags(isa)).encode(),
                 _compiler_version(cxx).encode()):
        digest.update(part)
    return build_dir() / f"q4_kernel-{isa}-{digest.hexdigest()[:12]}.so"


def flags_for(source: Path) -> list[str]:
    """The common flags, and OpenMP's for a past version of the source that used it (its pool came later)."""
    return COMMON_FLAGS + (["-fopenmp"] if b"#pragma omp" in source.read_bytes() else [])


def build(isa: str, source: Path = SOURCE) -> Path:
    """Compile the kernel for `isa` unless the cached build is there; return its path. `source`: another
    version of csrc/q4_kernel.cpp (scripts/measure/q4_ab.py builds the one of a past commit beside today's)."""
    cxx = compiler()
    if cxx is None:
        raise KernelUnavailable(NO_COMPILER + " or use --weights fp32")
    path = library_path(isa, cxx, source)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    cmd = [cxx, *flags_for(source), *isa_flags(isa), str(source), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise KernelUnavailable(f"building the 4-bit kernel failed ({' '.join(cmd)}):\n{proc.stderr[-3000:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def lib() -> ctypes.CDLL:
    """The host's build, chosen and loaded once per process (the products' fast path)."""
    global _host_lib
    if _host_lib is None:
        _host_lib = load()
    return _host_lib


_host_lib: ctypes.CDLL | None = None


def load(isa: str | None = None) -> ctypes.CDLL:
    """The kernel library for `isa` (default: host_isa()), built if needed. Raises KernelUnavailable."""
    isa = isa or host_isa()
    if isa is None:
        raise KernelUnavailable(NO_ISA + "; use --weights fp32 on this host")
    with _lock:
        if isa in _libs:
            return _libs[isa]
        if isa in _failures:
            raise KernelUnavailable(_failures[isa])
        try:
            lib = open_library(build(isa))
        except KernelUnavailable as exc:
            _failures[isa] = str(exc)
            raise
        except OSError as exc:
            _failures[isa] = f"the 4-bit kernel was built but does not load: {exc}"
            raise KernelUnavailable(_failures[isa]) from None
        _libs[isa] = lib
        return lib


def open_library(path: Path) -> ctypes.CDLL:
    """A built kernel library, its functions declared (also for scripts/measure/q4_ab.py's other builds)."""
    lib = ctypes.CDLL(str(path))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.hispec_q41_matmul.argtypes = [p, i64, i64, p, p, p, i64, p, i64, ctypes.c_int]
    lib.hispec_q41_matmul.restype = None
    lib.hispec_q41_matmul_a8.argtypes = [p, i64, i64, p, p, p, i64, p, i64, ctypes.c_int]
    lib.hispec_q41_matmul_a8.restype = None
    lib.hispec_q4_vnni.restype = ctypes.c_int
    lib.hispec_q80_matmul.argtypes = [p, i64, i64, p, p, i64, p, i64, ctypes.c_int]
    lib.hispec_q80_matmul.restype = None
    lib.hispec_q80_rows.argtypes = [p, i64, i64, p, p, p]
    lib.hispec_q80_rows.restype = None
    lib.hispec_q4_isa.restype = ctypes.c_char_p
    if hasattr(lib, "hispec_q41_matmul_w"):  # the wide arithmetic (a build of before it lacks it: q4_ab.py)
        lib.hispec_q41_matmul_w.argtypes = [p, i64, i64, p, p, p, i64, p, i64, ctypes.c_int]
        lib.hispec_q41_matmul_w.restype = None
        lib.hispec_q80_matmul_w.argtypes = [p, i64, i64, p, p, i64, p, i64, ctypes.c_int]
        lib.hispec_q80_matmul_w.restype = None
    # the whole decoder layer (q4_layer.py declares the structures it takes); the last argument, the a8
    # packings, is new: a build of before it ignores it (scripts/measure/q4_ab.py loads such builds)
    lib.hispec_q4_layers.argtypes = [p, i64, p, p, i64, i64, p, p, ctypes.c_int, p]
    lib.hispec_q4_layers.restype = None
    if hasattr(lib, "hispec_q4_layers_rows"):  # the shared pass (a build of before it lacks it: q4_ab.py)
        lib.hispec_q4_layers_rows.argtypes = [p, i64, p, p, i64, p, p, p, p, p, ctypes.c_int, p]
        lib.hispec_q4_layers_rows.restype = None
    lib.hispec_q4_profile.argtypes = [ctypes.c_int, ctypes.c_int, p]
    lib.hispec_q4_profile.restype = None
    if not hasattr(lib, "hispec_q41_pack_a8"):  # a build of before the packed int8 products (q4_ab.py)
        return lib
    lib.hispec_q41_packed_bytes.argtypes = [i64, i64]
    lib.hispec_q41_packed_bytes.restype = i64
    lib.hispec_q41_pack_a8.argtypes = [p, p, p, i64, i64, p]
    lib.hispec_q41_pack_a8.restype = None
    lib.hispec_q41_matmul_a8p.argtypes = [p, i64, i64, p, i64, p, i64, ctypes.c_int]
    lib.hispec_q41_matmul_a8p.restype = None
    lib.hispec_q80_packed_bytes.argtypes = [i64, i64]
    lib.hispec_q80_packed_bytes.restype = i64
    lib.hispec_q80_pack_a8.argtypes = [p, p, i64, i64, p]
    lib.hispec_q80_pack_a8.restype = None
    lib.hispec_q80_matmul_a8p.argtypes = [p, i64, i64, p, i64, p, i64, ctypes.c_int]
    lib.hispec_q80_matmul_a8p.restype = None
    return lib


def cannot_build_reason() -> str | None:
    """Why the kernel surely cannot run here (no AVX2 CPU, no C++ compiler), without building it; None
    when it may (a build can still fail, and says why at first use)."""
    if host_isa() is None:
        return NO_ISA
    if compiler() is None:
        return NO_COMPILER
    return None


def unavailable_reason(isa: str | None = None) -> str | None:
    """None when the kernel loads here; otherwise why not (for skips and error messages)."""
    try:
        load(isa)
    except KernelUnavailable as exc:
        return str(exc)
    return None


def threads() -> int:
    return max(1, torch.get_num_threads())
