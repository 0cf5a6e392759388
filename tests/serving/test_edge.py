"""The serving edge over real HTTP (the app on loopback, driven with gradio_client): the client
address a header cannot choose, a Stop that reaches a request sent before it however late the
request reaches serving, and the API's endings (the time limit's own finish reason, a fault while
the answer is built given the app's message, a refusal's own message)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
import torch
from helpers import tiny_registry

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from hispec.serving.limits import Limits  # noqa: E402

TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def app_on_loopback(**limits):
    """The app on the tiny model on a free loopback port, with these limits (no rate limits unless
    given); yields (url, serving.session.Server)."""
    import app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    registry = tiny_registry()
    limits = {"rate_per_minute": 0, "global_rate_per_minute": 0, "allowed_models": ("tiny",), **limits}
    server = app.serve(registry, "tiny", Limits(**limits))
    demo = app.build(server, ["tiny"])
    port = free_port()
    try:
        demo.queue(max_size=64, default_concurrency_limit=None).launch(
            prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.launch_kwargs())
        yield f"http://127.0.0.1:{port}/", server
    finally:
        demo.close()
        torch.set_num_threads(threads)


@contextlib.contextmanager
def slow(lm, seconds: float):
    original = lm.ee.run_layers

    def slowed(*args, **kwargs):
        time.sleep(seconds)
        return original(*args, **kwargs)

    lm.ee.run_layers = slowed
    try:
        yield
    finally:
        del lm.ee.run_layers


def generate(client: Client, **fields):
    return client.submit(**{"prompt": "Hey", "max_new_tokens": 2, **fields}, api_name="/generate").result(
        timeout=TIMEOUT_S)


def outcome(client: Client, **fields) -> str:
    try:
        generate(client, **fields)
        return "done"
    except AppError as exc:
        return str(exc)


# ---- the client address ------------------------------------------------------------------------------
def test_a_forwarded_header_from_loopback_does_not_choose_the_address():
    """uvicorn believes X-Forwarded-For from loopback by default: each request with a new made-up
    address would pass the per-address limit. It must count the peer."""
    with app_on_loopback(rate_per_minute=2) as (url, _):
        seen = [outcome(Client(url, verbose=False, headers={"X-Forwarded-For": f"203.0.113.{i}"})) for i in range(3)]
    assert seen[:2] == ["done", "done"], seen
    assert "at most 2 requests per minute from one address" in seen[2], seen


def test_the_operators_proxy_names_the_address():
    """Control: from a proxy the operator trusts (HISPEC_TRUSTED_PROXIES), the forwarded address counts."""
    with app_on_loopback(rate_per_minute=2, trusted_proxies=("127.0.0.1",)) as (url, _):
        seen = [outcome(Client(url, verbose=False, headers={"X-Forwarded-For": f"203.0.113.{i}"})) for i in range(3)]
        repeated = [outcome(Client(url, verbose=False, headers={"X-Forwarded-For": "203.0.113.0"})) for _ in range(2)]
    assert seen == ["done"] * 3, seen
    assert repeated[0] == "done" and "at most 2 requests per minute from one address" in repeated[1], repeated


# ---- a Stop that cannot be lost ----------------------------------------------------------------------
def test_a_stop_sent_while_the_request_has_not_reached_serving_yet_is_not_lost():
    """Under load a request reaches serving long after its HTTP call (Gradio's queue, the handler's
    first update): here it is held on its way until the Stop has been answered."""
    with app_on_loopback() as (url, server):
        entered, stop_sent = threading.Event(), threading.Event()
        submit = server.submit

        def late(caller, request_type, raw):
            entered.set()
            stop_sent.wait(TIMEOUT_S)
            return submit(caller, request_type, raw)

        server.submit = late
        client = Client(url, verbose=False)
        job = client.submit(prompt="Hey", max_new_tokens=100, api_name="/generate")
        assert entered.wait(TIMEOUT_S), "the request never reached the handler"
        client.predict(api_name="/stop")
        stop_sent.set()
        with pytest.raises(AppError, match="Stopped before the generation started"):
            job.result(timeout=TIMEOUT_S)
        server.submit = submit
        assert generate(client)["stats"]["finish_reason"] == "max_new_tokens"  # a request after the Stop runs


# ---- the API's endings -------------------------------------------------------------------------------
def test_the_api_tells_the_time_limit_from_a_stop_and_says_why_it_refused():
    with app_on_loopback(max_seconds=0.5) as (url, server):
        client = Client(url, verbose=False)
        with slow(server.registry.get("tiny"), 0.02):
            cut = generate(client, max_new_tokens=200)
        assert cut["stats"]["finish_reason"] == "time_limit", cut["stats"]  # a Stop's is "stopped"
        assert 0 < len(cut["token_ids"]) < 200
        with pytest.raises(AppError, match="is not offered on this server; choose one of: tiny"):
            generate(client, model="not/offered")


def test_a_fault_while_the_answer_is_built_gives_the_apps_message(monkeypatch):
    from hispec.serving.answer import Generation

    def broken(*args, **kwargs):
        raise RuntimeError("simulated fault in the answer")

    with app_on_loopback() as (url, _):
        monkeypatch.setattr(Generation, "response", broken)
        with pytest.raises(AppError, match=r"The generation failed while its answer was built \(RuntimeError: "
                                           r"simulated fault in the answer\)\. The app is still running"):
            generate(Client(url, verbose=False))
