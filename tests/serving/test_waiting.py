"""A visitor who waits for the model hears so at once, as a typed update (serving.updates.Waiting), and hears it
again as the queue moves; and a run's timing pairs against plain decoding give way to a visitor who waits
(evaluation.compare.vs_plain: the pairs left are not run, and the run's result says how many were)."""

from __future__ import annotations

import contextlib
import threading
import time

from helpers import slow, tiny_server, wait_until

from hispec.serving.api import GenerateRequest
from hispec.serving.caller import Caller
from hispec.serving.jobs import Job
from hispec.serving.turns import STEP_S
from hispec.serving.updates import Ended, Output, Status, Waiting

A, B, C = Caller("tab-a", "10.0.0.1"), Caller("tab-b", "10.0.0.2"), Caller("tab-c", "10.0.0.3")


def gen(max_new=8, **kw) -> dict:
    return {"prompt": "hi", "method": "hispec", "policy": "fixed", "draft_layer": 2, "verify_layer": 5,
            "draft_len": 2, "verify_threshold": 3, "max_new_tokens": max_new, "chat": True, **kw}


@contextlib.contextmanager
def held_by_another(turns):
    """Another visitor's job holds the model's turn meanwhile."""
    holder = Job(0, "another-visitor", "generate")
    assert turns.hold(holder, 1.0)
    try:
        yield holder
    finally:
        turns.release(holder)


def vs_plain_of(updates) -> dict | None:
    found = [item["vs_plain"] for u in updates if isinstance(u, Output) for item in u.items
             if isinstance(item, dict) and "vs_plain" in item]
    return found[-1] if found else None


# ---- "Waiting" at once ---------------------------------------------------------------------------
def test_a_request_behind_another_hears_that_it_waits_first_and_at_once():
    server = tiny_server()
    turns = server.registry.turns("tiny")
    with held_by_another(turns):
        stream = server.submit(B, GenerateRequest, gen())
        t0 = time.monotonic()
        first = next(stream)
        waited = time.monotonic() - t0
        # the first update says it waits, as a value (how many ahead), not words to parse back
        assert isinstance(first, Waiting), first
        assert first.ahead == 1 and first.text.startswith("Waiting for the model: 1 request ahead")
        assert isinstance(first, Status)  # every reader of a Status shows it as it did
        # at once: not after the queue's first look round (STEP_S), which is when it came before
        assert waited < STEP_S * 0.8, f"the first update took {waited:.2f} s"
        server.stop(B)
        assert list(stream)[-1] == Ended("stopped", "Stopped before the generation started.")
    assert not turns.busy and turns.waiting == 0


def test_the_waiting_update_follows_the_queue():
    server = tiny_server()
    turns = server.registry.turns("tiny")
    with held_by_another(turns):
        b = server.submit(B, GenerateRequest, gen())
        assert next(b).ahead == 1
        c = server.submit(C, GenerateRequest, gen(max_new=2))
        first = next(c)
        assert isinstance(first, Waiting) and first.ahead == 2  # the one running and B
        server.stop(B)
        assert list(b)[-1].outcome == "stopped"
        moved = next(c)  # B left: one fewer ahead, said as soon as the queue looks again
        assert isinstance(moved, Waiting) and moved.ahead == 1, moved
    rest = list(c)
    assert rest[-1].outcome == "done"
    assert not any(isinstance(u, Waiting) for u in rest[1:]), "no waiting once it holds the model"
    assert not turns.busy and turns.waiting == 0


def test_a_request_with_the_model_free_hears_no_waiting():
    server = tiny_server()
    updates = list(server.submit(A, GenerateRequest, gen(max_new=2)))
    assert updates[-1].outcome == "done"
    assert not any(isinstance(u, Waiting) for u in updates)


# ---- the timing pairs give way ---------------------------------------------------------------------
def test_the_timing_pairs_give_way_to_a_visitor_who_waits():
    server = tiny_server()
    lm = server.registry.get("tiny")
    with slow(lm, 0.01):
        a = server.submit(A, GenerateRequest, gen(max_new=8, baseline=3))
        seen = []
        for update in a:  # A's run ends, its pairs start
            seen.append(update)
            if isinstance(update, Status) and update.text.startswith("Timing plain decoding"):
                break
        box = {}
        b = threading.Thread(target=lambda: box.setdefault("b", list(server.submit(B, GenerateRequest,
                                                                                 gen(max_new=40)))), daemon=True)
        b.start()  # B waits for the model behind A's pairs
        seen += list(a)
        server.stop(B)
        b.join(30)
    assert seen[-1].outcome == "done"
    measured = vs_plain_of(seen)
    assert measured is not None and measured["asked"] == 3
    # the pair under way when B came ran to its end (shared round by round); the pairs after it did not run
    assert 1 <= measured["runs"] < 3, measured
    assert measured["yielded"] == 3 - measured["runs"] and measured["cut"] == 0, measured
    assert box["b"][-1].outcome in ("done", "stopped")


def test_with_nobody_waiting_every_timing_pair_runs():
    server = tiny_server()
    updates = list(server.submit(A, GenerateRequest, gen(max_new=8, baseline=3)))
    assert updates[-1].outcome == "done"
    measured = vs_plain_of(updates)
    assert measured["runs"] == 3 and measured["yielded"] == 0 and measured["cut"] == 0, measured


def test_a_waiting_job_of_the_same_visitor_does_not_take_the_pairs():
    """The pairs give way to another visitor: a visitor's own second request (its session's) waits its turn, as it
    always did; another session of the same address (a classmate behind one school network) is another visitor."""
    server = tiny_server()
    turns = server.registry.turns("tiny")
    mine = Job(99, "tab-a", "generate", address=A.address)
    classmate = Job(96, "tab-a2", "generate", address=A.address)
    other = Job(98, "tab-b", "generate", address=B.address)
    holder = Job(97, "tab-a", "generate", address=A.address)
    assert turns.hold(holder, 1.0)
    try:
        waits = [turns.wait(mine, float("inf"))]
        next(waits[0])  # queued
        assert not turns.others_waiting(holder)
        waits.append(turns.wait(classmate, float("inf")))
        next(waits[1])
        assert turns.others_waiting(holder) and turns.others_waiting(mine)
        waits.pop().close()
        assert not turns.others_waiting(holder)
        waits.append(turns.wait(other, float("inf")))
        next(waits[1])
        assert turns.others_waiting(holder) and turns.others_waiting(mine)
    finally:
        for w in waits:
            w.close()
        turns.release(holder)
    assert turns.waiting == 0 and not turns.busy


def test_vs_plain_asks_before_every_pair():
    from helpers import tiny_registry

    from hispec.engine.config import preset
    from hispec.evaluation.compare import vs_plain

    lm = tiny_registry().get("tiny")
    ids = lm.encode("hi", chat=True)
    config = preset("hispec", 2, 5, 2, 3, 6).resolve_for(lm.ee)

    def measure(yield_to):
        out = [i for i in vs_plain(lm, ids, config, 6, 3, threading.Event(), yield_to=yield_to) if isinstance(i, dict)]
        return out[-1]["vs_plain"]

    asked = []
    after_one = measure(lambda: asked.append(1) or len(asked) > 1)  # nobody waits before pair 1; then someone does
    assert after_one["runs"] == 1 and after_one["yielded"] == 2 and after_one["cut"] == 0
    assert len(asked) == 2, "asked before the first pair and after it"
    before_any = measure(lambda: True)
    assert before_any["runs"] == 0 and before_any["yielded"] == 3 and before_any["cut"] == 0
    assert "waiting for the model" in before_any["verdict"]
    assert measure(None)["runs"] == 3 and measure(lambda: False)["yielded"] == 0
