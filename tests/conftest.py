import os

# Tests never download: every model is built here or embedded.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402
import torch  # noqa: E402
from helpers import model_threads  # noqa: E402

# Tiny models run fastest on one thread, and two threads spin-wait badly when the machine is
# busy (100x slower seen here); the default-model tests ask for more threads themselves.
torch.set_num_threads(1)


@pytest.fixture
def real_model_threads():
    """Sets model_threads() for one test and restores the suite's one thread afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(model_threads())
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_llama():
    from helpers import tiny_model

    return tiny_model("llama")


@pytest.fixture(scope="module")
def tiny_loaded():
    """A tiny random 8-layer Llama as a LoadedModel with a character tokenizer (what the app,
    bench, sweep and hosting tests serve). One per test module: tests may change its state."""
    from helpers import EOS, char_tokenizer, tiny_model

    from hispec.model.early_exit import EarlyExitModel
    from hispec.model.loading import LoadedModel

    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    return LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t")


# ---- skips that a CI run must not take (issue 57: CI could pass without the default's path or the page) ----
# HISPEC_REQUIRE=kernel,browser (set by .ci/run) turns a skip whose reason says the 4-bit kernel, or
# Chromium or Playwright, is missing into a failure: on such a host the default's path (lookup -> the
# 4-bit model -> float32) or the page would go untested while the run stays green.
REQUIREMENTS = {  # name: (words of the skip reasons it covers, how to meet it)
    "kernel": (("4-bit kernel",), "scripts/setup.sh installs g++ as root on Debian/Ubuntu (apt-get install g++)"),
    "browser": (("chromium", "playwright"),
                "scripts/setup.sh --dev installs Debian's chromium as root (apt-get install chromium)"),
}


def required_by(reason: str, required: str | None = None) -> str | None:
    """The requirement (of HISPEC_REQUIRE, comma-separated) that a skip with this reason breaks, or None."""
    required = os.environ.get("HISPEC_REQUIRE", "") if required is None else required
    wanted = {name.strip() for name in required.split(",") if name.strip()}
    unknown = wanted - set(REQUIREMENTS)
    if unknown:
        raise pytest.UsageError(f"HISPEC_REQUIRE: unknown requirement {sorted(unknown)[0]!r}; "
                                f"allowed: {', '.join(REQUIREMENTS)} (comma-separated)")
    lowered = reason.lower()
    return next((name for name in sorted(wanted) if any(w in lowered for w in REQUIREMENTS[name][0])), None)


def _fail_required_skip(report) -> None:
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2])
    name = required_by(reason)
    if name:
        report.outcome = "failed"
        report.longrepr = (f"HISPEC_REQUIRE={name}: this run must not skip ({reason}); "
                           f"{REQUIREMENTS[name][1]}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_required_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_required_skip(outcome.get_result())
