"""The pass board (hispec/model/shared.py): generations in their own threads whose passes meet and run as
one call. Pinned here with a stand-in operation: a non-member runs at once; members waiting together run as
one call; members whose passes went different ways fall into step; a member busy elsewhere holds nobody
for long; a fault in a fused call ends only the pass that caused it. Then on tiny models with the native
route (q4 weights, and float32 on blocks): several generations at once, every method, each with the token
ids it writes alone, with calls that carried several generations counted."""

import threading
from collections import Counter

import pytest
from helpers import on_blocks, tiny_model

from hispec.engine.config import preset
from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats import q4_kernel
from hispec.model.formats.q4 import to_q4
from hispec.model import shared
from hispec.model.shared import BOARD, PassBoard
from hispec.engine.events import PassEvent
from hispec.runs.runner import run


class Recorder:
    """run_many of a stand-in operation: doubles each item, records each call's items; fails on 'bad'."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, items):
        with self.lock:
            self.calls.append(list(items))
        if "bad" in items:
            raise ValueError("a bad item")
        return [2 * item for item in items]


def _members(board, n, body):
    """n threads, each a member running body(i); their results (or exceptions) by index."""
    out, started = {}, threading.Barrier(n)

    def work(i):
        with board.member():
            started.wait()
            try:
                out[i] = body(i)
            except Exception as exc:  # noqa: BLE001 - handed to the test
                out[i] = exc

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads), "a member never finished"
    return out


def test_a_thread_that_is_not_a_member_runs_its_pass_at_once():
    board, op = PassBoard(), Recorder()
    assert board.run("k", 3, op) == 6 and op.calls == [[3]]
    assert board.counts.calls == 0  # the board ran nothing


def test_members_waiting_together_run_as_one_call():
    board, op = PassBoard(window_s=5.0), Recorder()  # a long window: only 'everyone waits' can start it
    out = _members(board, 4, lambda i: board.run("k", i, op))
    assert out == {i: 2 * i for i in range(4)}
    assert op.calls and sorted(op.calls[0]) == [0, 1, 2, 3] and len(op.calls) == 1
    assert board.counts.by_width == {4: 1}


def test_each_member_tallies_the_calls_it_shared():
    board, op = PassBoard(window_s=5.0), Recorder()
    tallies, gate = {}, threading.Barrier(3)

    def work(i):
        with board.member() as tally:
            gate.wait()
            board.run("k", i, op)
            tallies[i] = tally

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all((t.calls, t.shared_calls, t.others_passes, t.most_members) == (1, 1, 2, 3) for t in tallies.values())
    with board.member() as alone:
        board.run("k", 9, op)
    assert (alone.calls, alone.shared_calls, alone.others_passes) == (1, 0, 0)


def test_a_shared_call_tells_each_member_the_others_rows_and_a_lane_pass_only_what_carried_it():
    """Rows: each member's tally counts its rows and the others' in its shared calls; last_beside reports the
    other passes and rows of the lane passes since the thread last asked (a head's call, lane_pass=False, is not
    reported), then starts again from nothing."""
    board, op = PassBoard(window_s=5.0), Recorder()
    got, gate = {}, threading.Barrier(3)

    def work(i):
        with board.member() as tally:
            gate.wait()
            board.run("layers", i, op, rows=i + 1)  # 1, 2 and 3 rows
            after_layers = board.last_beside()
            gate.wait()
            board.run("head", i, op, rows=i + 1, lane_pass=False)
            got[i] = (tally.own_rows, tally.others_rows, after_layers, board.last_beside())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(op.calls) == 2, op.calls  # the layers' call and the head's, each carrying all three
    for i in range(3):
        own, others, layers, head = got[i]
        assert (own, others) == (2 * (i + 1), 2 * (6 - (i + 1))), got[i]  # two shared calls each
        assert layers == (2, 6 - (i + 1)) and head == (0, 0), got[i]
    with board.member():
        board.run("layers", 1, op, rows=4)
        assert board.last_beside() == (0, 0)  # alone: nothing beside it
    assert board.last_beside() == (0, 0) and board.tally() is None  # outside the board


def test_members_whose_passes_went_different_ways_fall_into_step():
    """Member 0 starts at step 'b', member 1 at step 'a'; each alternates a, b, a, b... The largest group
    goes first, so after the first call they post the same key and share every later call."""
    board, op = PassBoard(window_s=5.0), Recorder()
    keys = ("a", "b")

    def body(i):
        return [board.run(keys[(i + 1 + step) % 2], 10 * i + step, op) for step in range(6)]

    out = _members(board, 2, body)
    assert out[0] == [2 * s for s in range(6)] and out[1] == [2 * (10 + s) for s in range(6)]
    assert board.counts.by_width[2] >= 4, board.counts


def test_a_member_busy_elsewhere_holds_the_others_only_for_the_window():
    """One member never posts a pass while three do theirs: with a short window they still finish (a
    long window would wait for it; this test does not time anything, it only has to end)."""
    board, op = PassBoard(window_s=0.01), Recorder()
    idle = threading.Event()

    def body(i):
        if i == 3:
            idle.wait(10)  # busy elsewhere until the others are done
            return None
        result = [board.run("k", i, op) for _ in range(5)]
        return result

    def watcher():
        while board.counts.passes < 15:
            threading.Event().wait(0.01)
        idle.set()

    threading.Thread(target=watcher, daemon=True).start()
    out = _members(board, 4, body)
    assert out[0] == [0] * 5 and out[2] == [4] * 5


def test_a_fault_in_a_fused_call_ends_only_the_pass_that_caused_it():
    board, op = PassBoard(window_s=5.0), Recorder()
    items = [1, "bad", 3]
    out = _members(board, 3, lambda i: board.run("k", items[i], op))
    assert out[0] == 2 and out[2] == 6
    assert isinstance(out[1], ValueError) and "a bad item" in str(out[1])
    assert len(op.calls[0]) == 3 and sorted(len(c) for c in op.calls[1:]) == [1, 1, 1]  # then one by one


# ---- the engine on the board ----------------------------------------------------------------------------------
REASON = q4_kernel.unavailable_reason()
needs_kernel = pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
PROMPTS = [[5, 9, 13, 4], [20, 21], [7, 7, 7, 7, 7, 7, 8], [33, 40, 41, 2 + 40, 12], [60], [3, 4, 5, 6, 7, 8, 9, 10]]


def _generations_at_once(ee, configs):
    """Each (prompt, config) in its own member thread of the process's board; token ids by index."""
    return _members(BOARD, len(configs), lambda i: run(ee, PROMPTS[i % len(PROMPTS)], configs[i]).token_ids)


@needs_kernel
@pytest.mark.parametrize("weights", ["q4", "fp32-blocks"])
def test_generations_sharing_passes_write_what_they_write_alone(weights):
    if weights == "q4":
        ee = EarlyExitModel(to_q4(tiny_model("llama", layers=6, seed=21)))
    else:
        model, matrices = on_blocks(tiny_model("llama", layers=6, seed=21))
        ee = EarlyExitModel(model)
        ee.use_blocks(matrices)
    configs = [preset("autoregressive", max_new_tokens=24), preset("hispec", draft_layer=2, verify_layer=4,
                                                                   max_new_tokens=24),
               preset("autoregressive", max_new_tokens=17), preset("lookup", max_new_tokens=24),
               preset("layerskip", draft_layer=3, max_new_tokens=24), preset("hispec", policy="auto",
                                                                             max_new_tokens=24)]
    alone = {i: run(ee, PROMPTS[i], c).token_ids for i, c in enumerate(configs)}
    before = Counter(BOARD.counts.by_width)
    together = _generations_at_once(ee, configs)
    assert together == alone
    shared = Counter(BOARD.counts.by_width) - before
    assert any(width > 1 for width in shared), shared  # passes were shared
    # the engine's pass events say which of a generation's passes shared a call, and with how many rows
    passes = _members(BOARD, 2, lambda i: _passes(ee, PROMPTS[i], configs[0]))
    beside = [ev for i in (0, 1) for ev in passes[i] if ev.beside]
    assert beside and all(ev.beside == 1 and ev.beside_rows >= 1 for ev in beside), passes
    assert not any(ev.beside for ev in _passes(ee, PROMPTS[0], configs[0]))  # alone: every pass its own call


def _passes(ee, prompt, config) -> list[PassEvent]:
    seen = []
    run(ee, prompt, config, on_event=seen.append)
    return [ev for ev in seen if isinstance(ev, PassEvent)]


def test_a_member_alone_on_its_key_is_not_starved_by_a_crowd_on_another():
    """Three members alternate keys 'a' and 'b' in step; a fourth waits on key 'c' throughout. Largest-first
    alone would run the crowd's groups until they finish; the lone pass goes within MAX_SKIPS calls."""
    board, op = PassBoard(window_s=5.0), Recorder()
    order, lock = [], threading.Lock()

    def body(i):
        if i == 3:
            out = board.run("c", 100, op)
            with lock:
                order.append(("c", len(op.calls)))
            return out
        return [board.run("ab"[s % 2], s, op) for s in range(8)]

    out = _members(board, 4, body)
    assert out[3] == 200
    (_, calls_before_c), = order
    assert shared.MAX_SKIPS == 2 and calls_before_c <= 3, op.calls  # after two of the crowd's calls at most (not 9th)
