"""Run one generation to the end, folding its events into stats and a trace."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable, Generator, Iterable, Iterator

from hispec.engine.config import DecodeConfig, default_exits, recommended_settings
from hispec.engine.levels import LOOKUP
from hispec.errors import HiSpecError
from hispec.engine.decoding import Decoder
from hispec.engine.events import DoneEvent, Event
from hispec.runs.metrics import StatsCollector, decode_rate
from hispec.runs.record import RecordedSettings, RunRecord
from hispec.runs.record import build as build_record
from hispec.runs.trace import Trace
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
    judge: Callable[[str, int], int] | None = None,  # TIMING ONLY (hispec.runs.timing_only)
) -> RunResult:
    """One generation, timed from before its decoder is built (timed_events)."""
    events_of = timed_events(ee, prompt_ids, config, eos_ids, detok, stop, judge)
    while True:
        try:
            ev = next(events_of)
        except StopIteration as end:
            return end.value
        if on_event:
            on_event(ev)


def timed_events(ee: EarlyExitModel, prompt_ids: list[int], config: DecodeConfig, eos_ids: Iterable[int] = (),
                 detok: Detokenizer | None = None, stop: threading.Event | None = None,
                 judge: Callable[[str, int], int] | None = None) -> Generator[Event, None, RunResult]:
    """One generation's events as they come; returns its RunResult. Timed from before its decoder is
    built: the set-up (configuration, policy, cost model) counts, for every method alike. The stats'
    `setup_s` is that part; `wall_s` and `tokens_per_s` include it."""
    t_start = time.perf_counter()
    decoder = Decoder(ee, prompt_ids, config, eos_ids=eos_ids, detok=detok, stop=stop, judge=judge)
    setup = time.perf_counter() - t_start  # the events' clock starts when the first event is asked for
    stats, trace = StatsCollector(config.method), Trace()
    done = None
    for ev in decoder.events():
        stats.add(ev)
        trace.add(ev)
        yield ev
        if isinstance(ev, DoneEvent):
            done = ev
    return RunResult(config.method, list(prompt_ids), list(done.token_ids), done.text, done.settings,
                     with_setup(stats.summary(), setup), trace)


def with_setup(stats: dict, setup_s: float) -> dict:
    """A run's stats with its decoder's set-up time counted in its wall time, its speed and its time to
    first token (`ttft_s`: set-up + the time to the first committed token), and its decode-only speed."""
    wall = stats["wall_s"] + setup_s
    ttft = setup_s + stats["prefill_s"] if stats.get("prefill_s") is not None else None
    return {**stats, "setup_s": setup_s, "wall_s": wall, "ttft_s": ttft,
            "tokens_per_s": stats["new_tokens"] / wall if wall > 0 else 0.0,
            "decode_tokens_per_s": decode_rate(stats["new_tokens"], wall, ttft)}


def plain_config(config: DecodeConfig) -> DecodeConfig:
    """Plain decoding with the run's budget and sampling: nothing of its levels (a 'plain' run
    that kept the exit levels would still draft at them)."""
    return config.plain()


def events(lm, prompt_ids: list[int], config: DecodeConfig, stop: threading.Event | None = None,
           judge: Callable[[str, int], int] | None = None, eos_ids: Iterable[int] | None = None) -> Iterator[Event]:
    """One generation of a loaded model (hispec.model.loading.LoadedModel), event by event: what a
    served request streams. The decoder is built here, in the worker that runs it: its set-up may
    time the model (the adaptive policy's cost model), which must happen in the model's turn.
    `eos_ids`: None stops at the model's own end-of-text tokens; () never stops early."""
    yield from decoder_for(lm, prompt_ids, config, eos_ids=eos_ids, stop=stop, judge=judge).events()


def decoder_for(lm, prompt_ids: list[int], config: DecodeConfig, eos_ids: Iterable[int] | None = None,
                detok: Detokenizer | None = None, **kwargs) -> Decoder:
    """The Decoder of one generation of a loaded model, which binds its layers, its tokenizer (the
    detokenizer) and its end-of-text ids (None: the model's own; () never stops early) here, once."""
    return Decoder(lm.ee, prompt_ids, config, eos_ids=lm.eos_ids if eos_ids is None else eos_ids,
                   detok=detok or Detokenizer(lm.tokenizer), **kwargs)


def run_loaded(lm, prompt_ids: list[int], config: DecodeConfig, detok: Detokenizer | None = None) -> RunResult:
    """`run` on a loaded model: its layers, detokenizer and end-of-text ids bound (see decoder_for)."""
    return run(lm.ee, prompt_ids, config, eos_ids=lm.eos_ids, detok=detok or Detokenizer(lm.tokenizer))


def warm_up(lm, progress: Callable[[str], None] | None = None) -> float:
    """Short untimed generations of a freshly loaded model, so that neither a visitor's first run nor the
    first run of a timed pair pays for one-off work: the model's default configuration (hispec/auto at its
    recommended levels: on the default model its 4-bit copy is built and its kernel loaded) and its exits
    under the auto policy, each calibrating the pass costs the adaptive policy plans with (engine.planning.costs).
    Seen before: a Compare on a fresh app timed its first run at 6 tokens/s against 34 for the next two,
    and called a 2.2x ratio "no measurable difference". Returns the seconds it took."""
    t0 = time.perf_counter()
    if progress:
        progress("Timing this machine's passes for the adaptive policy (once per model)…")
    L, rec = lm.ee.num_layers, recommended_settings(lm.ee)
    d, v = (rec["draft"], rec["verify"]) if 0 < rec.get("draft", 0) < rec.get("verify", 0) else default_exits(L)
    configs = [DecodeConfig(max_new_tokens=4)] + ([DecodeConfig(levels=(LOOKUP, d, v), max_new_tokens=4)]
                                                  if 0 < d < v < L else [])
    ids = lm.encode("Hello", chat=False)[:8] or [0]
    for config in configs:
        try:
            run_loaded(lm, ids, config)
        except HiSpecError as exc:  # not this model's to refuse: a visitor's run that needs it says why
            if progress:
                progress(f"Warm-up skipped a part ({exc}); a run that needs it will say so")
    return time.perf_counter() - t0


class LiveRun:
    """A generation folded as its events arrive: stats, trace, the events, the DoneEvent; `record()` once it ends."""

    def __init__(self, method: str = ""):
        self.stats, self.trace = StatsCollector(method), Trace()
        self.events: list[Event] = []
        self.done: DoneEvent | None = None
        self.levels: tuple = ()  # the run's level list, once known (set_levels; at the latest, its DoneEvent's)

    def set_levels(self, levels) -> None:
        """The run's level list, known before its first event where the request says it (serving does)."""
        self.levels = tuple(levels or ())
        self.trace.set_levels(self.levels)

    def add(self, ev: Event) -> None:
        self.stats.add(ev)
        self.trace.add(ev)
        self.events.append(ev)
        if isinstance(ev, DoneEvent):
            self.done = ev
            recorded = RecordedSettings.read(ev.settings)
            self.set_levels(recorded.spec)
            if not self.stats.method:  # the run's own name ('hispec (auto)'), when the caller gave none
                self.stats.method = recorded.method

    def summary(self) -> dict:
        return self.stats.summary()

    def record(self, **context) -> RunRecord:
        """The finished run as one value (runs.record.build; `context`: model, prompt_ids, vs_plain, pairs_asked)."""
        return build_record(self.events, self.summary(), **context)
