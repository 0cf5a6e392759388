"""A class is many visitors (issue 60, item 5): a teacher opens the app and thirty students open it at once,
all behind one school network address. Each student (a session within the address) is a visitor: its own rate
figure and its own turns. The address still bounds what one client can do by rotating session hashes (its own,
larger figure), and turns are fair between addresses first, so a class cannot crowd out a visitor on an address
of its own. The defaults let a class of 30 in."""

from __future__ import annotations

import math
import re
import threading

import pytest
from helpers import tiny_server, wait_until

from hispec.engine.events import DoneEvent
from hispec.errors import ConfigError
from hispec.serving.addresses.ratelimit import RateLimits
from hispec.serving.api import GenerateRequest
from hispec.serving.caller import Caller
from hispec.serving.jobs import Job
from hispec.serving.limits import Limits
from hispec.serving.turns import Turns
from hispec.serving.updates import Ended, Output

SCHOOL = "192.0.2.10"  # one school network: every student's address
CLASS = 30
PAGE_JOINS_PER_RUN = 3  # a page run joins Gradio's queue three times: the run and its two follow-ups (serving.edge)


def gen(prompt: str, max_new: int = 6) -> dict:
    return {"prompt": prompt, "method": "hispec", "policy": "fixed", "draft_layer": 2, "verify_layer": 5,
            "draft_len": 2, "verify_threshold": 3, "max_new_tokens": max_new, "chat": True}


def token_ids(updates) -> list[int] | None:
    items = [item for u in updates if isinstance(u, Output) for item in u.items]
    done = next((e for e in reversed(items) if isinstance(e, DoneEvent)), None)
    return None if done is None else done.token_ids


# ---- the rate limits: per visitor (a session within an address), and per address ------------------------
def test_each_session_within_one_address_has_its_own_rate_figure():
    rates = RateLimits(per_client=2, per_address=100, window_s=60)
    for student in range(CLASS):
        for _ in range(2):
            rates.admit(SCHOOL, f"student-{student}", now=1.0)  # 60 requests from one address: all admitted
    with pytest.raises(ConfigError, match=r"^rate limit: at most 2 requests per minute from one visitor \(a browser "
                                          r"tab or API session\); try again in 59 s$"):
        rates.admit(SCHOOL, "student-0", now=2.0)
    rates.admit(SCHOOL, "student-0", now=61.5)  # its requests left the window


def test_a_client_rotating_sessions_is_bounded_by_its_address():
    rates = RateLimits(per_client=12, per_address=5, window_s=60)
    for i in range(5):
        rates.admit("10.6.6.6", f"fresh-{i}", now=float(i))
    with pytest.raises(ConfigError, match=r"^rate limit: at most 5 requests per minute from one address, its visitors "
                                          r"together; try again in 55 s$"):
        rates.admit("10.6.6.6", "fresh-5", now=5.0)
    rates.admit("10.7.7.7", "fresh-5", now=5.0)  # another address is not touched
    assert rates.tracked() == 2 + 5 + 1  # two addresses, their 6 sessions; the refused one is not remembered
    rates.admit("10.6.6.6", "fresh-6", now=60.5)  # the first left the window
    rates.admit("late", "s", now=200.0)
    assert rates.tracked() == 2  # idle addresses and sessions are forgotten


def test_without_a_session_the_address_is_the_visitor():
    """The edge's counts (joins, Stops) have no session they could trust: there the address has the figure."""
    rates = RateLimits(per_client=2, per_address=100)
    rates.admit("10.5.5.5", now=0.0)
    rates.admit("10.5.5.5", now=0.0)
    with pytest.raises(ConfigError, match=r"^rate limit: at most 2 requests per minute from one address; try again"):
        rates.admit("10.5.5.5", now=0.0)


def test_the_overall_fair_share_counts_addresses_not_sessions():
    rates = RateLimits(per_client=10, overall=4, per_address=0, window_s=60)  # sessions remembered: not addresses
    for student in range(3):
        rates.admit(SCHOOL, f"student-{student}", now=0.0)
    rates.admit("10.0.0.2", "alone", now=0.0)  # the minute holds 4: the server is busy
    with pytest.raises(ConfigError, match=r"this address has had 3, its fair share of 2 among 2 addresses"):
        rates.admit(SCHOOL, "student-3", now=1.0)
    rates.admit("10.0.0.3", "newcomer", now=1.0)  # a new address is still let in


# ---- turns: between addresses first, then between an address's visitors ---------------------------------
def queued(turns: Turns, job: Job):
    waiting = turns.wait(job, math.inf, step_s=0.01)
    assert next(waiting) >= 1  # it waits, its place reported
    return waiting


def took(waiting) -> bool:
    try:
        while True:
            next(waiting)
    except StopIteration as end:
        return bool(end.value)


def in_thread(fn):
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    thread.start()
    return thread, box


def test_students_on_one_address_take_turns_round_by_round():
    """A generation passes its turn to a classmate on the same address, and the classmates take it in order."""
    turns = Turns()
    a0, a1, a2 = (Job(i, f"student-{i}", "generate", address=SCHOOL) for i in range(3))
    assert turns.hold(a0, 1.0)
    waits = {job: queued(turns, job) for job in (a1, a2)}
    assert turns.others_waiting(a0)  # the timing pairs of a0's run would give way to a classmate
    passing, box = in_thread(lambda: turns.pass_turn(a0, step_s=0.01))
    assert took(waits[a1]), "the classmate never got the turn"
    assert turns.order() == [a2, a0]  # a0 comes back after every classmate waiting before it
    turns.release(a1)
    assert took(waits[a2])
    turns.release(a2)
    passing.join(5)
    assert box["out"] is True and turns.order() == []
    turns.release(a0)
    assert not turns.busy


def test_one_address_with_many_sessions_does_not_crowd_out_another_address():
    """Thirty sessions of one address wait; a visitor on its own address comes: it is next, and after passing its
    turn it is second, behind one of the class's, every time (a flat order between sessions put it 30th)."""
    turns = Turns()
    students = [Job(i, f"student-{i}", "generate", address=SCHOOL) for i in range(CLASS)]
    alone = Job(99, "at-home", "generate", address="198.51.100.7")
    assert turns.hold(students[0], 1.0)
    waits = {job: queued(turns, job) for job in students[1:]}
    waits[alone] = queued(turns, alone)
    assert turns.order()[0] is alone
    turns.release(students[0])
    assert took(waits[alone])
    for n in range(1, 6):  # alone passes its turn each slice; the class takes one turn between two of its own
        passing, box = in_thread(lambda: turns.pass_turn(alone, step_s=0.01))
        wait_until(lambda: alone in turns.order())
        order = turns.order()
        assert order[:2] == [students[n], alone], [j.session for j in order[:3]]
        assert took(waits[students[n]])
        turns.release(students[n])
        passing.join(5)
        assert box["out"] is True
    turns.release(alone)
    for job in students[6:]:
        waits[job].close()
    assert turns.waiting == 0 and not turns.busy


def test_a_student_who_leaves_gives_the_class_its_turn_not_away():
    """A waiting student who leaves (a Stop, a closed tab): the class keeps its earliest turns (the visitor at home
    sending two requests does not move ahead of the class for it)."""
    turns = Turns()
    a0, a1, a2 = (Job(i, f"student-{i}", "generate", address=SCHOOL) for i in range(3))
    other, other2 = (Job(9 + i, "at-home", "generate", address="198.51.100.7") for i in range(2))
    assert turns.hold(a0, 1.0)
    waits = {job: queued(turns, job) for job in (a1, a2, other, other2)}
    assert turns.order() == [other, a1, other2, a2]
    waits[a1].close()  # a1 had the class's next turn: a2 takes it
    assert turns.order() == [other, a2, other2]
    late = Job(20, "student-late", "generate", address=SCHOOL)
    waits[late] = queued(turns, late)
    assert turns.order() == [other, a2, other2, late]
    for waiting in waits.values():
        waiting.close()
    turns.release(a0)


# ---- the server: a class of 30 on one address, with the default limits -----------------------------------
def class_server():
    """The tiny model's server with this server's default limits on rates and the queue."""
    defaults = Limits()
    return tiny_server(rate_per_minute=defaults.rate_per_minute,
                       address_rate_per_minute=defaults.address_rate_per_minute,
                       global_rate_per_minute=defaults.global_rate_per_minute, queue_size=defaults.queue_size)


def test_a_class_of_30_on_one_address_is_admitted_and_each_gets_its_solo_answer():
    """All thirty wait for the model at once (another visitor holds it until they all queue), none is refused,
    and each answer is the one its prompt gets alone."""
    prompts = [f"student {i} asks" for i in range(CLASS)]
    alone = tiny_server()
    solo = [token_ids(alone.submit(Caller(f"solo-{i}", f"10.1.0.{i}"), GenerateRequest, gen(p)))
            for i, p in enumerate(prompts)]
    server = class_server()
    turns = server.registry.turns("tiny")
    holder = Job(0, "teacher", "generate", address="203.0.113.1")
    assert turns.hold(holder, 1.0)
    out: dict[int, list] = {}
    threads = [threading.Thread(target=lambda i=i: out.setdefault(i, list(server.submit(
        Caller(f"student-{i}", SCHOOL), GenerateRequest, gen(prompts[i])))), daemon=True) for i in range(CLASS)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: turns.waiting == CLASS or any(not t.is_alive() for t in threads))
        assert turns.waiting == CLASS, [out[i][-1] for i in sorted(out)][:3]  # all thirty queued at once
    finally:
        turns.release(holder)
        for thread in threads:
            thread.join(60)
    endings = [out[i][-1] for i in range(CLASS)]
    assert endings == [Ended("done", "Done.")] * CLASS, [e for e in endings if not e.ok][:3]
    assert [token_ids(out[i]) for i in range(CLASS)] == solo
    assert not turns.busy and server.jobs.of() == []


def test_a_client_rotating_sessions_on_one_address_is_refused_at_the_address_figure():
    server = tiny_server(rate_per_minute=12, address_rate_per_minute=4)
    endings = [list(server.submit(Caller(f"rotated-{i}", "10.6.6.6"), GenerateRequest, gen("hi", 2)))[-1]
               for i in range(5)]
    assert [e.outcome for e in endings] == ["done"] * 4 + ["refused"]
    assert re.fullmatch(r"Rate limit: at most 4 requests per minute from one address, its visitors together; try "
                        r"again in \d+ s", endings[-1].message), endings[-1]


def test_the_defaults_let_a_class_of_30_in(monkeypatch):
    """Sized for a class of 30 behind one address making two runs each in a minute (and as much from everyone
    else beside it), on a Space and off it."""
    runs = 2
    off_spaces = Limits.from_env({})
    monkeypatch.setenv("SPACE_ID", "someone/hispec")
    for limits in (Limits(), off_spaces, Limits.from_env({})):
        assert limits.rate_per_minute >= runs  # each student
        assert limits.address_rate_per_minute >= CLASS * runs  # the class together
        assert limits.global_rate_per_minute >= 2 * limits.address_rate_per_minute  # its fair share beside others
        assert limits.queue_size >= CLASS + 1  # every student's run waiting at once, and the teacher's
        assert limits.join_rate_per_minute >= CLASS * runs * PAGE_JOINS_PER_RUN  # the edge's count, per address
        assert limits.stop_rate_per_minute >= CLASS * runs  # every student stopping each run


def test_gradio_has_threads_for_a_class_waiting_in_serving():
    """Each waiting run's update stream holds one of Gradio's handler threads: with serving's queue full and
    the seats taken, the pool must hold them all (Gradio's default of 40 held fewer than a full default queue
    and its seats), else the rest wait in Gradio's queue where serving's places and limits never reach."""
    import app
    from hispec.serving.limits import Limits
    from hispec.serving.turns import Turns

    server = tiny_server()
    threads = app.launch_kwargs(server)["max_threads"]
    assert threads >= Limits().queue_size + 8 + 3 * 2  # queued, the seats, a class's follow-ups
    assert threads >= server.limits.queue_size + Turns(8).seats
