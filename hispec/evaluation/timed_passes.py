"""The one timed loop of bench and sweep: every item (a method, a grid point) on every prompt, pass by pass.

    warm-up     each item once on the first prompt that fits, 8 tokens, untimed and unrecorded
    a pass      one prompt: every item once, in the order of evaluation.order (balanced over passes)
    skipped     a prompt too long for the model's context is recorded under `skipped_prompts`, never
                silently dropped
    a Stop      ends the loop before the next item; the prompt in progress is dropped (its items would
                not be comparable) and the report says `stopped`
    saved       after every pass the caller's `saved()` (summary, JSON): an interrupted run keeps
                what it measured
"""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass
from typing import Callable

from hispec.data.prompts import Prompt
from hispec.evaluation.order import Balanced
from hispec.evaluation.record import finish
from hispec.model.loading import LoadedModel

SKIPPED = "skipped_prompts"  # the report's key for prompts that did not fit (bench wrote 'skipped' before)
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class Items:
    """What a timed loop runs. `run(item, ids, max_new_tokens)` gives an item's record (`max_new_tokens`
    None: the run's own budget); `label(item)` the record keys that name it; `name(item)` its name in the
    recorded order of the passes."""

    items: list
    run: Callable[[object, list[int], int | None], dict]
    label: Callable[[object], dict]
    name: Callable[[object], str]


def warmup_ids(lm: LoadedModel, sets: dict[str, list[Prompt]], new_tokens: int = WARMUP_TOKENS) -> list[int] | None:
    """Token ids of the first prompt with room for `new_tokens` in the context (None: none has)."""
    for prompts in sets.values():
        for p in prompts:
            ids = lm.encode(p.text, chat=p.chat)
            if len(ids) + new_tokens <= lm.ee.context_limit:
                return ids
    return None


def time_passes(lm: LoadedModel, sets: dict[str, list[Prompt]], items: Items, report: dict, max_new_tokens: int,
                warmup: bool = True, stop: threading.Event | None = None,
                progress: Callable[[int, int, str], None] | None = None,
                saved: Callable[[], None] = lambda: None) -> None:
    """Run every item on every prompt of `sets` into `report` (its `records`, `order`, `skipped_prompts`,
    `peak_rss_mb`, `stopped`, `complete`); `saved()` after every pass, `progress(done, total, what)` after it."""
    order = Balanced(items.items)
    passes: list[list[str]] = []
    report["order"] = order.describe(passes)
    first = warmup_ids(lm, sets) if warmup else None
    for item in items.items if first is not None else []:
        items.run(item, first, WARMUP_TOKENS)
    total, done = sum(len(v) for v in sets.values()), 0
    for set_name, prompts in sets.items():
        for prompt in prompts:
            if stop is not None and stop.is_set():
                break
            ids = lm.encode(prompt.text, chat=prompt.chat)
            if len(ids) + max_new_tokens > lm.ee.context_limit:  # reported, not silently dropped
                report.setdefault(SKIPPED, []).append(
                    {"set": set_name, "prompt_id": prompt.id, "reason": f"{len(ids)} prompt tokens + "
                     f"{max_new_tokens} new exceed the model's context of {lm.ee.context_limit}"})
                done += 1
                continue
            rows, this = [], order.of(len(passes))
            for item in this:
                if stop is not None and stop.is_set():
                    break
                rows.append({"set": set_name, "prompt_id": prompt.id, "prompt_tokens": len(ids), **items.label(item),
                             **items.run(item, ids, None)})
            if len(rows) < len(this):  # stopped in the middle of this prompt: drop it
                break
            report["records"].extend(rows)
            passes.append([items.name(item) for item in this])
            done += 1
            report["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            saved()
            if progress:
                progress(done, total, f"{set_name}/{prompt.id}")
    report["stopped"] = stop is not None and stop.is_set()
    report["complete"] = not report["stopped"]
    finish(report)
