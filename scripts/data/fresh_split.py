"""Makes a report split no development has touched: 'heldout-fresh' (assets/prompts/fresh_split.json,
2026-12-05) or 'heldout-fresh-2' (assets/prompts/fresh2_split.json, 2026-12-07), data.prompts.FRESH_SPLITS.

Its prompts come from the offline sets (HumanEval, ShareGPT, the summaries; MT-Bench has none left:
its 80 questions were all among the exit heads' training prompts) and are, at the commit that made it:

- not among the exit heads' training prompts (their manifest's `prompt_spec`, drawn as train-exits drew it);
- in no JSON under assets/ in the whole git history (`committed_json`), neither by id nor by the first 80 characters of
  their text (every benchmark, sweep, prior, load test and recording the repository ever committed);
- not empty, and (but the summaries, documents of 180-720 words) at most 256 tokens under the chat
  template (what train-exits admitted as prompts);
- the first N of each set in the order of the SHA-256 of their ids (COUNTS: the first split took 8
  HumanEval, 8 ShareGPT and every summary left, 12; the second 8 HumanEval and 12 ShareGPT, no summary
  being left).

No development may touch this split: no setting, threshold, prior or default may be chosen on it,
and no run on it may be committed except the reports it lists (`reported_in`); tests/data/
test_fresh_split.py fails on any other artifact, in the working tree or anywhere in the history,
that holds one of its prompts by id or by text (`touching`).

    python scripts/data/fresh_split.py --name heldout-fresh-2 [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hispec.data.prompts import (FRESH_NAME, FRESH_SOURCES, FRESH_SPLITS, load_humaneval,  # noqa: E402
                                 load_sets, load_sharegpt, load_summarize)

COUNTS = {"heldout-fresh": {"humaneval": 8, "sharegpt": 8, "summarize": 12},
          # the second: every summary was taken by the first (and shipped as data since), so more ShareGPT
          "heldout-fresh-2": {"humaneval": 8, "sharegpt": 12, "summarize": 12}}
MAX_PROMPT_TOKENS = 256


def committed_json(root: Path = ROOT) -> list[tuple[str, str]]:
    """Every version of every JSON artifact under assets/ in the repository's history, as (path, text)."""
    listing = subprocess.run(["git", "rev-list", "--all", "--objects", "--", "assets"], cwd=root,
                             capture_output=True, text=True, check=True).stdout.splitlines()
    blobs = [line.split(" ", 1) for line in listing if line.endswith((".json", ".jsonl"))]
    if not blobs:
        return []
    batch = subprocess.run(["git", "cat-file", "--batch"], cwd=root, capture_output=True, check=True,
                           input="".join(f"{sha}\n" for sha, _ in blobs).encode()).stdout
    out, pos = [], 0
    for _, path in blobs:  # each answer: "<sha> blob <size>\n<content>\n"
        header_end = batch.index(b"\n", pos)
        size = int(batch[pos:header_end].split()[2])
        out.append((path, batch[header_end + 1: header_end + 1 + size].decode("utf-8", "replace")))
        pos = header_end + 1 + size + 1
    return out


def seen(prompt, text: str) -> bool:
    snippet = prompt.text.strip()[:80]
    return any(s and (s in text or json.dumps(s)[1:-1] in text) for s in (prompt.id, snippet))


def touching(documents: list[tuple[str, str]], prompts: list, split: dict, own_file: str) -> list[str]:
    """The paths among `documents` ((path, text) pairs) that hold a prompt of the split, by id, by a
    former id (summaries.jsonl: formerly) or by the first 80 characters of its text; the split's own
    file (`own_file`, relative to the repository), the summaries' source file and the reports the split
    lists are let through."""
    allowed = {str(Path(p)) for p in split["reported_in"]} | {own_file, "assets/prompts/summaries.jsonl"}
    former = [old for old, new in (split.get("renamed") or {}).get("ids", {}).items()]
    hits = []
    for path, text in documents:
        if path in allowed:
            continue
        if any(seen(p, text) for p in prompts) or any(json.dumps(i) in text for i in former):
            hits.append(path)
    return sorted(set(hits))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--name", default=FRESH_NAME, choices=sorted(FRESH_SPLITS),
                        help="which split to make (its file: data.prompts.FRESH_SPLITS); a split is made once")
    parser.add_argument("--out", help="where to write it (default: the split's own file)")
    args = parser.parse_args(argv)
    out_path = Path(args.out or FRESH_SPLITS[args.name])
    from hispec.model.loading import load_model

    lm = load_model("default", device="cpu")
    spec = lm.ee.exit_info["training"]["prompt_spec"]
    trained = {p.id for ps in load_sets(spec, seed=int(lm.ee.exit_info["training"].get("seed", 0))).values() for p in ps}
    history = "\n".join(text for _, text in committed_json())
    pools = {"humaneval": load_humaneval(), "sharegpt": load_sharegpt(), "summarize": load_summarize()}
    sets = {}
    for name, prompts in pools.items():
        fresh = [p for p in prompts if p.text.strip() and p.id not in trained and not seen(p, history)
                 and (name == "summarize" or len(lm.encode(p.text, chat=p.chat)) <= MAX_PROMPT_TOKENS)]
        fresh.sort(key=lambda p: hashlib.sha256(p.id.encode("utf-8")).hexdigest())
        taken = [p.id for p in fresh[:COUNTS[args.name][name]]]
        print(f"{name}: {len(prompts)} prompts, {len(fresh)} untouched, {len(taken)} taken", file=sys.stderr)
        if taken:
            sets[name] = taken
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    out = {"name": args.name, "sources": FRESH_SOURCES,
           "rule": "not among the exit heads' training prompts; in no JSON under assets/ in the git history "
                   "(by id or by the first 80 characters of the text); at most 256 tokens under the chat template (but the summaries); "
                   "the first of each set by the SHA-256 of the id",
           "policy": "no development may touch this split: nothing is tuned, chosen or committed on it except "
                     "the reports listed in reported_in",
           "made_at": commit, "command": f"python scripts/data/fresh_split.py --name {args.name}", "sets": sets,
           "reported_in": []}
    out_path.write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
