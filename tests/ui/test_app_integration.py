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
from hispec.evaluation.runner import run  # noqa: E402
from hispec.serving.limits import Limits
from hispec.serving.registry import ModelRegistry  # noqa: E402
from hispec.text import Detokenizer  # noqa: E402
from ui import handlers, render  # noqa: E402

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
def serve_tiny_app(lm: LoadedModel | None = None, limits: Limits | None = None):
    """The app's page on the tiny model, served on a free loopback port; yields (url, LoadedModel).

    Torch runs single-threaded meanwhile: the generation runs in a worker thread of the server,
    and two intra-op threads on a busy 2-core machine make these tiny matmuls ~100x slower."""
    import app

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    lm = lm or tiny_loaded_model()
    registry = ModelRegistry(device="cpu", limits=limits or Limits(rate_per_minute=0))
    registry.add(MODEL, lm)
    demo = app.App(registry, MODEL, [MODEL]).build()
    port = free_port()
    try:
        demo.queue(max_size=registry.limits.queue_size).launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port,
                                       quiet=True, **app.launch_kwargs())
        yield f"http://127.0.0.1:{port}/", lm
    finally:
        demo.close()
        torch.set_num_threads(threads)


@contextlib.contextmanager
def slow_full_model(lm: LoadedModel, seconds: float):
    """Every pass through the last layer sleeps: a generation that takes long enough to stop."""
    handle = lm.model.model.layers[-1].register_forward_pre_hook(lambda module, args: time.sleep(seconds))
    try:
        yield
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def served():
    with serve_tiny_app() as (url, lm):
        yield url, lm


@pytest.fixture(scope="module")
def client(served):
    return Client(served[0], verbose=False)


# temperature, top-k, top-p, seed, policy (fixed: the engine runs these tests compare with are fixed)
GREEDY = (0.0, 0, 1.0, -1, "Fixed (the settings below)")


def call(client: Client, *args, api_name: str, timeout: float = TIMEOUT_S):
    return client.submit(*args, api_name=api_name).result(timeout=timeout)


def generate(client: Client, prompt: str, settings=HISPEC, max_new: int = 40, model: str = MODEL, chat=True):
    return call(client, prompt, model, *settings, max_new, chat, *GREEDY, api_name="/generate")


def expected(lm: LoadedModel, prompt: str, settings=HISPEC, max_new: int = 40, chat=True):
    """What the engine alone writes for these settings, and the config the app resolves."""
    config = handlers.make_config(*settings, max_new).resolve(lm.ee.num_layers)
    result = run(lm.ee, lm.encode(prompt, chat=chat), config, eos_ids=lm.eos_ids, detok=Detokenizer(lm.tokenizer))
    return result, config


def spans(tokens_html: str) -> list[tuple[str, str]]:
    """(css class, text) of every coloured token span."""
    return [(cls, html.unescape(text))
            for cls, text in re.findall(r'<span class="hs-tok (hs-[\w-]+)"[^>]*>(.*?)</span>', tokens_html, re.S)]


def committed_text(tokens_html: str) -> str:
    return "".join(text for cls, text in spans(tokens_html) if cls not in REJECTED)


def new_tokens(stats_html: str) -> int:
    match = re.search(r"<td>new tokens</td><td>(\d+)</td>", stats_html or "")
    assert match, f"no token count in the stats: {stats_html!r}"
    return int(match.group(1))


def plain(message_html: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", message_html or ""))


def assert_matches_engine(out, lm, prompt, settings=HISPEC, max_new=40):
    status, tokens, legend, final, stats = out[:5]
    result, config = expected(lm, prompt, settings, max_new)
    assert "Done" in plain(status), status
    assert 'class="hs-tok ' in tokens
    # the spans show special tokens too (the random model writes <unk>); the text skips them
    assert committed_text(tokens) == lm.tokenizer.decode(result.token_ids, skip_special_tokens=False)
    assert tokens == render.tokens_html(result.trace, config.draft_layer, config.verify_layer)
    assert legend == render.legend_html(result.trace.counts())
    assert new_tokens(stats) == len(result.token_ids)
    assert final == result.text


# ---- (a) one generation -------------------------------------------------------------------------
def test_generate_api_order(client):
    """The /generate parameters are in the order these tests (and API users) rely on."""
    params = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    labels = [p["label"] for p in params]
    assert labels == ["Prompt", "Model", "Method", "Draft layer d", "Verify layer v", "draft_len",
                      "verify_threshold", "Max new tokens", "Use the chat template", "Temperature",
                      "Top-k (0 = off)", "Top-p (1 = off)", "Seed (-1 = random)", "Policy"], labels


def test_generate_colours_tokens_and_matches_the_engine(served, client):
    _, lm = served
    out = generate(client, PROMPT, max_new=40)
    assert len(out) == 8
    assert plain(out[0]).startswith("Done: max new tokens"), out[0]
    classes = {cls for cls, _ in spans(out[1])}
    assert "hs-target-wrote" in classes  # the random model's exits disagree: corrections by the full model
    assert not classes & {"hs-drafted", "hs-tentative"}, "nothing may stay pending once done"
    assert_matches_engine(out, lm, PROMPT, max_new=40)
    assert len([cls for cls, _ in spans(out[1]) if cls not in REJECTED]) == 40
    acc, speed, work = out[5:]
    assert all(isinstance(fig, dict) and fig.get("type") == "plotly" for fig in (acc, speed, work))


# ---- (b) compare ------------------------------------------------------------------------------------
def test_compare_finds_identical_tokens(client):
    status, table, figure = call(client, PROMPT, MODEL, *HISPEC, 40, True, *GREEDY,
                                 ["Autoregressive", "LayerSkip (single exit)"], api_name="/compare")
    assert "Comparison done" in plain(status), status
    rows = re.findall(r"<tr><td>(hispec|autoregressive|layerskip)</td><td>(\d+)</td>.*?</tr>", table)
    assert [m for m, _ in rows] == ["hispec", "autoregressive", "layerskip"], table
    assert all(int(n) == 40 for _, n in rows), table
    assert table.count("✓ same tokens") == 3, table
    assert "DIFFERENT" not in table
    assert figure and figure.get("visible") is True  # the chart, hidden until a result exists, is shown
    assert figure["value"].get("type") == "plotly"


# ---- (c) stop ----------------------------------------------------------------------------------------
def test_stop_ends_the_visitors_generation(served, client):
    _, lm = served
    budget = 230  # chat-wrapped "Yo" is 20 tokens; the tiny model's context is 256
    if handlers.MAX_NEW_TOKENS < budget:
        pytest.skip(f"HISPEC_MAX_NEW_TOKENS={handlers.MAX_NEW_TOKENS} is below this test's budget")
    with slow_full_model(lm, 0.03):  # unstopped, this takes 230 x 30 ms = 7 s at least
        job = client.submit(LONG_PROMPT, MODEL, *HISPEC, budget, True, *GREEDY, api_name="/generate")
        deadline = time.monotonic() + 30
        while not any(isinstance(o, (list, tuple)) and "hs-tok" in (o[1] or "") for o in job.outputs()):
            assert not job.done(), f"finished before it could be stopped: {job.outputs()[-1:]}"
            assert time.monotonic() < deadline, "no partial result streamed in"
            time.sleep(0.05)
        partial = [o for o in job.outputs() if "hs-tok" in (o[1] or "")][0]
        assert "Generating" in plain(partial[0]), partial[0]
        t0 = time.monotonic()
        stopping = call(client, api_name="/stop")  # same client: same session hash
        assert "Stopping" in plain(stopping)
        final = job.result(timeout=10)
        elapsed = time.monotonic() - t0
    assert "stopped" in plain(final[0]).lower(), final[0]
    assert new_tokens(final[4]) < budget
    assert elapsed < 5, f"stop took {elapsed:.1f} s"
    # what was written before the stop is the start of the unstopped greedy text (which ends at EOS)
    unstopped, _ = expected(lm, LONG_PROMPT, max_new=budget)
    assert new_tokens(final[4]) < len(unstopped.token_ids)
    written = committed_text(final[1])
    assert written and lm.tokenizer.decode(unstopped.token_ids).startswith(written), written
    # the model is free again, and a stop does not leak into the visitor's next generation
    assert_matches_engine(generate(client, PROMPT, max_new=20), lm, PROMPT, max_new=20)


def test_stop_of_another_visitor_does_not_stop_mine(served):
    _, lm = served
    mine, other = Client(served[0], verbose=False), Client(served[0], verbose=False)
    with slow_full_model(lm, 0.005):
        job = mine.submit(PROMPT, MODEL, *HISPEC, 60, True, *GREEDY, api_name="/generate")
        time.sleep(0.3)
        call(other, api_name="/stop")
        out = job.result(timeout=TIMEOUT_S)
    assert_matches_engine(out, lm, PROMPT, max_new=60)


# ---- (d) two visitors at once --------------------------------------------------------------------------
def test_concurrent_visitors_get_their_own_outputs(served):
    url, lm = served
    a, b = Client(url, verbose=False), Client(url, verbose=False)
    with slow_full_model(lm, 0.005):  # long enough that the two generations overlap
        jobs = [(PROMPT, a.submit(PROMPT, MODEL, *HISPEC, 50, True, *GREEDY, api_name="/generate")),
                (OTHER_PROMPT, b.submit(OTHER_PROMPT, MODEL, *HISPEC, 50, True, *GREEDY, api_name="/generate"))]
        outs = [(prompt, job.result(timeout=TIMEOUT_S)) for prompt, job in jobs]
    assert committed_text(outs[0][1][1]) != committed_text(outs[1][1][1])
    for prompt, out in outs:
        assert_matches_engine(out, lm, prompt, max_new=50)


# ---- (e) bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["empty prompt", "blank prompt", "draft >= verify", "unreachable model",
                                  "over the model's context"])
def test_bad_input_shows_an_error_and_the_app_keeps_serving(served, client, case):
    _, lm = served
    args = dict(prompt=PROMPT, model=MODEL, settings=HISPEC, max_new=20)
    want = {
        "empty prompt": ("prompt is empty", dict(prompt="")),
        "blank prompt": ("prompt is empty", dict(prompt="   \n ")),
        "draft >= verify": ("must be below verify layer", dict(settings=("HiSpec", 5, 3, 2, 4))),
        "unreachable model": ("could not load model 'facebook/layerskip-llama3.2-1B'",
                              dict(model="facebook/layerskip-llama3.2-1B")),
        "over the model's context": ("exceeds the model's context", dict(max_new=handlers.MAX_NEW_TOKENS)),
    }[case]
    args.update(want[1])
    if case == "over the model's context" and handlers.MAX_NEW_TOKENS <= 256 - len(lm.encode(PROMPT)):
        pytest.skip(f"HISPEC_MAX_NEW_TOKENS={handlers.MAX_NEW_TOKENS} fits in the tiny model's context")
    t0 = time.monotonic()
    out = generate(client, args["prompt"], args["settings"], args["max_new"], args["model"])
    assert time.monotonic() - t0 < 15, "an error must come back fast (no download, no generation)"
    assert 'hs-msg-error' in out[0], out[0]
    assert want[0] in plain(out[0]), out[0]
    if case == "unreachable model":
        assert "offline" in plain(out[0]) or "not reachable" in plain(out[0])
    # the app still serves
    assert_matches_engine(generate(client, PROMPT, max_new=20), lm, PROMPT, max_new=20)


def test_max_new_tokens_over_the_limit_is_refused(served, client):
    _, lm = served
    limit = handlers.MAX_NEW_TOKENS
    try:
        out = generate(client, PROMPT, max_new=limit + 1)
    except AppError as exc:  # the slider itself refuses a value above its maximum
        message = str(exc)
        assert str(limit) in message and "maximum" in message, message
    else:  # or the handler does, in the status
        assert 'hs-msg-error' in out[0] and f"limit of {limit}" in plain(out[0]), out[0]
    assert_matches_engine(generate(client, PROMPT, max_new=20), lm, PROMPT, max_new=20)


def test_compare_rejects_bad_input_in_its_status(client):
    status, *_ = call(client, "", MODEL, *HISPEC, 20, True, *GREEDY, ["Autoregressive"], api_name="/compare")
    assert "prompt is empty" in plain(status)
    status, *_ = call(client, PROMPT, MODEL, "Autoregressive", 1, 2, 2, 4, 20, True, *GREEDY, ["Autoregressive"],
                      api_name="/compare")
    assert "at least one baseline" in plain(status)
