"""Run one generation to the end, folding its events into stats and a trace."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable, Iterable

from hispec.engine.decoding import DecodeConfig, Decoder
from hispec.engine.events import DoneEvent, Event
from hispec.evaluation.metrics import StatsCollector
from hispec.evaluation.trace import Trace
from hispec.model.early_exit import EarlyExitModel
from hispec.text import Detokenizer


@dataclass
class RunResult:
    method: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    settings: dict
    stats: dict
    trace: Trace

    def record(self, prompt_id: str | None = None) -> dict:
        """The JSON record of the CLI contract."""
        return {"id": prompt_id, "method": self.method, "prompt_token_ids": self.prompt_ids,
                "token_ids": self.token_ids, "text": self.text, "settings": self.settings, "stats": self.stats}


def run(
    ee: EarlyExitModel,
    prompt_ids: list[int],
    config: DecodeConfig,
    eos_ids: Iterable[int] = (),
    detok: Detokenizer | None = None,
    on_event: Callable[[Event], None] | None = None,
    stop: threading.Event | None = None,
    judge: Callable[[str, int], int] | None = None,  # TIMING ONLY (hispec.evaluation.timing_only)
) -> RunResult:
    decoder = Decoder(ee, prompt_ids, config, eos_ids=eos_ids, detok=detok, stop=stop, judge=judge)
    stats, trace = StatsCollector(config.method), Trace()
    done = None
    for ev in decoder.events():
        stats.add(ev)
        trace.add(ev)
        if on_event:
            on_event(ev)
        if isinstance(ev, DoneEvent):
            done = ev
    return RunResult(config.method, list(prompt_ids), list(done.token_ids), done.text, done.settings,
                     stats.summary(), trace)
