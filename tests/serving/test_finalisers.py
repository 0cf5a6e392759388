"""A stream finalised by the garbage collector inside serving's own (re-entrant) locks.

The collector finalises an abandoned update stream in whatever thread allocates next, between any two
bytecodes, and the stream's `finally` leaves the model's queue, gives back its turn and forgets its job:
it changes serving's tables while the same thread may be half-way through iterating one of them. Each
test here makes that finaliser run at such a moment (the first time serving reads a given job after it
is armed) and checks that the table's owner still does its work.
"""

from __future__ import annotations

import math
import threading

import pytest

from hispec.serving import jobs as jobs_module
from hispec.serving.jobs import STOPPED, Job, Jobs
from hispec.serving.turns import Turns


class Collected(Job):
    """A job at which the collector runs a finaliser: the first time serving reads this job's `who` or
    `session`, or hashes it, after `at_next_read(finaliser)`."""

    def at_next_read(self, finaliser) -> None:
        self.__dict__["_finaliser"] = finaliser

    def _collect(self) -> None:
        finaliser = self.__dict__.pop("_finaliser", None)
        if finaliser is not None:
            finaliser()

    def __getattribute__(self, name):
        if name in ("who", "session"):
            object.__getattribute__(self, "_collect")()
        return object.__getattribute__(self, name)

    def __hash__(self):
        self._collect()
        return object.__hash__(self)


def queued(turns: Turns, job: Job):
    """`job` waiting in `turns`: its wait, advanced to its first place (an update stream's generator)."""
    waiting = turns.wait(job, math.inf, step_s=0.01)
    next(waiting)
    return waiting


def took_turn(waiting) -> bool:
    """Drive a wait to its end: True once its job holds the model."""
    try:
        while True:
            next(waiting)
    except StopIteration as end:
        return bool(end.value)


def test_release_hands_the_model_on_when_a_stream_is_finalised_inside_it():
    """Seen in-process: "dictionary changed size during iteration" in Turns.release, after the model's turn
    was cleared but before the waiting jobs were told; the worker's release then never gave back the lease."""
    turns = Turns()
    holder = Job(1, "tab-h", "generate", address="10.0.0.1")
    gone = Job(2, "tab-g", "generate", address="10.0.0.2")
    next_one = Collected(3, "tab-n", "generate", address="10.0.0.3")
    assert turns.hold(holder, 1.0)
    abandoned, waiting = queued(turns, gone), queued(turns, next_one)
    next_one.at_next_read(abandoned.close)  # the collector closes the abandoned stream: it leaves the queue
    turns.release(holder)
    assert not turns.busy and turns.order() == [next_one]
    assert took_turn(waiting), "the next job never got the model"
    assert turns.order() == [] and turns.waiting == 0
    turns.release(next_one)
    assert not turns.busy


def test_the_order_is_read_while_a_stream_is_finalised_inside_it():
    """Seen in-process: "deque mutated during iteration" in Turns._order (a request fails)."""
    turns = Turns()
    holder = Job(1, "tab-h", "generate", address="10.0.0.1")
    first = Collected(2, "tab-f", "generate", address="10.0.0.2")
    gone, last = Job(3, "tab-g", "generate", address="10.0.0.3"), Job(4, "tab-l", "generate", address="10.0.0.4")
    assert turns.hold(holder, 1.0)
    waits = [queued(turns, job) for job in (first, gone, last)]
    first.at_next_read(waits[1].close)
    assert turns.order() == [first, last]  # the one that left is not in it
    turns.release(holder)
    assert took_turn(waits[0])
    waits[2].close()


def test_a_turn_passes_while_a_stream_is_finalised_inside_pass_turn():
    """Seen in-process: "deque mutated during iteration" in Turns.pass_turn (the generation fails)."""
    turns = Turns()
    holder = Job(1, "tab-h", "generate", address="10.0.0.1")
    mine = Collected(2, "tab-h", "generate", address="10.0.0.1")  # the holder's visitor's next job (its session's)
    gone, other = Job(3, "tab-g", "generate", address="10.0.0.2"), Job(4, "tab-o", "generate", address="10.0.0.3")
    assert turns.hold(holder, 1.0)
    waits = {job: queued(turns, job) for job in (mine, gone, other)}
    mine.at_next_read(waits[gone].close)
    box: dict = {}

    def passing():
        try:
            box["passed"] = turns.pass_turn(holder, step_s=0.01)
        except BaseException as exc:  # noqa: BLE001  shown below, with its message
            box["error"] = exc

    thread = threading.Thread(target=passing, daemon=True)
    thread.start()
    thread.join(0.5)
    assert "error" not in box, f"pass_turn failed: {box.get('error')!r}"
    assert took_turn(waits[other]), "the other visitor never got its turn"
    turns.release(other)
    thread.join(5)
    assert "error" not in box and box.get("passed") is True, box
    assert turns.order() == [mine]  # the holder has its turn back; its visitor's next job waits behind it
    waits[mine].close()
    turns.release(holder)


@pytest.fixture
def collected_jobs(monkeypatch):
    """Jobs whose jobs are Collected: a1, b1 (another session), a2, in that order."""
    monkeypatch.setattr(jobs_module, "Job", Collected)
    jobs = Jobs()
    a1, b1, a2 = jobs.open("a", "generate"), jobs.open("b", "generate"), jobs.open("a", "generate")
    return jobs, a1, b1, a2


def test_a_stop_reaches_every_job_while_a_stream_is_finalised_inside_it(collected_jobs):
    """Seen in-process: "dictionary changed size during iteration" in Jobs.stop: the Stop was lost
    (a 500 at the edge)."""
    jobs, a1, b1, a2 = collected_jobs
    a1.at_next_read(lambda: jobs.close(b1))  # b1's stream, abandoned, is finalised
    assert jobs.stop("a") == 2
    assert a1.reason == a2.reason == STOPPED and b1.reason is None
    assert jobs.of() == [a1, a2]


def test_the_jobs_of_a_session_are_listed_while_a_stream_is_finalised_inside_it(collected_jobs):
    """Seen in-process: "dictionary changed size during iteration" in Jobs.of."""
    jobs, a1, b1, a2 = collected_jobs
    a1.at_next_read(lambda: jobs.close(b1))
    assert jobs.of("a") == [a1, a2]
    assert jobs.of() == [a1, a2]


class Failing(Turns):
    def release(self, job):
        raise RuntimeError("dictionary changed size during iteration")


class Leases:
    def __init__(self):
        self.given_back: list[str] = []

    def release(self, name: str) -> None:
        self.given_back.append(name)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the worker re-raises it
def test_a_failed_turn_release_still_gives_back_the_lease_and_ends_the_stream():
    """What the failure in Turns.release did next: the model's lease leaked, and the worker never told the
    stream its work had ended (the answer reached its client at the time limit plus grace)."""
    from hispec.serving.hold import Hold

    leases, ended = Leases(), threading.Event()
    hold = Hold(leases, Job(1, "tab", "generate"))
    hold.name, hold.turns = "tiny", Failing()
    with pytest.raises(RuntimeError):
        hold.release()
    assert leases.given_back == ["tiny"]
    worker = Hold(leases, Job(2, "tab", "generate"))
    worker.name, worker.turns = "tiny", Failing()
    worker.start(lambda: None, ended.set)
    assert ended.wait(5), "the stream never heard that the work ended"
    for thread in threading.enumerate():  # its failure is reported within this test (filtered above)
        if thread.name == "hispec-generate-2":
            thread.join(5)
    assert leases.given_back == ["tiny", "tiny"]
