"""Safe to host in public: limits with readable messages, allowed models, inert model text,
failure isolation, load, and property-based checks of input validation."""

import math
import re
import sys
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from helpers import EVIL

from hispec.errors import ConfigError, HiSpecError, ModelLoadError
from hispec.model.fits import check_fits
from hispec.serving.limits import LAYERSKIP_CHECKPOINT, Limits, RateLimiter
from hispec.serving.registry import ModelRegistry
from hispec.cli.terminal import render
from hispec.evaluation.trace import Trace
from ui import handlers


@pytest.fixture(scope="module")
def lm(tiny_loaded):
    return tiny_loaded


def registry_with(lm, **limits):
    reg = ModelRegistry(limits=Limits(**limits))
    reg.add("tiny", lm)
    return reg


def stream(reg, prompt="hi", guard=None, visitor="v", **kw):
    config = handlers.make_config(*kw.pop("settings", ("HiSpec", 2, 5, 2, 3)), kw.pop("max_new", 8))
    return list(handlers.generation_stream(reg, "tiny", prompt, config, True, threading.Event(),
                                           guard=guard or handlers.Guard(reg.limits), visitor=visitor))


# ---- limits, each with its message ------------------------------------------------------------------
def test_prompt_token_limit(lm):
    reg = registry_with(lm, max_prompt_tokens=30)
    out = stream(reg, prompt="x" * 40)
    assert "the prompt is" in out[-1]["error"] and "over this server's limit of 30" in out[-1]["error"]


def test_new_token_limit():
    with pytest.raises(HiSpecError, match="max new tokens 65 is over this app's limit of 64"):
        handlers.make_config("HiSpec", 2, 5, 2, 3, 65, limit=64)
    with pytest.raises(ConfigError, match="max new tokens 65 is over this server's limit of 64"):
        Limits(max_new_tokens=64).check_request(5, 65)


def test_rate_limit_per_visitor(lm):
    reg = registry_with(lm, rate_per_minute=2)
    guard = handlers.Guard(reg.limits)
    assert stream(reg, guard=guard, visitor="a")[-1]["done"]
    assert "error" not in stream(reg, guard=guard, visitor="a")[-1]
    third = stream(reg, guard=guard, visitor="a")[-1]["error"]
    assert re.search(r"rate limit: at most 2 generations per minute per visitor; try again in \d+ s", third)
    assert "error" not in stream(reg, guard=guard, visitor="b")[-1]  # other visitors are unaffected


def test_rate_limiter_window():
    limiter = RateLimiter(2, window_s=60)
    limiter.check("x", now=0)
    limiter.check("x", now=1)
    with pytest.raises(ConfigError, match="try again in 59 s"):
        limiter.check("x", now=1)
    limiter.check("x", now=60.5)  # the first one left the window


def test_wall_time_limit(lm, monkeypatch):
    import time

    reg = registry_with(lm, max_seconds=0.3)
    run_layers = lm.ee.run_layers

    def slow(*args, **kwargs):  # a slow model: every layer-range call takes 50 ms more
        time.sleep(0.05)
        return run_layers(*args, **kwargs)

    monkeypatch.setattr(lm.ee, "run_layers", slow)
    out = stream(reg, max_new=200)
    assert out[-1]["status"] == "Stopped at this server's time limit of 0.3 s per request."
    assert out[-1]["stats"]["finish_reason"] == "stopped" and out[-1]["stats"]["new_tokens"] < 200
    assert not reg.generation_lock("tiny").locked()


def test_limits_from_env_and_hosted_default(monkeypatch):
    env = {"HISPEC_MAX_PROMPT_TOKENS": "100", "HISPEC_MAX_NEW_TOKENS": "50", "HISPEC_MAX_SECONDS": "9.5",
           "HISPEC_QUEUE_SIZE": "3", "HISPEC_RATE_LIMIT": "4", "HISPEC_ALLOWED_MODELS": "default, a/b"}
    limits = Limits.from_env(env)
    assert limits == Limits(100, 50, 9.5, 3, 4, ("default", "a/b"))
    text = limits.describe()
    for part in ("prompt ≤ 100 tokens", "≤ 50 new tokens", "≤ 9.5 s per request", "4 generations per minute",
                 "queue of 3", "models: default, a/b"):
        assert part in text
    assert Limits.from_env({}).allowed_models is None  # locally: any model
    assert Limits.from_env({"HISPEC_ALLOWED_MODELS": "*"}).allowed_models is None
    monkeypatch.setenv("SPACE_ID", "someone/hispec")
    assert Limits.from_env({}).allowed_models == ("default", LAYERSKIP_CHECKPOINT)
    with pytest.raises(ConfigError, match="HISPEC_RATE_LIMIT='many' is not a number"):
        Limits.from_env({"HISPEC_RATE_LIMIT": "many"})


# ---- models ----------------------------------------------------------------------------------------------
def test_disallowed_model_is_refused_without_any_download(lm):
    def loader(*a, **k):
        raise AssertionError("the loader must not even be called")

    reg = ModelRegistry(limits=Limits(allowed_models=("tiny",)), loader=loader)
    reg.add("tiny", lm)
    out = stream(reg)
    assert out[-1]["done"] and "error" not in out[-1]
    with pytest.raises(ModelLoadError, match="model 'evil/model' is not allowed on this server; choose one of: tiny"):
        reg.get("evil/model")
    config = handlers.make_config("HiSpec", 2, 5, 2, 3, 8)
    snaps = list(handlers.generation_stream(reg, "evil/model", "hi", config, True, threading.Event()))
    assert "is not allowed on this server" in snaps[-1]["error"]


def test_remote_code_is_never_trusted(tmp_path, monkeypatch):
    import transformers

    from helpers import save_tiny_folder
    from hispec.model.loading import load_model

    folder = save_tiny_folder(tmp_path / "m")
    seen = []
    for cls in (transformers.AutoConfig, transformers.AutoTokenizer, transformers.AutoModelForCausalLM):
        original = cls.from_pretrained.__func__

        def spy(klass, *a, _original=original, **k):
            seen.append(k.get("trust_remote_code"))
            return _original(klass, *a, **k)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    load_model(str(folder), device="cpu")
    assert seen and all(flag is False for flag in seen)


def test_model_too_big_for_memory_is_refused():
    with pytest.raises(ModelLoadError, match=r"needs about 8.0 GiB but only 4.0 GiB of memory is free on cpu"):
        check_fits("big", 8 * 2**30, "cpu", free_memory=4 * 2**30)
    with pytest.raises(ModelLoadError, match="of disk"):
        check_fits("big", 8 * 2**30, "cpu", free_memory=64 * 2**30, free_disk=2**30)
    check_fits("small", 2**20, "cpu", free_memory=2**30)


# ---- model text stays text ------------------------------------------------------------------------------


def evil_trace():
    from hispec.engine.events import TokenEvent, TokenState

    trace = Trace()
    for i, text in enumerate(EVIL):
        trace.add(TokenEvent(TokenState.TARGET_WROTE, i, i, 5, text, "target", "target", 1, 0.0))
    return trace


def test_terminal_output_is_inert():
    out = render(evil_trace(), color=True)
    assert "\x07" not in out and "\x1b]" not in out
    # the only escape sequences left are our own colour codes
    assert re.sub(r"\x1b\[[0-9;]*m", "", out).count("\x1b") == 0
    assert "\\x1b[31mRED" in out and "<script>" in out  # shown as text


# ---- property-based validation ------------------------------------------------------------------------
numbers = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.none(),
                    st.text(max_size=5), st.booleans(),
                    st.sampled_from([math.inf, -math.inf, math.nan, 1e300, -0.0, 2.5, "inf", "nan", "3", " 4 "]))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["HiSpec", "LayerSkip (single exit)", "Autoregressive", "nope", ""]),
       numbers, numbers, numbers, numbers, numbers, numbers, numbers, numbers, numbers)
def test_make_config_never_crashes(method, d, v, nd, ni, mx, t, k, p, seed):
    try:
        config = handlers.make_config(method, d, v, nd, ni, mx, t, k, p, seed)
    except HiSpecError as exc:
        assert str(exc)
    else:
        assert config.max_new_tokens <= handlers.MAX_NEW_TOKENS


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(prompt=st.one_of(st.text(max_size=300), st.text(alphabet=st.characters(), min_size=500, max_size=3000)),
       d=st.one_of(st.integers(1, 3), st.integers(-3, 12)), v=st.one_of(st.integers(4, 7), st.integers(-3, 12)),
       nd=st.one_of(st.integers(1, 4), st.integers(-1, 6)), ni=st.one_of(st.integers(1, 4), st.integers(-1, 6)),
       mx=st.one_of(st.integers(0, 40), st.integers(-5, 400)), chat=st.booleans())
def test_generation_stream_gives_a_result_or_a_message(lm, prompt, d, v, nd, ni, mx, chat):
    reg = registry_with(lm, max_prompt_tokens=200, max_new_tokens=40, max_seconds=20, rate_per_minute=0)
    try:
        config = handlers.make_config("HiSpec", d, v, nd, ni, mx, limit=40)
    except HiSpecError:
        return
    snaps = list(handlers.generation_stream(reg, "tiny", prompt, config, chat, threading.Event(),
                                            guard=handlers.Guard(reg.limits)))
    last = snaps[-1]
    assert last["done"]
    if "error" in last:
        assert isinstance(last["error"], str) and last["error"]
    else:
        assert last["stats"]["new_tokens"] <= min(40, max(mx, 0))
    assert not reg.generation_lock("tiny").locked()


# ---- load (short form; the full run is scripts/load_test.py) -----------------------------------------
def test_load_short_form(capsys):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import load_test

    code = load_test.main(["--sessions", "20", "--requests", "1", "--max-new-tokens", "12", "--max-seconds", "90"])
    report = capsys.readouterr().out
    assert code == 0, report
    assert '"failed": 0' in report and '"unfinished_sessions": 0' in report


def test_unpaired_surrogates_are_a_message(lm):
    reg = registry_with(lm)
    out = stream(reg, prompt="abc\ud800")
    assert out[-1]["error"] == ("the prompt contains characters that are not valid Unicode text "
                                "(unpaired surrogates); remove them")
