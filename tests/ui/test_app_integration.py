"""The real Gradio app, launched on a tiny random model and driven over HTTP with gradio_client.

Nothing is downloaded: the model and the tokenizer are built in the test (helpers), and the one
"unreachable" model id must fail fast under HF_HUB_OFFLINE=1 (set by conftest).
"""

from __future__ import annotations

import contextlib
import html
import re
import socket
import time

import pytest
import torch

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

import helpers  # noqa: E402
from hispec.model.early_exit import EarlyExitModel  # noqa: E402
from hispec.model.loading import LoadedModel  # noqa: E402
from hispec.runs.record import SCHEMA_VERSION, RecordedSettings, from_json  # noqa: E402
from hispec.runs.runner import run  # noqa: E402
from hispec.runs.trace import Trace  # noqa: E402
from hispec.engine.config import preset  # noqa: E402
from hispec.engine.planning.policy import DEFAULT_POLICY  # noqa: E402
from hispec.serving.limits import LAYERSKIP_CHECKPOINT, Limits  # noqa: E402
from hispec.serving.registry import ModelRegistry  # noqa: E402
from hispec.text import Detokenizer  # noqa: E402
from ui import labels, render  # noqa: E402

MODEL = "tiny"
LAYERS = 8
# Settings in the /generate order: method, draft layer, verify layer, draft_len, verify_threshold.
HISPEC = ("HiSpec", 1, 2, 2, 4)
REJECTED = ("hs-verify-rejected", "hs-target-rejected", "hs-discarded")
TIMEOUT_S = 60
# Greedy outputs of the tiny model (seed 0) with the chat template: these prompts do not reach
# EOS for a good while ("Hey": 122 tokens, "xyz": 64, "Yo": 140), so a budget of 40 is used up.
PROMPT, OTHER_PROMPT, LONG_PROMPT = "Hey", "xyz", "Yo"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_loaded_model() -> LoadedModel:
    model = helpers.tiny_model("llama", layers=LAYERS)
    model.generation_config.eos_token_id = helpers.EOS
    return LoadedModel(name=MODEL, model=model, tokenizer=helpers.char_tokenizer(), ee=EarlyExitModel(model),
                       device="cpu", dtype="float32", load_s=0.0, source="test")


@contextlib.contextmanager
def serve_tiny_app(lm: LoadedModel | None = None, limits: Limits | None = None, servers: list | None = None):
    """The app's page on the tiny model, served on a free loopback port; yields (url, LoadedModel);
    `servers`, when given, receives the app's serving.session.Server.

    Torch runs single-threaded meanwhile: the generation runs in a worker thread of the server,
    and two intra-op threads on a busy 2-core machine make these tiny matmuls ~100x slower."""
    import app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    lm = lm or tiny_loaded_model()
    registry = ModelRegistry(device="cpu")
    registry.add(MODEL, lm)
    limits = limits or Limits(rate_per_minute=0, address_rate_per_minute=0, global_rate_per_minute=0,
                              join_rate_per_minute=0, allowed_models=(LAYERSKIP_CHECKPOINT,))
    server = app.serve(registry, MODEL, limits)
    if servers is not None:
        servers.append(server)
    demo = app.build(server, [MODEL])
    port = free_port()
    try:
        demo.queue(max_size=64, default_concurrency_limit=None).launch(
            prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True, **app.launch_kwargs(server))
        yield f"http://127.0.0.1:{port}/", lm
    finally:
        app.close(demo)
        torch.set_num_threads(threads)


@contextlib.contextmanager
def slowed_layers(lm: LoadedModel, pause):
    """Every layer-range call sleeps pause(start, end) seconds first. (The engine's lean path runs the
    layers' arithmetic itself, not the modules' forward, so a forward hook would never fire: the
    layer-range call is what is slowed.)"""
    original = lm.ee.run_layers

    def slowed(hidden, start, end, cache):
        seconds = pause(start, end)
        if seconds:
            time.sleep(seconds)
        return original(hidden, start, end, cache)

    lm.ee.run_layers = slowed
    try:
        yield
    finally:
        del lm.ee.run_layers  # the instance attribute goes: the method is back


def slow_full_model(lm: LoadedModel, seconds: float):
    """Every layer pass that reaches the last layer sleeps first: a generation that takes long
    enough to stop."""
    return slowed_layers(lm, lambda start, end: seconds if end == lm.ee.num_layers and start < end else 0)


@pytest.fixture(scope="module")
def served():
    with serve_tiny_app() as (url, lm):
        yield url, lm


@pytest.fixture(scope="module")
def client(served):
    return Client(served[0], verbose=False)


# temperature, top-k, top-p, seed, policy (fixed: the engine runs these tests compare with are fixed)
GREEDY = (0.0, 0, 1.0, -1, "Fixed (the settings below)")


def call(client: Client, *args, api_name: str, timeout: float = TIMEOUT_S, **kwargs):
    return client.submit(*args, api_name=api_name, **kwargs).result(timeout=timeout)


def named(settings=HISPEC, max_new: int = 40, model: str = MODEL) -> dict:
    """The /generate API's named inputs for settings in the page's order (method label first)."""
    method, d, v, n_d, n_i = settings
    return dict(model=model, method=labels.METHODS[method], draft_layer=d, verify_layer=v, draft_len=n_d,
                verify_threshold=n_i, max_new_tokens=max_new, policy="fixed")


def submit(client: Client, prompt: str, settings=HISPEC, max_new: int = 40, model: str = MODEL):
    return client.submit(prompt=prompt, **named(settings, max_new, model), api_name="/generate")


def generate(client: Client, prompt: str, settings=HISPEC, max_new: int = 40, model: str = MODEL) -> dict:
    return submit(client, prompt, settings, max_new, model).result(timeout=TIMEOUT_S)


def expected(lm: LoadedModel, prompt: str, settings=HISPEC, max_new: int = 40, chat=True):
    """What the engine alone writes for these settings, and the config the app resolves."""
    method, d, v, n_d, n_i = settings
    config = preset(labels.METHODS[method], d, v if method == "HiSpec" else None, n_d, n_i, max_new,
                          policy="fixed").resolve(lm.ee.num_layers)
    result = run(lm.ee, lm.encode(prompt, chat=chat), config, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer))
    return result, config


def spans(tokens_html: str) -> list[tuple[str, str]]:
    """(css class, text) of every coloured token span."""
    return [(cls, html.unescape(text))
            for cls, text in re.findall(r'<span class="hs-tok (hs-[\w-]+)"[^>]*>(.*?)</span>', tokens_html, re.S)]


def committed_text(tokens_html: str) -> str:
    return "".join(text for cls, text in spans(tokens_html) if cls not in REJECTED)


def plain(message_html: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", message_html or ""))


def assert_matches_engine(out: dict, lm, prompt, settings=HISPEC, max_new=40):
    """The API's answer is the engine's own run: tokens, text, colours, stats and the whole trace."""
    result, config = expected(lm, prompt, settings, max_new)
    assert out["token_ids"] == result.token_ids
    assert out["text"] == result.text
    # the spans show special tokens too (the random model writes <unk>); the text skips them
    assert committed_text(out["html"]) == lm.tokenizer.decode(result.token_ids, skip_special_tokens=False)
    assert out["html"] == render.tokens_html(result.trace, RecordedSettings.read(result.settings).spec)
    assert out["stats"]["new_tokens"] == len(result.token_ids)
    record = from_json(out)  # the answer is a run record: it reads back as one
    assert record.token_ids == tuple(result.token_ids) and out["schema"] == SCHEMA_VERSION
    trace = Trace()
    for ev in record.events:
        trace.add(ev)
    assert render.tokens_html(trace, record.spec) == out["html"]


# ---- (a) one generation -------------------------------------------------------------------------
def test_generate_api_has_named_inputs_and_a_json_answer(client):
    """/generate takes named parameters with the engine's names, and documents every one."""
    endpoint = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]
    names = [p["parameter_name"] for p in endpoint["parameters"]]
    assert names[:6] == ["prompt", "method", "draft_layer", "verify_layer", "draft_len", "verify_threshold"], names
    assert {"max_new_tokens", "policy", "temperature", "seed", "model", "levels", "lengths"} <= set(names), names
    assert all(p["parameter_has_default"] for p in endpoint["parameters"][1:]), "only the prompt is required"


def test_generate_colours_tokens_and_matches_the_engine(served, client):
    _, lm = served
    out = generate(client, PROMPT, max_new=40)
    assert set(out) == {"schema", "model", "method", "levels", "policy", "adapts", "lengths", "text", "token_ids",
                        "prompt_ids", "finish_reason", "acceptance", "stats", "vs_plain", "pairs_asked", "costs_ms",
                        "costs_whose", "settings", "events", "html", "plans", "machine"}  # machine: serving's meter
    # levels and pairs named in words, beside their specs (issue 56): no engine role key in the stats
    assert all(level["words"] for level in out["levels"]) and out["levels"][-1]["words"] == "the full model"
    assert all("->" not in key for key in out["stats"]["acceptance"]), out["stats"]["acceptance"]
    assert all(p["words"] and len(p["by_position"]) >= 1 for p in out["acceptance"] if p["judged"])
    assert out["plans"] and all(p["words"] and p["rounds"] for p in out["plans"])  # the page's plan table
    assert out["stats"]["finish_reason"] == "max_new_tokens"
    classes = {cls for cls, _ in spans(out["html"])}
    assert "hs-target-wrote" in classes  # the random model's exits disagree: corrections by the full model
    assert not classes & {"hs-drafted", "hs-tentative"}, "nothing may stay pending once done"
    assert_matches_engine(out, lm, PROMPT, max_new=40)
    assert len([cls for cls, _ in spans(out["html"]) if cls not in REJECTED]) == 40
    kinds = [e["type"] for e in out["events"]]
    assert kinds[-1] == "done" and {"token", "pass", "round"} <= set(kinds), set(kinds)
    assert out["settings"]["draft_layer"] == 1 and out["settings"]["verify_layer"] == 2


def test_generate_api_fills_in_the_models_settings(served, client):
    """Layers and lengths left out take the model's recommended settings, as on the page."""
    _, lm = served
    out = call(client, prompt=PROMPT, max_new_tokens=12, api_name="/generate")
    assert out["settings"]["method"] == "hispec" and out["settings"]["policy"] == DEFAULT_POLICY
    resolved = preset("hispec", max_new_tokens=12).resolve(lm.ee.num_layers)
    assert (out["settings"]["draft_layer"], out["settings"]["verify_layer"]) == (resolved.preset.draft_layer,
                                                                                  resolved.preset.verify_layer)
    assert len(out["token_ids"]) == 12


# ---- (b) compare ------------------------------------------------------------------------------------
def test_compare_finds_identical_tokens(client):
    _, status, table, figure = call(client, PROMPT, MODEL, *HISPEC, 40, True, *GREEDY,
                                 ["Autoregressive", "LayerSkip (single exit)"], 2, api_name="/compare")
    assert "Comparison done" in plain(status), status
    names = r"HiSpec, fixed|Autoregressive|LayerSkip \(single exit\)"  # the page's names, not the engine's
    rows = re.findall(rf"<tr><td>({names})</td><td>.*?</td><td>(\d+)</td>.*?</tr>", table)
    assert [m for m, _ in rows] == ["HiSpec, fixed", "Autoregressive", "LayerSkip (single exit)"], table
    # two runs each, the order reversed on the second pass, each speed with its range
    assert "Run order: HiSpec, fixed → Autoregressive → LayerSkip (single exit) → LayerSkip (single exit) → Autoregressive → HiSpec, fixed" in plain(table)
    assert table.count("2 runs)") == 3, table
    assert all(int(n) == 40 for _, n in rows), table
    assert table.count("✓ same tokens") == 3, table
    assert "DIFFERENT" not in table
    assert figure and figure.get("visible") is True  # the chart, hidden until a result exists, is shown
    assert figure["value"].get("type") == "plotly"


# ---- (c) stop ----------------------------------------------------------------------------------------
def test_stop_ends_the_visitors_generation(served, client):
    _, lm = served
    budget = 230  # chat-wrapped "Yo" is 20 tokens; the tiny model's context is 256
    if Limits().max_new_tokens < budget:
        pytest.skip(f"HISPEC_MAX_NEW_TOKENS={Limits().max_new_tokens} is below this test's budget")
    with slow_full_model(lm, 0.03):  # unstopped, this takes 230 x 30 ms = 7 s at least
        job = submit(client, LONG_PROMPT, max_new=budget)
        time.sleep(1.5)
        assert not job.done(), "finished before it could be stopped"
        t0 = time.monotonic()
        stopping = call(client, api_name="/stop")  # same client: same session hash
        assert "Stopping" in plain(stopping)
        final = job.result(timeout=10)
        elapsed = time.monotonic() - t0
    assert final["stats"]["finish_reason"] == "stopped", final["stats"]
    assert 0 < len(final["token_ids"]) < budget
    assert elapsed < 5, f"stop took {elapsed:.1f} s"
    # what was written before the stop is the start of the unstopped greedy text (which ends at EOS)
    unstopped, _ = expected(lm, LONG_PROMPT, max_new=budget)
    assert final["token_ids"] == unstopped.token_ids[: len(final["token_ids"])]
    assert len(final["token_ids"]) < len(unstopped.token_ids)
    # the model is free again, and a stop does not leak into the visitor's next generation
    assert_matches_engine(generate(client, PROMPT, max_new=20), lm, PROMPT, max_new=20)


def test_stop_of_another_visitor_does_not_stop_mine(served):
    _, lm = served
    mine, other = Client(served[0], verbose=False), Client(served[0], verbose=False)
    with slow_full_model(lm, 0.005):
        job = submit(mine, PROMPT, max_new=60)
        time.sleep(0.3)
        call(other, api_name="/stop")
        out = job.result(timeout=TIMEOUT_S)
    assert_matches_engine(out, lm, PROMPT, max_new=60)


# ---- (d) two visitors at once --------------------------------------------------------------------------
def test_concurrent_visitors_get_their_own_outputs(served):
    url, lm = served
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    with slow_full_model(lm, 0.005):  # long enough that the two generations overlap
        jobs = [(PROMPT, submit(a, PROMPT, max_new=50)), (OTHER_PROMPT, submit(b, OTHER_PROMPT, max_new=50))]
        outs = [(prompt, job.result(timeout=TIMEOUT_S)) for prompt, job in jobs]
    assert outs[0][1]["token_ids"] != outs[1][1]["token_ids"]
    for prompt, out in outs:
        assert_matches_engine(out, lm, prompt, max_new=50)


# ---- (e) bad input: an error raised as an error, naming what is wrong -------------------------------
@pytest.mark.parametrize("case", ["empty prompt", "blank prompt", "draft >= verify", "unreachable model",
                                  "unlisted model", "a local folder", "over the model's context", "unknown method",
                                  "over the app's limit"])
def test_bad_input_raises_an_error_and_the_app_keeps_serving(served, client, case):
    _, lm = served
    args = dict(prompt=PROMPT, **named(max_new=20))
    want = {
        "empty prompt": ("prompt is empty", dict(prompt="")),
        "blank prompt": ("prompt is empty", dict(prompt="   \n ")),
        "draft >= verify": ("must be below verify layer", dict(draft_layer=5, verify_layer=3)),
        "unreachable model": ("Could not load model 'facebook/layerskip-llama3.2-1B'",
                              dict(model="facebook/layerskip-llama3.2-1B")),
        "unlisted model": ("Model 'evil/model' is not offered on this server; choose one of: "
                           "facebook/layerskip-llama3.2-1B, tiny", dict(model="evil/model")),
        "a local folder": ("Model '/tmp' is not offered on this server", dict(model="/tmp")),
        "over the model's context": ("exceeds the model's context", dict(max_new_tokens=Limits().max_new_tokens)),
        "unknown method": ("Unknown method 'medusa'; choose from hispec, layerskip", dict(method="medusa")),
        "over the app's limit": (f"over this app's limit of {Limits().max_new_tokens}",
                                 dict(max_new_tokens=Limits().max_new_tokens + 1)),
    }[case]
    args.update(want[1])
    if case == "over the model's context" and Limits().max_new_tokens <= 256 - len(lm.encode(PROMPT)):
        pytest.skip(f"HISPEC_MAX_NEW_TOKENS={Limits().max_new_tokens} fits in the tiny model's context")
    t0 = time.monotonic()
    with pytest.raises(AppError) as caught:
        call(client, api_name="/generate", **args)
    assert time.monotonic() - t0 < 15, "an error must come back fast (no download, no generation)"
    assert want[0] in str(caught.value), str(caught.value)
    if case == "unreachable model":
        assert "offline" in str(caught.value) or "not reachable" in str(caught.value)
    # the app still serves
    assert_matches_engine(generate(client, PROMPT, max_new=20), lm, PROMPT, max_new=20)


def test_compare_rejects_bad_input_in_its_status(client):
    _, status, *_ = call(client, "", MODEL, *HISPEC, 20, True, *GREEDY, ["Autoregressive"], 1, api_name="/compare")
    assert "prompt is empty" in plain(status)
    _, status, *_ = call(client, PROMPT, MODEL, "Autoregressive", 1, 2, 2, 4, 20, True, *GREEDY, ["Autoregressive"], 1,
                      api_name="/compare")
    assert "at least one baseline" in plain(status)
    try:
        _, status, *_ = call(client, PROMPT, MODEL, *HISPEC, 20, True, *GREEDY, ["Autoregressive"], 9,
                          api_name="/compare")
    except AppError as exc:  # the slider itself refuses a value above its maximum
        assert "maximum" in str(exc), str(exc)
    else:  # or the handler does, in the status
        assert "runs of each method must be 1 to 5" in plain(status), status


# ---- (f) hosting: clients that leave, a full queue, the server log ----------------------------------
# A client that submits a long generation, waits until its update stream has brought a first update
# (it is listening), then waits to be killed.
ABANDON = """
import sys, time
from gradio_client import Client
client = Client(sys.argv[1], verbose=False)
job = client.submit(prompt="Yo", method="autoregressive", max_new_tokens=200, policy="fixed", api_name="/generate")
while not job.outputs():
    time.sleep(0.05)
print("listening", flush=True)
time.sleep(60)
"""


def test_an_abandoned_generate_call_frees_the_model_within_seconds(tmp_path):
    import subprocess
    import sys

    servers = []
    with serve_tiny_app(servers=servers) as (url, lm):
        turns = servers[0].registry.turns(MODEL)
        with slow_full_model(lm, 0.05):  # unabandoned, 200 tokens take 10 s at least
            script = tmp_path / "abandon.py"
            script.write_text(ABANDON)
            proc = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, text=True)
            assert proc.stdout.readline().strip() == "listening"
            assert turns.busy, "the generation is running"
            proc.kill()  # the client dies mid-generation
            proc.wait()
            killed = time.monotonic()
            while turns.busy:
                assert time.monotonic() - killed < 5, "the model is still busy 5 s after its client left"
                time.sleep(0.05)
        assert servers[0].jobs.of() == []
        # the next visitor is served at once, and right
        out = generate(Client(url, verbose=False), PROMPT, max_new=20)
        assert_matches_engine(out, lm, PROMPT, max_new=20)


def test_stop_is_never_refused_and_reaches_a_queued_job_when_the_queue_is_full():
    limits = Limits(rate_per_minute=0, global_rate_per_minute=0, queue_size=1, allowed_models=(MODEL,))
    servers = []
    with serve_tiny_app(limits=limits, servers=servers) as (url, lm):
        server = servers[0]
        # the waiting job is the running visitor's own (one session): a classmate's would get a turn of the model
        # between rounds (serving.turns) and leave the waiting room before the late request comes
        running, late = (Client(url, verbose=False) for _ in range(2))
        waiting = running
        with slow_full_model(lm, 0.05):
            first = submit(running, LONG_PROMPT, max_new=150)
            t0 = time.monotonic()
            while not server.registry.turns(MODEL).busy:
                assert time.monotonic() - t0 < 20
                time.sleep(0.05)
            queued = submit(waiting, PROMPT, max_new=20)
            while server.registry.turns(MODEL).waiting < 1:
                assert time.monotonic() - t0 < 20
                time.sleep(0.05)
            with pytest.raises(AppError, match="The server is busy: 1 requests are waiting"):
                generate(late, OTHER_PROMPT, max_new=5)  # the queue is full: new work is refused
            assert "Stopping" in plain(call(waiting, api_name="/stop"))  # but a Stop never is
            with pytest.raises(AppError, match="Stopped before the generation started"):
                queued.result(timeout=10)
            assert first.result(timeout=20)["stats"]["finish_reason"] == "stopped"  # the same session's Stop


def test_a_refused_request_writes_one_line_to_the_log_and_no_traceback(served, client, capfd, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="hispec.serving")
    capfd.readouterr()
    for _ in range(3):
        with pytest.raises(AppError):
            call(client, api_name="/generate", prompt="", max_new_tokens=5)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err
    refusals = [r for r in caplog.records if r.getMessage().startswith("refused generate")]
    assert len(refusals) == 3 and all("\n" not in r.getMessage() for r in refusals)


def test_generate_with_a_baseline_returns_the_measured_ratio_to_plain_decoding(served, client):
    """baseline=N: N pairs of runs (the method, plain decoding) on the same prompt and length, and
    stats.vs_plain = the method's tokens/s over plain's, per pair; three identical calls agree. The full
    model is made the expensive part (as in a real model; the tiny one's runs are otherwise a few ms of
    Python, where a thread switch is noise)."""
    _, lm = served
    medians = []
    for _ in range(3):
        with slow_full_model(lm, 0.05):  # the full model's passes dominate, even on a busy machine
            out = call(client, prompt=PROMPT, **named(max_new=24), baseline=3, api_name="/generate")
        vs = out["stats"]["vs_plain"]
        assert {"median", "low", "high", "runs"} <= set(vs) and vs["runs"] == 3
        assert vs["low"] <= vs["median"] <= vs["high"] and vs["new_tokens"] == 24
        assert len(vs["method_tokens_per_s"]) == len(vs["plain_tokens_per_s"]) == 3
        medians.append(vs["median"])
        assert_matches_engine(out, lm, PROMPT, max_new=24)  # the answer is still the method's own run
    assert max(medians) / min(medians) < 1.5, medians
    plain_out = call(client, prompt=PROMPT, **named(max_new=10), api_name="/generate")
    assert "vs_plain" not in plain_out["stats"], "no baseline asked for, none measured"
