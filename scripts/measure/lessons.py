"""Record the page's lessons: runs of the embedded default model that the page replays with no model time.

    python scripts/measure/lessons.py [--out assets/lessons] [--pairs 3]

Each lesson is one generation on a fixed prompt, kept as its run record (hispec.runs.record.RunRecord.to_json)
with the timing pairs against plain decoding measured right after it (as the page measures them), the pass
costs its policy kept, what each exit and the run's 4-bit level believed at every token, and where it ran
(machine, commit, command, the load average), gzipped. Run it alone on a quiet machine: the figures the page
shows in a lesson are this machine's. The prompts are demonstrations written here, not from a prompt set.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

LESSONS = (  # file name, title, prompt, configuration ("default" or the Teaching preset), tokens
    ("1-default-copy", "The default on a sentence to copy: lookup copies, the 4-bit model judges and drafts",
     "Copy this sentence word for word: Speculative decoding lets a cheap drafter propose tokens that the expensive "
     "target model then verifies in one batched pass.", "default", 64),
    ("2-default-sky", "The default on an explanation: the 4-bit model drafts most tokens",
     "Explain in two sentences why the sky is blue.", "default", 64),
    ("3-teaching-sky", "The Teaching preset: the paper's exit hierarchy (exit 2 drafts, exit 4 judges), fixed rounds",
     "Explain in two sentences why the sky is blue.", "teaching", 48),
)


def record_one(lm, prompt: str, which: str, tokens: int, pairs: int) -> dict:
    from hispec.engine.config import DecodeConfig, recommended_settings
    from hispec.evaluation.compare import vs_plain
    from hispec.explain.beliefs import exit_beliefs
    from hispec.runs.record import build
    from hispec.runs.runner import run
    from hispec.text import Detokenizer
    # the Teaching preset (ui.controls): the model's recommended exits, the paper's lengths (2, 4), fixed rounds
    exits = recommended_settings(lm.ee)
    teaching = DecodeConfig(levels=(exits["draft"], exits["verify"]), lengths=(2, 4), policy="fixed",
                            max_new_tokens=tokens)
    config = (DecodeConfig(max_new_tokens=tokens) if which == "default" else teaching).resolve_for(lm.ee)
    ids = lm.encode(prompt, chat=True)
    events = []
    result = run(lm.ee, ids, config, lm.eos_ids, detok=Detokenizer(lm.tokenizer), on_event=events.append)
    measured = None
    for item in vs_plain(lm, ids, config, len(result.token_ids), pairs, threading.Event()):
        if isinstance(item, dict):
            measured = item["vs_plain"]
    record = build(events, result.stats, model="default", prompt_ids=ids, vs_plain=measured, pairs_asked=pairs)
    beliefs = exit_beliefs(lm.ee, ids, result.token_ids, tokenizer=lm.tokenizer, formats=record.formats)
    return record.to_json() | {"beliefs": beliefs}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "assets" / "lessons", help="where the lessons go")
    parser.add_argument("--pairs", type=int, default=3, help="timing pairs against plain decoding per lesson")
    args = parser.parse_args(argv)
    from hispec.evaluation.host import cpu_flags, cpu_model, loadavg
    from hispec.evaluation.record import code_version
    from hispec.model.loading import load_model
    from hispec.runs.runner import warm_up

    lm = load_model("default", device="cpu")
    warm_up(lm)
    args.out.mkdir(parents=True, exist_ok=True)
    command = "python scripts/measure/lessons.py " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = f"{cpu_model()} ({'AVX-512' if 'avx512f' in cpu_flags() else 'no AVX-512'}), {os.cpu_count()} cores"
    for name, title, prompt, which, tokens in LESSONS:
        load = loadavg()
        data = record_one(lm, prompt, which, tokens, args.pairs)
        data |= {"title": title, "prompt": prompt,
                 "recorded_on": {"machine": machine, **code_version(), "command": command.strip(),
                                 "loadavg_start": load, "loadavg_end": loadavg()}}
        path = args.out / f"{name}.json.gz"
        path.write_bytes(gzip.compress(json.dumps(data).encode(), mtime=0))
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {len(data['token_ids'])} tokens, "
              f"{path.stat().st_size // 1024} KiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
