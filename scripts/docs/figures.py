"""The generated blocks of figures of README.md and docs/*.md, from the JSON artifacts in assets/.

Each generated table sits in a page (README.md or a page of docs/) between ``<!-- figures: NAME -->`` and ``<!-- /figures -->``
and ends with the command that made its artifact, the commit it ran at and the machine it ran on
(from the artifact's record). ``python scripts/figures.py`` rewrites every block from its artifact;
``--check`` changes nothing and exits 1, naming each block whose text differs from what its artifact
gives, so a figure in a block can never drift from its measurement. Figures quoted in the prose
outside the blocks are checked too (figures_prose.py, figures_quotes.py): a stale or unchecked one
makes both modes exit 1 (the blocks are still rewritten; the prose needs a person).

This is tooling of the repository, not of the package: it edits README.md and docs/. One function per table
(figures_tables.py); ``BLOCKS`` maps a block's name to its function and artifacts.

    python scripts/figures.py [--check] [--readme PATH] [--docs DIR]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import figures_prose  # noqa: E402
from a8_goals import a8_goals_table, widths_table  # noqa: E402
from hispec.paths import ASSETS  # noqa: E402
from figures_tables import (FP32_COMMAND, f32_widths_table, visitors_table, headline_table, LEVELS_COMMAND, agreement_table, bench_table, bf16_table,  # noqa: E402
                           a8_agreement_table, ee_gpu_table, gpu_profile_table, gpu_table, precision_breakeven_table, layerskip_table, levels_table, load_table, loaded_table, precision_agreement_table,
                           precision_table, priors_table, profile_table, q4_ab_table, q4_alternatives_table, q4_profile_table, q4_table,
                           sweep_table, time_split_table)

COMMAND = "python scripts/figures.py"
ROOT = ASSETS.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
BLOCK = figures_prose.BLOCK  # <!-- figures: NAME --> ... <!-- /figures -->


@dataclass(frozen=True)
class Block:
    artifacts: tuple[str, ...]  # paths from the repository root; the first one's command and machine are cited
    table: Callable[..., str]  # the loaded artifacts -> the table (Markdown)
    command: str = ""  # the command that made the first artifact, when the artifact does not record it


def machine(artifact: dict) -> str:
    """The machine in words, from what the artifact recorded (and saying what it did not)."""
    env = artifact.get("environment") or artifact.get("env") or {}
    host = artifact.get("host") or {}
    if not (env or host or artifact.get("machine") or artifact.get("threads")):
        return "a machine it does not record"
    if env.get("gpu"):
        parts = [f"one {env['gpu']} ({env.get('device', 'cuda')})"]
    elif artifact.get("machine") and not env:  # a load test's one-line description
        parts = [artifact["machine"]]
    else:
        cpu = host.get("cpu") or env.get("cpu")
        avx = host.get("avx512", env.get("avx512"))
        cpus = env.get("cpus") or host.get("cpus")
        cpu_text = (cpu or "CPU model not recorded") + (
            "" if avx is None else ", AVX-512" if avx else ", no AVX-512") + (
            f", {cpus} cores" if cpus else "")
        parts = [cpu_text]
        threads = env.get("threads") or host.get("threads") or artifact.get("threads")
        if threads:
            parts.append(f"{threads} torch threads")
    for lib in ("torch", "transformers"):
        if env.get(lib):
            parts.append(f"{lib} {env[lib]}")
    load = env.get("loadavg_start") or host.get("loadavg_start")
    end = env.get("loadavg_end") or host.get("loadavg_end")
    if load and end:
        parts.append(f"load average {load[0]:.1f} at the start, {end[0]:.1f} at the end")
    return ", ".join(parts)


def code(artifact: dict) -> str:
    """The code a run ran, from what the artifact recorded (hispec.evaluation.record.code_version)."""
    recorded = artifact.get("code") or {}
    commit = recorded.get("commit")
    if not commit:
        return "commit not recorded"
    if commit == "unknown":
        return "commit unknown"
    return f"commit {commit[:12]}" + (" with uncommitted changes" if recorded.get("dirty") else "")


# Scripts that moved into scripts/'s rooms after their artifacts were made: a recorded command is cited
# with today's path, so that it can be run as written (scripts/README.md lists every room).
MOVED = {f"scripts/{name}": f"scripts/{room}/{name}" for room, names in {
    "gpu": ("gpu_check.py", "gpu_profile.py", "gpu_train_ee.py", "gguf_pack.py", "record_acceptance.py"),
    "measure": ("load_test.py", "measure_priors.py", "q4_ab.py", "q4_alternatives.py", "q4_profile.py", "q4_steps.py",
                "time_split.py", "repeat_under_load.py", "compare_outputs.py"),
}.items() for name in names}
MOVED_SCRIPT = re.compile(r"scripts/[\w.]+\.py\b")


def today_path(command: str) -> str:
    """A recorded command with each moved script at its path of today."""
    return MOVED_SCRIPT.sub(lambda m: MOVED.get(m.group(0), m.group(0)), command)


def provenance(block: Block, artifacts: list[dict]) -> str:
    first = artifacts[0]
    command = today_path(first.get("command") or block.command)
    files = ", ".join(f"`{a}`" for a in block.artifacts)
    return f"Generated by `{COMMAND}` from {files}; made by `{command}` ({code(first)}) on {machine(first)}."


BLOCKS: dict[str, Block] = {
    # the README's one table: one run on heldout-fresh holds the default, the 4-bit models and llama.cpp
    "headline": Block(("assets/bench/headline_cpu_fresh2.json",), headline_table),
    "f32-widths": Block(("assets/bench/f32_widths_cpu.json",), f32_widths_table),
    "visitors": Block(("assets/bench/visitors_cpu.json",), visitors_table),
    "f32-exact": Block(("assets/bench/f32_blocks_exact_cpu.json",), bench_table),
    "f32-exact-avx512": Block(("assets/bench/f32_blocks_exact_avx512.json",), bench_table),
    "f32-default-tune": Block(("assets/bench/f32_default_tune_cpu.json",), bench_table),
    "f32-default-tune-avx512": Block(("assets/bench/f32_default_tune_avx512.json",), bench_table),
    "f32-default-tune-avx512-catchup": Block(("assets/bench/f32_default_tune_avx512_catchup.json",), bench_table),
    "exact-avx512-report": Block(("assets/bench/exact_avx512_report.json",), headline_table),
    "levels-report": Block(("assets/bench/levels_cpu_report.json",), levels_table),
    "levels": Block(("assets/bench/levels_cpu_default.json",), levels_table, LEVELS_COMMAND),
    "bench-heldout": Block(("assets/bench/bench_cpu_default.json",), bench_table, FP32_COMMAND),
    "sweep-layers": Block(("assets/bench/sweep_cpu_tune_layers.json",), sweep_table),
    "sweep-lengths": Block(("assets/bench/sweep_cpu_tune_lengths.json",), sweep_table),
    "layerskip-exits": Block(("assets/bench/layerskip_cpu_tune_len1.json", "assets/bench/layerskip_cpu_tune_len2.json"),
                             layerskip_table),
    "profile": Block(("assets/profile/profile_cpu_default.json",), profile_table,
                     "python -m hispec profile --json > assets/profile/profile_cpu_default.json"),
    "time-split": Block(("assets/profile/time_split_cpu_default.json",), time_split_table,
                        "python scripts/measure/time_split.py --prompts 8 --max-new-tokens 128"),
    "exit-agreement": Block(("assets/exits/smollm2-135m-instruct/manifest.json",), agreement_table,
                            "python -m hispec train-exits --layers 2,4,6,12 --head attention --prompts "
                            "sharegpt:400,mtbench:80,humaneval:80 --max-new-tokens 128 --vocab 4096 --extra-prompts 6000 "
                            "--forced-text 800 --gen-batch 64 --steps 2500 --batch-size 1536 --lr 4e-3 --attention-lr 1e-3 "
                            "--threads 2 --out assets/exits/smollm2-135m-instruct"),
    "bf16": Block(("assets/bench/bench_cpu_bf16.json", "assets/bench/bench_cpu_default.json"), bf16_table,
                  "python -m hispec bench --dtype bfloat16 --prompts heldout --methods autoregressive,layerskip,hispec "
                  "--max-new-tokens 128"),
    "priors": Block(("assets/policy/priors_cpu_tune.json", "assets/exits/smollm2-135m-instruct/manifest.json"),
                    priors_table),
    "q4": Block(("assets/bench/q4_cpu_default.json",), q4_table),
    "a8-goals": Block(("assets/bench/a8_goals_cpu.json", "assets/bench/a8_goals_cpu_avx2.json",
                       "assets/bench/q4_widths_cpu.json", "assets/bench/q4_widths_cpu_avx2.json"), a8_goals_table),
    "precision": Block(("assets/bench/precision_cpu_report.json",), precision_table),
    "precision-agreement": Block(("assets/policy/priors_q4_cpu_report.json", "assets/policy/priors_q4_cpu_tune.json"),
                                 precision_agreement_table),
    "precision-a8": Block(("assets/bench/a8_cpu_report.json",), precision_table),
    "precision-default": Block(("assets/bench/precision_default_cpu_report.json",), precision_table),
    "precision-a8-agreement": Block(("assets/policy/priors_a8_cpu_report.json", "assets/policy/priors_a8_cpu_tune.json",
                                     "assets/policy/priors_a8_q4_cpu_report.json"), a8_agreement_table),
    "precision-breakeven": Block(("assets/bench/q4_steps_a8_avx512.json", "assets/policy/priors_a8_q4_cpu_report.json",
                                  "assets/policy/priors_a8_cpu_report.json", "assets/policy/priors_q4_cpu_report.json"),
                                 precision_breakeven_table),
    "q4-alternatives": Block(("assets/bench/q4_alternatives_cpu.json",), q4_alternatives_table),
    "pool-a8": Block(("assets/bench/q4_ab_pool_a8.json",), q4_ab_table),
    "pool-q4": Block(("assets/bench/q4_ab_pool_q4.json",), q4_ab_table),
    "q4-prefetch": Block(("assets/bench/q4_ab_prefetch_avx512.json", "assets/bench/q4_ab_prefetch_avx2.json"), q4_ab_table),
    "a8-widths": Block(("assets/bench/q4_widths_cpu.json", "assets/bench/q4_widths_cpu_avx2.json"), widths_table),
    "wide-fma": Block(("assets/bench/q4_ab_wide_fma_avx512.json",), q4_ab_table),
    "a8-stream": Block(("assets/bench/q4_ab_a8_stream_avx512.json", "assets/bench/q4_ab_a8_stream_avx2.json"), q4_ab_table),
    "q4-profile": Block(("assets/bench/q4_profile_avx512.json", "assets/bench/q4_profile_avx2.json"), q4_profile_table),
    "gpu": Block(("assets/gpu/gpu_check_h200.json",), gpu_table, "python scripts/gpu/gpu_check.py"),
    "gpu-graphs": Block(("assets/gpu/gpu_profile_graphs_h200.json", "assets/gpu/gpu_check_h200_exactness.json"),
                        gpu_profile_table),
    "ee-gpu": Block(("assets/gpu/ee_train_h200.json", "assets/exits/smollm2-135m-instruct/manifest.json"), ee_gpu_table),
    "load": Block(("assets/load/load_cpu_default.json",), load_table),
    "loaded": Block(("assets/bench/loaded_cpu_report.json",), loaded_table),
}


# ---- the README ----------------------------------------------------------------------------------

def render(name: str, root: Path = ROOT) -> str:
    """A block's text (between its markers) from its artifacts."""
    block = BLOCKS[name]
    artifacts = [json.loads((root / path).read_text(encoding="utf-8")) for path in block.artifacts]
    return f"\n{block.table(*artifacts)}\n\n{provenance(block, artifacts)}\n\n"


def regenerate(text: str, root: Path = ROOT) -> tuple[str, list[str]]:
    """The README with every block regenerated, and the names of the blocks that changed."""
    changed = []

    def one(match: re.Match) -> str:
        name = match["name"]
        if name not in BLOCKS:
            raise KeyError(name)
        body = render(name, root)
        if body != match["body"]:
            changed.append(name)
        return f"<!-- figures: {name} -->\n{body}<!-- /figures -->"

    return BLOCK.sub(one, text), changed


def blocks_in(text: str) -> list[str]:
    return [m["name"] for m in BLOCK.finditer(text)]


def pages(readme: Path | None = None, docs: Path | None = None) -> dict[Path, str]:
    """Every page the check reads: README.md and each Markdown page of docs/ (paths may be replaced,
    for a copy being checked)."""
    readme = readme or README
    docs = docs or DOCS
    found = [readme, *sorted(docs.glob("*.md"))] if docs.is_dir() else [readme]
    return {path: path.read_text(encoding="utf-8") for path in found}


def main(argv: list[str] | None = None) -> int:
    """python scripts/figures.py [--check] [--readme PATH] [--docs DIR]."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1, naming each block that differs")
    parser.add_argument("--readme", default=None, help="the README to read (default: the repository's README.md)")
    parser.add_argument("--docs", default=None, help="the folder of pages to read (default: the repository's docs/)")
    args = parser.parse_args(argv)
    texts = pages(Path(args.readme) if args.readme else None, Path(args.docs) if args.docs else None)
    failed, regenerated, count, new_texts = False, {}, 0, {}
    for path, text in texts.items():
        unknown = [n for n in blocks_in(text) if n not in BLOCKS]
        if unknown:
            print(f"figures: {path.name} has blocks no generator makes: {', '.join(unknown)}", file=sys.stderr)
            return 1
        missing = [p for n in blocks_in(text) for p in BLOCKS[n].artifacts if not (ROOT / p).is_file()]
        if missing:
            print(f"figures: {path.name}: missing artifacts: {', '.join(missing)}", file=sys.stderr)
            return 1
        new, changed = regenerate(text)
        new_texts[path], count = new, count + len(blocks_in(text))
        if changed:
            regenerated[path] = changed
    first = next(iter(texts))  # the README; the rest are the pages of the docs folder
    names = {path: path.name if path == first else f"docs/{path.name}" for path in texts}
    prose = figures_prose.problems({names[p]: t for p, t in new_texts.items()})  # a person has to fix these
    for problem in prose:
        print(f"figures: prose: {problem}", file=sys.stderr)
    if args.check:
        for path, changed in regenerated.items():
            failed = True
            print(f"figures: {names[path]} differs from its artifacts in: {', '.join(changed)} "
                  f"(run '{COMMAND}' to regenerate)", file=sys.stderr)
        if failed or prose:
            return 1
        print(f"figures: {count} blocks in {len(texts)} pages match their artifacts; every figure in the prose "
              "is checked")
        return 0
    for path in regenerated:
        path.write_text(new_texts[path], encoding="utf-8")
    done = ", ".join(f"{', '.join(c)} ({names[p]})" for p, c in regenerated.items())
    print(f"figures: {count} blocks in {len(texts)} pages, regenerated: {done or 'none'}")
    return 1 if prose else 0


if __name__ == "__main__":
    sys.exit(main())
