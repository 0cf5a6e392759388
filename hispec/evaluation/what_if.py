"""What if the exits were better: the real engine with TIMING ONLY verdicts, against plain decoding.

Each take is a pair run back to back on the same prompt: a real plain run, then a run of the chosen
fixed plan whose verdicts are drawn at the asked acceptance (evaluation.timing_only). Both ignore
end-of-text and run the whole budget, so the two are the same length and timed the same way
(prefill included in both). The synthetic run's text is NOT the model's; its events say so
(settings' `timing_only`), and every view labels them. Takes give a median and a range.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass
from typing import Iterator

from hispec.engine.decoding import DecodeConfig
from hispec.engine.events import DoneEvent
from hispec.evaluation.runner import events, plain_config, run
from hispec.evaluation.timing_only import SyntheticAcceptance
from hispec.text import Detokenizer

DEFAULT_TAKES = 3
MAX_TAKES = 5


@dataclass(frozen=True)
class PlainTimed:
    take: int
    tokens_per_s: float
    new_tokens: int


@dataclass(frozen=True)
class TakeStarted:
    take: int
    of: int
    rates: tuple[float, float]  # the acceptance drawn at: draft -> verify, -> full model


@dataclass(frozen=True)
class TakeDone:
    take: int
    synthetic_tokens_per_s: float
    plain_tokens_per_s: float
    new_tokens: int

    @property
    def ratio(self) -> float | None:
        return self.synthetic_tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else None


@dataclass(frozen=True)
class Summary:
    takes: tuple[TakeDone, ...]
    of: int

    @property
    def ratios(self) -> list[float]:
        return sorted(t.ratio for t in self.takes if t.ratio is not None)

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


def what_if(lm, ids: list[int], config: DecodeConfig, rates: tuple[float, float], takes: int,
            stop: threading.Event) -> Iterator[object]:
    """Progress text, then per take: PlainTimed, TakeStarted, the synthetic run's engine events,
    TakeDone; last a Summary. `config`: the resolved fixed plan; `rates`: (draft -> verify,
    -> full model) per-token acceptance to draw at."""
    plain = plain_config(config).resolve_for(lm.ee)
    done: list[TakeDone] = []
    for take in range(1, takes + 1):
        if stop.is_set():
            break
        yield f"Take {take} of {takes}: timing plain decoding on this prompt first…"
        base = run(lm.ee, ids, plain, eos_ids=(), detok=Detokenizer(lm.tokenizer), stop=stop)
        yield PlainTimed(take, base.stats["tokens_per_s"], len(base.token_ids))
        if stop.is_set():
            break
        yield f"Take {take} of {takes}: the synthetic run at the sliders' acceptance…"
        yield TakeStarted(take, takes, rates)
        judge = SyntheticAcceptance(verify=rates[0], target=rates[1], seed=(config.seed or 0) + take - 1)
        new_tokens, seconds = 0, 0.0
        for ev in events(lm, ids, config, stop=stop, judge=judge, eos_ids=()):
            yield ev
            if isinstance(ev, DoneEvent):
                new_tokens, seconds = len(ev.token_ids), ev.t
        if stop.is_set() and new_tokens < config.max_new_tokens:
            break  # a stopped take is not a like-for-like pair
        done.append(TakeDone(take, new_tokens / seconds if seconds > 0 else 0.0, base.stats["tokens_per_s"],
                             new_tokens))
        yield done[-1]
    yield Summary(tuple(done), takes)
