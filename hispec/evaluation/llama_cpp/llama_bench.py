"""llama.cpp's own binary, `llama-bench`, as the control for the peers run through llama-cpp-python.

`measure` runs a built llama-bench (scripts/measure/llama_bench.py builds it from the llama.cpp tree
vendored in the pinned llama-cpp-python sdist) on one GGUF file with the bench's threads: tg (decoding
after an empty context: its decode-only speed), one pass over k tokens for each width (and what it costs
over a one-token pass), and the evaluation of prompts of given lengths (its time to first token). Its
tokens are llama-bench's own synthetic ones, so it has no text to compare: its rows carry speeds only.
"""

from __future__ import annotations

import json
import statistics
import subprocess
from pathlib import Path

from hispec.errors import ConfigError

DEFAULT_FILE = "the default model's file (Q4_1 layers, Q8_0 embedding)"
Q4_0_FILE = "ANOTHER FILE: the same model requantised to Q4_0 by llama-quantize (its text is not the default model's)"
SYSTEM_KEYS = ("build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_type", "model_size",
               "model_n_params", "n_threads", "repack")


def _run(binary: Path, model: Path, threads: int, prompt: int, generate: int, repetitions: int) -> dict:
    try:
        run = subprocess.run([str(binary), "-m", str(model), "-t", str(threads), "-p", str(prompt), "-n", str(generate),
                              "-r", str(repetitions), "-o", "json"], capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"llama-bench ({binary}) could not run: {exc}") from None
    if run.returncode != 0:
        raise ConfigError(f"llama-bench -p {prompt} -n {generate} failed ({run.returncode}): {run.stderr[-500:]}")
    records = json.loads(run.stdout)
    if len(records) != 1:
        raise ConfigError(f"llama-bench gave {len(records)} records for -p {prompt} -n {generate}, expected 1")
    return records[0]


def measure(binary: str | Path, model: str | Path, label: str, threads: int, tokens: int = 128,
            widths: tuple[int, ...] = (1, 2, 4, 8, 16), prompt_lengths: tuple[int, ...] = (),
            repetitions: int = 5) -> dict:
    """One file's llama-bench figures: tg, the pass widths, the prompt evaluations, its system information.
    `label` says which file it is (the default model's, or another one)."""
    binary, model = Path(binary), Path(model)
    if not binary.is_file():
        raise ConfigError(f"no llama-bench at {binary}: build it with python scripts/measure/llama_bench.py --build-only")
    tg = _run(binary, model, threads, 0, tokens, repetitions)
    passes = {k: _run(binary, model, threads, k, 0, repetitions) for k in widths}
    prompts = {n: _run(binary, model, threads, n, 0, repetitions) for n in prompt_lengths}
    one = passes.get(1)
    return {
        "file": label, "file_name": model.name, "threads": threads, "system": {k: tg.get(k) for k in SYSTEM_KEYS},
        "tg": {"tokens": tokens, "tokens_per_s": tg["avg_ts"], "stddev": tg["stddev_ts"]},
        "pp": {str(k): {"tokens_per_s": r["avg_ts"], "stddev": r["stddev_ts"],
                        "pass_cost_over_one": one["avg_ts"] * k / r["avg_ts"] if one else None}
               for k, r in passes.items()},
        "prompt_eval": {str(n): {"tokens_per_s": r["avg_ts"], "seconds": n / r["avg_ts"]} for n, r in prompts.items()},
    }


def as_run(figures: dict, prompt_tokens: int, new_tokens: int) -> dict:
    """What llama-bench's figures say a run of `new_tokens` after a prompt of `prompt_tokens` takes (the
    prompt evaluated at its measured rate, then tg's rate): time to first token, decode-only and end-to-end
    speeds. The prompt length must be one it measured."""
    evals = figures["prompt_eval"]
    if str(prompt_tokens) not in evals:
        raise ConfigError(f"llama-bench measured prompts of {', '.join(evals) or 'no'} tokens, not {prompt_tokens}")
    ttft = evals[str(prompt_tokens)]["seconds"]
    decode = figures["tg"]["tokens_per_s"]
    wall = ttft + (new_tokens - 1) / decode
    return {"ttft_s": ttft, "decode_tokens_per_s": decode, "tokens_per_s": new_tokens / wall, "wall_s": wall}


def median_prompt_tokens(records: list[dict]) -> int:
    """The median prompt length of a bench run's prompts (each prompt counted once)."""
    lengths = {(r["set"], r["prompt_id"]): r["prompt_tokens"] for r in records if r.get("prompt_tokens")}
    return int(statistics.median(lengths.values())) if lengths else 0
