"""llama.cpp's own binary as a control for every comparison made through llama-cpp-python (issue 57).

Builds `llama-bench` and `llama-quantize` from the llama.cpp tree vendored in the sdist of the pinned
llama-cpp-python (requirements-llamacpp.txt; the sdist comes from the package index, nothing else is
downloaded), once, under .build/llama.cpp/ (git-ignored; about 10 minutes on 2 cores), then measures on
the default model's own GGUF file, with the threads the bench uses:

- tg: decoding N tokens after an empty context (llama-bench `-p 0 -n N`): its decode-only speed;
- pp widths: one pass over k tokens (`-p k -n 0`), for k in --widths, and what a k-token pass costs over
  a one-token pass (`pass_cost_over_one`: pp1 tokens/s x k / ppk tokens/s);
- per prompt length (--prompt-lengths): the prompt's evaluation, as llama.cpp's time to first token.

--q4_0 also requantises the same model to Q4_0 (`llama-quantize --allow-requantize`), llama.cpp's
fastest x86 format (repacked kernels), and measures that file too: **another file**, its text is not
the default model's, and every row says which file it ran. The artifact records llama-bench's own system
information (CPU, AVX-512, AVX-VNNI as its build saw them), the build's commit and this host.

    python scripts/measure/llama_bench.py --json assets/bench/llama_bench_cpu.json [--q4_0] [--threads 2]
    python scripts/measure/llama_bench.py --build-only

`python -m hispec bench ... --llama-bench .build/llama.cpp/build-VERSION/bin/llama-bench` runs the same
measurement inside a bench run (hispec.evaluation.llama_cpp.llama_bench), so one artifact holds both.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

BUILD = ROOT / ".build" / "llama.cpp"
TARGETS = ("llama-bench", "llama-quantize")


def pinned_version() -> str:
    """The llama-cpp-python version requirements-llamacpp.txt pins."""
    text = (ROOT / "requirements-llamacpp.txt").read_text(encoding="utf-8")
    match = re.search(r"^llama-cpp-python==(\S+)", text, re.M)
    if not match:
        raise SystemExit("requirements-llamacpp.txt pins no llama-cpp-python version")
    return match.group(1)


def source_tree(version: str) -> Path:
    """The llama.cpp tree vendored in the pinned sdist, downloaded and unpacked once."""
    tree = BUILD / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if tree.is_dir():
        return tree
    BUILD.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d",
                    str(BUILD), f"llama-cpp-python=={version}"], check=True)
    sdist = next(BUILD.glob(f"llama_cpp_python-{version}.tar.gz"))
    with tarfile.open(sdist) as tar:
        tar.extractall(BUILD, filter="data")
    if not tree.is_dir():
        raise SystemExit(f"the sdist of llama-cpp-python {version} holds no vendor/llama.cpp")
    return tree


def build(version: str) -> Path:
    """The folder holding llama-bench and llama-quantize, built if needed."""
    out = BUILD / f"build-{version}"
    binaries = out / "bin"
    if all((binaries / t).is_file() for t in TARGETS):
        return binaries
    if shutil.which("cmake") is None:
        raise SystemExit("llama-bench needs cmake (apt-get install cmake) and a C++ compiler")
    tree = source_tree(version)
    subprocess.run(["cmake", "-S", str(tree), "-B", str(out), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                    "-DLLAMA_BUILD_EXAMPLES=OFF", "-DBUILD_SHARED_LIBS=OFF"], check=True)
    jobs = str(os.cpu_count() or 2)
    subprocess.run(["cmake", "--build", str(out), "--config", "Release", "-j", jobs, "--target", *TARGETS],
                   check=True)
    return binaries


def quantize(binaries: Path, source: Path, kind: str = "Q4_0") -> Path:
    out = BUILD / f"{source.stem}.{kind}.gguf"
    if not out.is_file():
        subprocess.run([str(binaries / "llama-quantize"), "--allow-requantize", str(source), str(out), kind],
                       check=True, capture_output=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="where to write the artifact")
    parser.add_argument("--threads", type=int, default=None, help="threads (default: torch's, as the bench uses)")
    parser.add_argument("--tokens", type=int, default=128, help="tg: tokens decoded (default 128)")
    parser.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="pp widths (default 1 2 4 8 16)")
    parser.add_argument("--prompt-lengths", type=int, nargs="*", default=[64, 128, 256],
                        help="prompt evaluations timed as time to first token (default 64 128 256)")
    parser.add_argument("--repetitions", type=int, default=5, help="llama-bench -r (default 5)")
    parser.add_argument("--q4_0", action="store_true", help="also requantise to Q4_0 and measure that file")
    parser.add_argument("--build-only", action="store_true", help="build the binaries and stop")
    args = parser.parse_args(argv)
    version = pinned_version()
    binaries = build(version)
    print(f"llama_bench: binaries in {binaries}", file=sys.stderr)
    if args.build_only:
        return 0
    import torch

    from hispec.evaluation.host import describe
    from hispec.evaluation.record import code_version, write
    from hispec.model.loading import default_gguf_path

    from hispec.evaluation.llama_cpp.llama_bench import DEFAULT_FILE, Q4_0_FILE, measure

    threads = args.threads or torch.get_num_threads()
    model = Path(default_gguf_path())
    options = dict(threads=threads, tokens=args.tokens, widths=tuple(args.widths),
                   prompt_lengths=tuple(args.prompt_lengths), repetitions=args.repetitions)
    files = [measure(binaries / "llama-bench", model, DEFAULT_FILE, **options)]
    if args.q4_0:
        files.append(measure(binaries / "llama-bench", quantize(binaries, model), Q4_0_FILE, **options))
    report = {"command": "python scripts/measure/llama_bench.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "code": code_version(), "llama_cpp_python_sdist": version, "threads": threads, "host": describe(),
              "files": files}
    for f in files:
        widths = ", ".join(f"pp{k} {v['tokens_per_s']:.0f} tok/s ({v['pass_cost_over_one']:.2f}x one)"
                           for k, v in f["pp"].items() if v["pass_cost_over_one"])
        print(f"{f['file_name']}: tg{f['tg']['tokens']} {f['tg']['tokens_per_s']:.1f} tok/s; {widths}")
    if args.json:
        write(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
