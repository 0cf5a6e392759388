"""Fair to every visitor (serving): a Stop that cannot be lost, however early it comes; turns of the
model shared out between visitors; a time limit that counts a job's own time, not its wait; an
ending that says what ended it; an overall rate figure that refuses only those over their share."""

from __future__ import annotations

import html
import math
import re
import threading
import time

import pytest
from helpers import slow, tiny_server, wait_until

from hispec.engine.events import DoneEvent
from hispec.errors import ConfigError
from hispec.serving import jobs as jobs_module
from hispec.serving.api import GenerateRequest
from hispec.serving.caller import Caller
from hispec.serving.jobs import Job, Jobs
from hispec.serving.addresses.ratelimit import RateLimits
from hispec.serving.turns import Turns
from hispec.serving.updates import Ended, Output

ME, OTHER = Caller("tab-1", "10.0.0.1"), Caller("tab-2", "10.0.0.2")


def gen(prompt="hi", max_new=8) -> dict:
    return {"prompt": prompt, "method": "hispec", "policy": "fixed", "draft_layer": 2, "verify_layer": 5,
            "draft_len": 2, "verify_threshold": 3, "max_new_tokens": max_new, "chat": True}


def events_of(updates) -> list:
    return [item for u in updates if isinstance(u, Output) for item in u.items if not isinstance(item, dict)]


def done_of(updates) -> DoneEvent | None:
    return next((e for e in reversed(events_of(updates)) if isinstance(e, DoneEvent)), None)


def in_thread(fn):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    thread.start()
    return thread, box


# ---- a Stop that cannot be lost ----------------------------------------------------------------------
def test_a_stop_at_0_ms_after_the_request_is_never_lost():
    server = tiny_server()
    stream = server.submit(ME, GenerateRequest, gen(max_new=200))
    server.stop(ME, ("generate",))  # at 0 ms: nothing of the request has been checked or registered yet
    updates = list(stream)
    assert updates[-1] == Ended("stopped", "Stopped before the generation started.")
    assert not events_of(updates), "the stopped request never ran"
    assert server.jobs.of() == [] and not server.registry.turns("tiny").busy


def test_a_stop_reaches_a_request_that_arrived_before_it_and_reached_serving_after():
    """Under load a request can reach serving long after its HTTP call arrived (Gradio's queue, the
    handler's first update): the Stop sent in between applies to it."""
    server = tiny_server()
    arrived = time.monotonic()
    server.stop(Caller("tab-1", "10.0.0.1", arrived + 0.001), ("generate",))
    updates = list(server.submit(Caller("tab-1", "10.0.0.1", arrived), GenerateRequest, gen(max_new=50)))
    assert updates[-1] == Ended("stopped", "Stopped before the generation started.")
    assert not events_of(updates)


def test_a_request_made_after_a_stop_runs_and_a_stop_of_another_kind_or_tab_does_not_reach_it():
    """Control: a remembered Stop ends only what was submitted before it (or just after it, serving.jobs.AHEAD_S),
    of its kinds and session."""
    server = tiny_server()
    server.stop(Caller(ME.session, ME.address, time.monotonic() - 2 * jobs_module.AHEAD_S), ("generate",))
    server.stop(OTHER)
    server.stop(Caller(ME.session, ME.address, time.monotonic() + 60), ("bench",))  # a later Stop, of benchmarks
    updates = list(server.submit(ME, GenerateRequest, gen(max_new=6)))
    assert updates[-1] == Ended("done", "Done.")
    assert done_of(updates).token_ids


def test_a_stop_that_overtook_its_request_stops_it_and_only_it():
    """gradio_client's submit() returns before the request is sent: a Stop sent at once may reach the
    server first and find nothing. It ends the first request of its session arriving within AHEAD_S
    after it; a second one, a later one, another tab's, or one after a Stop that found its job, run."""
    now = [100.0]
    jobs = Jobs(clock=lambda: now[0])
    assert jobs.stop("tab", ("generate",), at=100.0) == 0  # found nothing
    assert not jobs.open("other-tab", "generate", submitted=100.2).stop.is_set()
    assert not jobs.open("tab", "bench", submitted=100.2).stop.is_set()
    overtaken = jobs.open("tab", "generate", submitted=100.3)
    assert overtaken.reason == "stopped" and overtaken.overtaken_by == pytest.approx(0.3)  # the request it overtook
    assert not jobs.open("tab", "generate", submitted=100.4).stop.is_set()  # used up: only the first
    jobs.stop("tab", ("generate",), at=101.0)  # finds the one running: nothing is kept for later
    assert not jobs.open("tab", "generate", submitted=101.1).stop.is_set()
    jobs.stop("meant", ("generate",), at=101.5)  # found nothing: its request is not registered yet
    assert jobs.open("meant", "generate", submitted=101.4).reason == "stopped"  # sent before it: the one meant
    assert not jobs.open("meant", "generate", submitted=101.6).stop.is_set()  # so it overtook none
    jobs.stop("late", None, at=102.0)
    now[0] = 104.0
    assert not jobs.open("late", "generate", submitted=102.0 + jobs_module.AHEAD_S + 0.1).stop.is_set()


def test_a_request_stopped_by_a_stop_that_overtook_it_says_so():
    """The client can tell it from its own Stop: the ending names the Stop that found nothing and says to send it again."""
    server = tiny_server()
    assert server.stop(ME, ("generate",)) == 0  # in-process: it overtakes nothing
    assert done_of(list(server.submit(ME, GenerateRequest, gen(max_new=6)))).token_ids
    assert server.stop(Caller(ME.session, ME.address, time.monotonic()), ("generate",)) == 0  # over HTTP
    updates = list(server.submit(ME, GenerateRequest, gen(max_new=6)))
    assert updates[-1].outcome == "stopped" and "a Stop of this session that found nothing running arrived" in \
        updates[-1].message and "send it again" in updates[-1].message, updates[-1]
    assert done_of(list(server.submit(ME, GenerateRequest, gen(max_new=6)))).token_ids  # the next one runs


def test_remembered_stops_cost_bounded_memory(monkeypatch):
    now = [0.0]
    jobs = Jobs(clock=lambda: now[0])
    monkeypatch.setattr(jobs_module, "MAX_REMEMBERED", 100)
    for i in range(1000):  # a flood of Stops from fresh sessions
        jobs.stop(f"tab-{i}", ("generate",))
    assert jobs.remembered() == 100
    assert jobs.open("tab-999", "generate", submitted=-1.0).stop.is_set()  # the newest are kept
    now[0] = jobs_module.REMEMBER_S + 1
    jobs.stop("late", ("generate",))
    assert jobs.remembered() == 1  # the old ones are forgotten


# ---- the model's turns shared out between visitors ---------------------------------------------------
def test_a_visitors_extra_jobs_queue_behind_other_visitors():
    turns = Turns()
    a1, a2, a3 = (Job(i, f"tab-a{i}", "generate", address="10.0.0.1") for i in (1, 2, 3))  # one address, 3 tabs
    b1, c1 = Job(4, "tab-b", "generate", address="10.0.0.2"), Job(5, "tab-c", "generate", address="10.0.0.3")
    assert turns.hold(a1, 1.0)
    waits = {job: turns.wait(job, math.inf, step_s=0.01) for job in (a2, a3, b1, c1)}  # in this order
    for waiting in waits.values():
        next(waiting)  # queued, its place reported
    assert turns.order() == [b1, c1, a2, a3]
    turns.release(a1)
    with pytest.raises(StopIteration):
        next(waits[b1])  # the next turn is the other visitor's
    for waiting in waits.values():
        waiting.close()


def test_one_visitors_long_jobs_beside_anothers_short_one():
    """Three long requests from one address (three tabs), then a short one from another: the model is
    shared round by round, so the short one ends first, not after the first long one (let alone all
    three); the three tabs are three visitors of one address now (serving.turns), taking that address's
    turns round by round among themselves, so their equal long jobs may end in any order (CI once saw
    heavy-2 before heavy-1); no time limit is spent waiting: the limit is twice
    a long request's own time, measured here first (so it holds on a slow or busy host), and the
    last long one waits about twice that before its last turn."""
    measure = tiny_server(max_seconds=600.0)
    with slow(measure.registry.get("tiny"), 0.02):
        t0 = time.monotonic()
        assert list(measure.submit(Caller("alone", "10.0.0.1"), GenerateRequest, gen(max_new=16)))[-1].ok
        own_s = time.monotonic() - t0
    server = tiny_server(max_seconds=2 * own_s)
    lm = server.registry.get("tiny")
    turns = server.registry.turns("tiny")
    finished = []

    def one(caller, max_new):
        out = list(server.submit(caller, GenerateRequest, gen(max_new=max_new)))
        finished.append(caller.session)
        return out

    with slow(lm, 0.02):
        heavy = [in_thread(lambda: one(Caller("heavy-0", "10.0.0.9"), 16))]
        wait_until(lambda: turns.busy)
        for i in (1, 2):
            heavy.append(in_thread(lambda i=i: one(Caller(f"heavy-{i}", "10.0.0.9"), 16)))
            wait_until(lambda i=i: turns.waiting == i)
        light, box = in_thread(lambda: one(Caller("light", "10.0.0.5"), 4))
        light.join(60)
        for thread, _ in heavy:
            thread.join(60)
    assert finished[0] == "light" and sorted(finished[1:]) == ["heavy-0", "heavy-1", "heavy-2"], finished
    assert box["out"][-1] == Ended("done", "Done."), box["out"][-1]
    assert all(b["out"][-1] == Ended("done", "Done.") for _, b in heavy), [b["out"][-1] for _, b in heavy]


def test_a_turn_passes_to_another_visitor_only_and_comes_back():
    turns = Turns()
    a1, a2 = Job(1, "tab-a", "generate", address="10.0.0.1"), Job(2, "tab-a", "generate", address="10.0.0.1")
    b1 = Job(3, "tab-b", "generate", address="10.0.0.2")
    assert turns.hold(a1, 1.0)
    wait_a2 = turns.wait(a2, math.inf, step_s=0.01)
    next(wait_a2)
    assert not turns.pass_turn(a1)  # only the visitor's own job (its session's) waits: a1 keeps the model
    wait_b1 = turns.wait(b1, math.inf, step_s=0.01)
    next(wait_b1)
    passing, box = in_thread(lambda: turns.pass_turn(a1, step_s=0.01))
    with pytest.raises(StopIteration):
        while True:
            next(wait_b1)  # b1 gets the model while a1 waits for it back
    assert passing.is_alive() and turns.order() == [a1, a2]  # a1 keeps its place before its visitor's a2
    turns.release(b1)
    passing.join(5)
    assert box["out"] is True and not passing.is_alive()
    assert turns.order() == [a2]
    wait_a2.close()


def test_a_shared_turn_changes_no_token_and_no_speed_figure():
    """A long generation that passed its turn to a short one of another visitor: its tokens are what it
    gives alone, and its own elapsed time leaves out the time the other one held the model."""
    server = tiny_server(max_seconds=30.0)
    lm = server.registry.get("tiny")
    turns = server.registry.turns("tiny")
    alone = done_of(list(server.submit(ME, GenerateRequest, gen("a long one", max_new=30))))
    with slow(lm, 0.02):
        t0 = time.monotonic()
        long_run, long_box = in_thread(lambda: list(server.submit(ME, GenerateRequest, gen("a long one", max_new=30))))
        wait_until(lambda: turns.busy)
        time.sleep(0.3)
        short_box = {"out": list(server.submit(OTHER, GenerateRequest, gen(max_new=6)))}
        long_run.join(60)
        long_wall = time.monotonic() - t0
    assert short_box["out"][-1] == Ended("done", "Done.") and not long_run.is_alive()
    shared, short = done_of(long_box["out"]), done_of(short_box["out"])
    assert shared.token_ids == alone.token_ids
    # the long one's own clock left out (most of) the time the short one computed on the model
    assert long_wall - shared.t > 0.8 * short.t > 0, (shared.t, long_wall, short.t)


def test_the_time_limit_counts_the_jobs_own_time_not_its_wait():
    server = tiny_server(max_seconds=0.5)
    turns = server.registry.turns("tiny")
    holder = Job(0, "another-visitor", "generate")
    assert turns.hold(holder, 1.0)
    releaser = threading.Timer(1.2, turns.release, (holder,))  # the model stays busy for 1.2 s
    releaser.start()
    try:
        updates = list(server.submit(ME, GenerateRequest, gen(max_new=4)))
    finally:
        releaser.join()
    assert updates[-1] == Ended("done", "Done."), updates[-1]
    assert done_of(updates).token_ids


# ---- an ending that says what ended it ---------------------------------------------------------------
def test_the_time_limit_and_a_stop_each_end_with_their_own_reason_and_message():
    """The engine sees both as its stop flag: serving says which it was, in the stream's end, the
    DoneEvent's reason (the API's finish_reason) and the page's status and stats."""
    from ui.generate_view import GenerateView

    server = tiny_server(max_seconds=0.4)
    with slow(server.registry.get("tiny"), 0.03):
        cut = list(server.submit(ME, GenerateRequest, gen(max_new=200)))
    assert cut[-1] == Ended("time limit", "Cut at this server's time limit of 0.4 s on the model per request.")
    assert done_of(cut).reason == "time_limit" and 0 < len(done_of(cut).token_ids) < 200
    page = GenerateView("tiny")
    shown = [page.update(u) for u in cut][-1]
    status, stats = html.unescape(shown["status"]), shown["stats"]
    assert "Cut at this server's time limit of 0.4 s on the model per request, after " in status, status
    assert re.search(r"stopped by</td><td>time limit<", stats), stats

    server = tiny_server(max_seconds=60)
    stopped = []
    with slow(server.registry.get("tiny"), 0.03):
        for update in server.submit(OTHER, GenerateRequest, gen(max_new=200)):
            stopped.append(update)
            if events_of([update]):
                server.stop(OTHER)
    assert stopped[-1] == Ended("stopped", "Stopped.")
    assert done_of(stopped).reason == "stopped" and len(done_of(stopped).token_ids) < 200


# ---- the overall figure: a fair share, not a lock-out lever ------------------------------------------
def test_addresses_that_spent_the_overall_figure_cannot_lock_out_a_new_visitor():
    rates = RateLimits(per_client=12, overall=60, window_s=60)
    for i in range(60):  # 8 addresses spend the minute's 60 between them (7 or 8 each)
        rates.admit(f"10.0.0.{i % 8}", now=i * 0.1)
    rates.admit("10.9.9.9", now=7.0)  # a new visitor is admitted
    with pytest.raises(ConfigError, match=r"rate limit: the server is busy \(61 requests from everyone in the "
                                          r"last minute, 60 or more\) and this address has had 8, its fair share of "
                                          r"6.67 among 9 addresses; try again in 53 s"):
        rates.admit("10.0.0.0", now=7.1)
    rates.admit("10.0.0.0", now=60.5)  # the first six left the window: 55 in it, under the figure


def test_the_overall_figure_at_the_server_refuses_the_heavy_address_not_the_new_one():
    server = tiny_server(global_rate_per_minute=3)
    heavy, newcomer = Caller("h", "10.0.0.7"), Caller("n", "10.0.0.8")
    outcomes = [list(server.submit(heavy, GenerateRequest, gen(max_new=2)))[-1].outcome for _ in range(4)]
    assert outcomes == ["done", "done", "done", "refused"]
    assert list(server.submit(newcomer, GenerateRequest, gen(max_new=2)))[-1].outcome == "done"


def test_the_model_is_handed_on_before_the_last_update_whatever_the_consumer_does(monkeypatch):
    """A Stop lands just after a job took the model's turn: it ends "before it started". A consumer that
    stops iterating at the last update without closing the stream (an API answer raising an error keeps
    it alive) must not keep the turn, nor the job registered: both are given back before that update."""
    server = tiny_server()
    turns = server.registry.turns("tiny")
    original = Turns.wait

    def racing(self, job, deadline, step_s=0.5):
        held = yield from original(self, job, deadline, step_s)
        job.end("stopped")  # the Stop arrives right after the turn was taken
        return held

    monkeypatch.setattr(Turns, "wait", racing)
    stream = server.submit(Caller("tab", "10.0.0.1"), GenerateRequest, gen(max_new=4))
    last = None
    for update in stream:  # the stream is kept referenced and never closed
        last = update
        if isinstance(update, Ended):
            break
    assert last == Ended("stopped", "Stopped before the generation started."), last
    assert not turns.busy, "the stopped job still holds the model's turn"
    assert server.jobs.of() == []


def test_a_stream_finalised_by_the_collector_inside_a_jobs_own_lock_does_not_deadlock(monkeypatch):
    """Seen in a CI-like run: the garbage collector finalised an abandoned update stream (its `finally`
    closes its job) while the same thread held the jobs' lock inside Jobs.open; with a plain Lock that thread
    waited for itself and every request after it. Here the finaliser is made to run at that very moment."""
    jobs = Jobs()
    first = jobs.open("a", "generate")
    real_job = jobs_module.Job

    def job_then_finaliser(*args, **kwargs):  # as the collector does, in the middle of Jobs.open
        made = real_job(*args, **kwargs)
        jobs.close(first)
        return made

    monkeypatch.setattr(jobs_module, "Job", job_then_finaliser)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (jobs.open("b", "generate"), done.set()), daemon=True)
    worker.start()
    assert done.wait(5), "Jobs.open waited for its own lock: a finaliser inside it deadlocks the server"
    assert [j.session for j in jobs.of()] == ["b"]
