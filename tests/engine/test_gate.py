"""Between rounds a generation gives way (engine.gate): the hook runs once a round, and the time spent
waiting in it is left out of the generation's own clock."""

import time

from helpers import ee_of, hf_greedy

from hispec.engine.config import preset
from hispec.engine.decoding import decode
from hispec.engine.events import DoneEvent, RoundEvent
from hispec.engine.gate import gated


def test_give_way_runs_once_a_round_and_its_wait_is_not_counted(tiny_llama, monkeypatch):
    calls, offset, real = [], [0.0], time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: real() + offset[0])

    def wait_a_while():  # another job's round: 100 s pass on the clock
        calls.append(1)
        offset[0] += 100.0

    config = preset("autoregressive", max_new_tokens=6)
    with gated(wait_a_while):
        events = list(decode(ee_of(tiny_llama), [5, 6, 7], config))
    rounds = [e for e in events if isinstance(e, RoundEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent)
    assert len(calls) == len(rounds) >= 5
    assert list(done.token_ids) == hf_greedy(tiny_llama, [5, 6, 7], 6)
    # 500+ s of waiting happened inside the generation; its own clock leaves them out.
    assert done.t < 100.0, done.t
    assert all(e.t < 100.0 for e in rounds)


def test_without_a_gate_nothing_waits(tiny_llama):
    events = list(decode(ee_of(tiny_llama), [5, 6, 7], preset("autoregressive", max_new_tokens=3)))
    assert isinstance(events[-1], DoneEvent)
