"""The request path (serving.session.Server): admission, the model's turn (in arrival order
between newcomers), the worker, Stop of queued and running jobs, the time limit on a running job,
clients that leave, and failures that end only their own request. (Fair turns between visitors, the
time limit not counting the wait, and Stops made before a job registered: test_fair.py.)"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from helpers import EOS, char_tokenizer, slow, tiny_model, tiny_server
from helpers import wait_until as _wait_until

from hispec.runs.meter import METER
from hispec.engine.config import preset
from hispec.engine.events import DoneEvent
from hispec.errors import HiSpecError
from hispec.runs.runner import run
from hispec.model.early_exit import EarlyExitModel
from hispec.model.loading import LoadedModel
from hispec.serving.api import BeliefsRequest, CompareRequest, CostsRequest, GenerateRequest
from hispec.serving.caller import Caller
from hispec.serving.jobs import Job
from hispec.serving.limits import Limits
from hispec.serving.registry import ModelRegistry
from hispec.serving.session import Server
from hispec.serving.updates import Ended, Output, Status
from hispec.text import Detokenizer

ME, OTHER = Caller("tab-1", "10.0.0.1"), Caller("tab-2", "10.0.0.2")


def tiny_lm(name="tiny") -> LoadedModel:
    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    return LoadedModel(name, model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t")


@pytest.fixture
def server():
    registry = ModelRegistry()
    registry.add("tiny", tiny_lm())
    return Server(registry, Limits(rate_per_minute=0, global_rate_per_minute=0, allowed_models=("tiny",)),
                  default_model="tiny", throttle_s=0.0)


@contextlib.contextmanager
def held_by_another(registry, name="tiny"):
    """Another visitor's job holds the model's turn meanwhile."""
    holder = Job(0, "another-visitor", "generate")
    assert registry.turns(name).hold(holder, 1.0)
    try:
        yield
    finally:
        registry.turns(name).release(holder)


def one_model_server(**limits) -> Server:
    registry = ModelRegistry()
    registry.add("tiny", tiny_lm())
    return Server(registry, Limits(rate_per_minute=0, allowed_models=("tiny",), **limits), throttle_s=0.0)


def gen(prompt="hi", max_new=8, **kw) -> dict:
    return {"prompt": prompt, "method": "hispec", "policy": "fixed", "draft_layer": 2, "verify_layer": 5,
            "draft_len": 2, "verify_threshold": 3, "max_new_tokens": max_new, "chat": True, **kw}


def events_of(updates) -> list:
    return [item for u in updates if isinstance(u, Output) for item in u.items if not isinstance(item, dict)]


def done_of(updates) -> DoneEvent | None:
    return next((e for e in reversed(events_of(updates)) if isinstance(e, DoneEvent)), None)


def in_thread(fn):
    box = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", fn()), daemon=True)
    thread.start()
    return thread, box


def wait_until(condition, timeout=10.0):
    _wait_until(condition, timeout)


def expected_ids(lm, prompt, max_new):
    config = preset("autoregressive", max_new_tokens=max_new, policy="fixed")
    return run(lm.ee, lm.encode(prompt), config, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer)).token_ids


# ---- the stream ------------------------------------------------------------------------------------
def test_a_generation_streams_its_events_and_ends_done(server):
    updates = list(server.submit(ME, GenerateRequest, gen(max_new=12)))
    assert isinstance(updates[-1], Ended) and updates[-1].outcome == "done" and updates[-1].ok
    assert sum(isinstance(u, Ended) for u in updates) == 1, "exactly one end, the last update"
    lm = server.registry.get("tiny")
    assert list(done_of(updates).token_ids) == expected_ids(lm, "hi", 12)
    assert not server.registry.turns("tiny").busy and server.registry.in_use("tiny") == 0


def test_requests_take_turns_in_arrival_order(server):
    """Waiting requests get the model in the order they came. The waiters need one turn each (one token:
    the prefill, no round to pass the model on at), so they finish in the order of their turns; the
    first request may pass its turn on between its rounds (round-by-round sharing), so it may end anywhere."""
    lm = server.registry.get("tiny")
    finished = []

    def one(i):
        out = list(server.submit(Caller(f"tab-{i}", f"10.0.1.{i}"), GenerateRequest, gen(max_new=3 if i == 0 else 1)))
        finished.append(i)
        return out

    with slow(lm, 0.02):
        first, _ = in_thread(lambda: one(0))
        wait_until(lambda: server.registry.turns("tiny").busy)
        threads = []
        for i in (1, 2, 3):
            threads.append(in_thread(lambda i=i: one(i)))
            wait_until(lambda i=i: server.registry.turns("tiny").waiting == i)
        for t, _ in [(first, None), *threads]:
            t.join(30)
    assert sorted(finished) == [0, 1, 2, 3] and [i for i in finished if i] == [1, 2, 3]


def test_a_waiting_request_says_its_place():
    server = one_model_server()
    turns = server.registry.turns("tiny")
    with held_by_another(server.registry):
        stream = server.submit(ME, GenerateRequest, gen())
        status = next(u for u in stream if isinstance(u, Status) and "Waiting" in u.text)
        assert status.text.startswith("Waiting for the model: 1 request ahead")
        server.stop(ME)
        assert list(stream)[-1] == Ended("stopped", "Stopped before the generation started.")
    assert not turns.busy and turns.waiting == 0


# ---- stop -------------------------------------------------------------------------------------------
def test_stop_of_a_queued_job_ends_it_at_once_and_it_never_runs(server):
    lm = server.registry.get("tiny")
    with slow(lm, 0.02):
        running, box = in_thread(lambda: list(server.submit(OTHER, GenerateRequest, gen(max_new=40))))
        wait_until(lambda: server.registry.turns("tiny").busy)
        queued, qbox = in_thread(lambda: list(server.submit(ME, GenerateRequest, gen(max_new=40))))
        wait_until(lambda: server.registry.turns("tiny").waiting == 1)
        t0 = time.monotonic()
        assert server.stop(ME, ("generate",)) == 1
        queued.join(5)
        assert time.monotonic() - t0 < 2, "a queued job ends at once"
        server.stop(OTHER)
        running.join(30)
    assert qbox["out"][-1] == Ended("stopped", "Stopped before the generation started.")
    assert not events_of(qbox["out"]), "the stopped job never ran"
    assert box["out"][-1].outcome == "stopped"


def test_stop_reaches_the_first_request_after_the_second_ended():
    registry = ModelRegistry()
    lm = tiny_lm()
    registry.add("tiny", lm)
    registry.add("other", tiny_lm("other"))
    server = Server(registry, Limits(rate_per_minute=0, allowed_models=("tiny", "other")), throttle_s=0.0)
    with slow(lm, 0.01):
        first, box = in_thread(lambda: list(server.submit(ME, GenerateRequest, gen(max_new=200))))
        wait_until(lambda: registry.turns("tiny").busy)
        # the same tab's second request runs on the other model and ends first: its end must not take
        # the first request's Stop with it
        second = list(server.submit(ME, GenerateRequest, gen(max_new=5, model="other")))
        assert second[-1].outcome == "done" and first.is_alive()
        assert server.stop(ME) == 1
        first.join(10)
    assert box["out"][-1].outcome == "stopped"
    assert 0 < len(done_of(box["out"]).token_ids) < 200


def test_another_visitors_stop_does_not_stop_mine(server):
    lm = server.registry.get("tiny")
    with slow(lm, 0.005):
        mine, box = in_thread(lambda: list(server.submit(ME, GenerateRequest, gen(max_new=30))))
        wait_until(lambda: server.registry.turns("tiny").busy)
        assert server.stop(OTHER) == 0
        mine.join(30)
    assert box["out"][-1].outcome == "done"
    assert list(done_of(box["out"]).token_ids) == expected_ids(lm, "hi", 30)


def test_generate_and_compare_from_one_tab_ending_together(server):
    lm = server.registry.get("tiny")
    results = []
    for _ in range(5):
        g, gbox = in_thread(lambda: list(server.submit(ME, GenerateRequest, gen(max_new=4))))
        c, cbox = in_thread(lambda: list(server.submit(ME, CompareRequest, {"generate": gen(max_new=4),
                                                                            "baselines": ["autoregressive"],
                                                                            "repeats": 1})))
        g.join(30), c.join(30)
        results.append((gbox["out"][-1], cbox["out"][-1]))
        assert list(done_of(gbox["out"]).token_ids) == expected_ids(lm, "hi", 4)
    assert all(a.outcome == "done" and b.outcome == "done" for a, b in results), results
    assert server.jobs.of() == []


# ---- the time limit, clients that leave, failures --------------------------------------------------
def test_a_running_generation_stops_at_the_time_limit_and_keeps_what_it_wrote():
    server = one_model_server(max_seconds=0.4)
    with slow(server.registry.get("tiny"), 0.03):
        updates = list(server.submit(ME, GenerateRequest, gen(max_new=200)))
    assert updates[-1].outcome == "time limit"
    assert 0 < len(done_of(updates).token_ids) < 200
    assert not server.registry.turns("tiny").busy


def test_a_client_that_leaves_frees_the_model_within_a_second(server):
    lm = server.registry.get("tiny")
    passes = []
    original = lm.ee.run_layers

    def counted(*args, **kwargs):
        passes.append(time.monotonic())
        time.sleep(0.01)
        return original(*args, **kwargs)

    lm.ee.run_layers = counted
    open_before = METER.live  # (another test's stream may still hold one: the process has one meter)
    try:
        stream = server.submit(ME, GenerateRequest, gen(max_new=240))
        for update in stream:
            if events_of([update]):
                break
        left = time.monotonic()
        stream.close()  # what Gradio does when the connection drops
        wait_until(lambda: not server.registry.turns("tiny").busy, timeout=3)
    finally:
        lm.ee.run_layers = original
    assert time.monotonic() - left < 2
    assert not [t for t in passes if t > left + 1.0], "the model kept running after the client left"
    assert server.jobs.of() == [] and server.registry.in_use("tiny") == 0
    wait_until(lambda: METER.live == open_before, timeout=3)  # its watch on the machine's meter closed too


def test_a_failure_inside_a_generation_ends_only_that_request(server):
    lm = server.registry.get("tiny")
    original = lm.ee.exit_logits

    def boom(*a, **k):
        raise RuntimeError("simulated out of memory")

    lm.ee.exit_logits = boom
    try:
        last = list(server.submit(ME, GenerateRequest, gen()))[-1]
    finally:
        lm.ee.exit_logits = original
    assert last.outcome == "failed" and "The generation failed (RuntimeError: simulated out of memory)" in last.message
    assert not server.registry.turns("tiny").busy
    # failing midway, after tokens streamed out and with no DoneEvent: its watch on the machine's meter is closed
    calls = []

    def later(*a, **k):
        calls.append(1)
        if len(calls) > 6:
            raise RuntimeError("simulated out of memory")
        return original(*a, **k)

    lm.ee.exit_logits = later
    open_before = METER.live  # (another test's stream may still hold one: the process has one meter)
    try:
        updates = list(server.submit(ME, GenerateRequest, gen()))
    finally:
        lm.ee.exit_logits = original
    assert events_of(updates) and updates[-1].outcome == "failed" and METER.live == open_before
    ok = list(server.submit(OTHER, GenerateRequest, gen(max_new=10)))
    assert ok[-1].outcome == "done" and list(done_of(ok).token_ids) == expected_ids(lm, "hi", 10)


def test_the_queue_is_bounded():
    server = one_model_server(queue_size=1)
    with held_by_another(server.registry):
        waiting = server.submit(ME, GenerateRequest, gen())
        next(u for u in waiting if isinstance(u, Status) and "Waiting" in u.text)
        refused = list(server.submit(OTHER, GenerateRequest, gen()))
        assert refused == [Ended("refused", "The server is busy: 1 requests are waiting for the model; try again "
                                            "in a minute")]
        waiting.close()


def test_a_runs_follow_ups_are_requests_of_serving_in_the_models_turn(server):
    """Pass costs and exit beliefs are request types (serving.api): admitted, queued, run in the model's
    turn as jobs (a Stop and the time limit apply), with their answer as the result."""
    lm = server.registry.get("tiny")
    costs = server.result(ME, CostsRequest, {"model": "tiny", "exits": [2, 5]})
    assert costs is lm.ee.cost_model and costs.covers((2, 5))
    ids = lm.encode("hi")
    done = done_of(list(server.submit(ME, GenerateRequest, gen(max_new=6))))
    beliefs = server.result(ME, BeliefsRequest, {"model": "tiny", "prompt_ids": ids, "token_ids": list(done.token_ids)})
    assert beliefs["num_layers"] == 8 and beliefs["layers"][-1]["kind"] == "full"
    assert not server.registry.turns("tiny").busy and server.jobs.of() == []
    with held_by_another(server.registry):  # it waits for the model's turn like any request: a Stop ends it
        box = {}
        thread = threading.Thread(target=lambda: box.setdefault("out", _result_or_error(server)), daemon=True)
        thread.start()
        wait_until(lambda: server.registry.turns("tiny").waiting == 1)
        server.stop(ME, ("costs",))
        thread.join(10)
    assert isinstance(box["out"], HiSpecError) and "stopped" in str(box["out"]).lower()


def test_the_page_reads_a_loaded_model_and_its_pass_costs_through_the_servers_own_methods(server):
    """Server.loaded_model and pass_costs: what the page's panels ask of a model (issue 56: no panel reaches
    into the limits, the registry or the model's cost model). Costs timed before are answered without a job;
    others are measured as a CostsRequest; a model not offered or not loaded is refused by name."""
    lm = server.registry.get("tiny")
    assert server.loaded_model("tiny") is lm and server.loaded_model(None) is lm  # None: the start model
    with pytest.raises(HiSpecError, match="not offered on this server"):
        server.loaded_model("other")
    server.limits = server.limits.allowing("other")
    with pytest.raises(HiSpecError, match="model 'other' is not loaded yet: press Load first"):
        server.loaded_model("other")
    costs = server.pass_costs(ME, "tiny", (2, 5))
    assert costs is lm.ee.cost_model and costs.covers((2, 5))
    with held_by_another(server.registry):  # timed before: no job, no wait for the model's turn
        assert server.pass_costs(ME, "tiny", (2, 5)) is costs and server.jobs.of() == []


def _result_or_error(server):
    try:
        return server.result(ME, CostsRequest, {"model": "tiny", "exits": [3]})
    except HiSpecError as exc:
        return exc


@pytest.mark.parametrize("request_type, raw, message", [
    ("costs", {"exits": "2,5"}, "Exits must be a list of at most 4 exit layers"),
    ("costs", {"exits": [0]}, "Exit layer must be from 1"),
    ("costs", {"exits": [9]}, "Exit layer 9 is impossible: this model has 8 layers"),
    ("beliefs", {"prompt_ids": [1], "token_ids": []}, "Both prompt_ids and token_ids must hold at least one"),
    ("beliefs", {"prompt_ids": [1], "token_ids": list(range(600))}, "token_ids must be a list of at most 512"),
    ("beliefs", {"prompt_ids": [1], "token_ids": [10**9]}, "beyond this model's vocabulary"),
    ("beliefs", {"prompt_ids": "abc", "token_ids": [1]}, "prompt_ids must be a list of at most"),
])
def test_bad_follow_ups_are_refused_naming_the_field(server, request_type, raw, message):
    kind = {"costs": CostsRequest, "beliefs": BeliefsRequest}[request_type]
    with pytest.raises(HiSpecError, match=message):
        server.result(ME, kind, {"model": "tiny", **raw})
    assert server.jobs.of() == []


def test_follow_ups_are_not_counted_again_by_the_rate_limit_but_runs_are():
    server = one_model_server(global_rate_per_minute=0)
    server.rates = type(server.rates)(1, 0)  # one request a minute per address
    assert done_of(list(server.submit(ME, GenerateRequest, gen(max_new=4)))) is not None
    assert server.result(ME, CostsRequest, {"model": "tiny", "exits": [2]}).covers((2,))
    refused = list(server.submit(ME, GenerateRequest, gen(max_new=4)))
    assert refused[-1].outcome == "refused" and "per minute" in refused[-1].message


def test_loading_a_model_does_not_wait_behind_a_generation(server):
    from hispec.serving.api import LoadRequest

    with held_by_another(server.registry):
        t0 = time.monotonic()
        updates = list(server.submit(ME, LoadRequest, {"model": "tiny"}))
        assert time.monotonic() - t0 < 1
    assert updates[-1].outcome == "done" and updates[-2].items[0] is server.registry.get("tiny")


def test_a_waiting_client_hears_its_place_only_when_it_changes():
    """A job waiting behind a long one got its place twice a second (5 unread updates in 2.5 s were
    what ended live clients); now it hears it once, and again only when it changes."""
    server = tiny_server()
    first = Caller("tab-1", "10.0.0.1")
    with slow(server.registry.get("tiny"), 0.05):
        running = server.submit(first, GenerateRequest, {"prompt": "Hey", "max_new_tokens": 100})
        next(running)  # it holds the model now (its first update comes from its turn)
        # the same visitor's second request (its session's: another session is another visitor, and the running
        # one would pass it the model after its slice), so that it waits the whole time
        waiting = server.submit(Caller("tab-1", "10.0.0.1"), GenerateRequest, {"prompt": "Hey", "max_new_tokens": 2})
        seen, t0 = [], time.monotonic()
        while time.monotonic() - t0 < 2.5:
            seen.append(next(waiting))
        server.stop(first)
        places = [u.text for u in seen if isinstance(u, Status) and u.text.startswith("Waiting")]
        list(running), list(waiting)
    assert places == ["Waiting for the model: 1 request ahead of this one (one runs at a time)."], seen
