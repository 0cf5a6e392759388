"""runs.meter: what every generation wrote while one ran (its MachinePace), counted as their updates pass through
serving.worker: overlapping watches, the most generations at once, a watch closed once, only committed tokens,
the pace right after the run's DoneEvent and nothing after it (tests/serving/test_session.py: a stream that ends
without its DoneEvent leaves no watch open)."""

from __future__ import annotations

from hispec.engine.events import DoneEvent, TokenEvent, TokenState
from hispec.runs.record import MachinePace
from hispec.runs.meter import Meter, metered


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_overlapping_generations_each_see_the_machines_tokens_over_their_own_seconds():
    clock = Clock()
    m = Meter(clock)
    a = m.watch()
    a.add(3)
    clock.t += 1
    b = m.watch()  # two at once from here
    b.add(5)
    a.add(2)
    clock.t += 1
    assert a.close() == MachinePace(tokens=10, own_tokens=5, seconds=2.0, visitors=2)
    b.add(1)
    clock.t += 2
    assert b.close() == MachinePace(tokens=8, own_tokens=6, seconds=3.0, visitors=2)  # from its own start
    assert a.close() is None and m.live == 0  # closed once
    alone = m.watch()
    alone.add(4)
    clock.t += 1
    pace = alone.close()
    assert pace.visitors == 1 and not pace.others and pace.tokens_per_s == pace.own_tokens_per_s == 4.0


def _token(i, state=TokenState.ACCEPTED):
    return TokenEvent(state=state, serial=i, index=i, token_id=7, text="x", origin="target", stage="target", round=1,
                      t=0.0)


def _done():
    return DoneEvent(reason="max_new_tokens", token_ids=(7, 7), text="xx", prompt_len=1, t=0.1)


def test_a_generations_batches_are_counted_and_its_pace_follows_its_done_event(monkeypatch):
    m = Meter(Clock())
    monkeypatch.setattr("hispec.runs.meter.METER", m)
    first = [{"prompt_ids": [1]}, _token(0), _token(1, TokenState.DRAFTED)]
    watch = metered(first, None)
    assert watch is not None and watch.own == 1 and m.live == 1  # only committed tokens count
    last = [_token(1), _done(), {"vs_plain": {}}]
    assert metered(last, watch) is watch
    assert isinstance(last[2], MachinePace) and last[2].own_tokens == 2 and m.live == 0  # right after its DoneEvent
    assert metered([_token(5)], watch) is watch and watch.own == 2  # nothing counted after the run's end
