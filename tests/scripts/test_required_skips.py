"""HISPEC_REQUIRE (set by .ci/run) turns the skips that would hide the default's path or the page into
failures (issue 57: every 4-bit test skipped where g++ was missing, every browser test where Chromium was)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import required_by

TESTS = Path(__file__).resolve().parents[1]
SAMPLE = '''import pytest
def test_kernel():
    pytest.skip("4-bit kernel unavailable here: no C++ compiler")
def test_browser():
    pytest.skip("no chromium on PATH")
def test_other():
    pytest.skip("only one Python on this machine")
'''


def test_a_required_skip_is_named_and_others_are_not():
    assert required_by("no 4-bit kernel here: no compiler", "kernel") == "kernel"
    assert required_by("playwright is not installed", "kernel,browser") == "browser"
    assert required_by("no chromium on PATH", "kernel") is None
    assert required_by("needs a CUDA GPU", "kernel,browser") is None
    assert required_by("no chromium on PATH", "") is None
    with pytest.raises(pytest.UsageError, match="unknown requirement 'gpu'; allowed: kernel, browser"):
        required_by("anything", "kernel,gpu")


@pytest.mark.parametrize("required, failed", [("", ()), ("kernel", ("test_kernel",)),
                                              ("kernel,browser", ("test_kernel", "test_browser"))])
def test_a_run_that_requires_the_kernel_or_the_browser_fails_where_it_would_skip(tmp_path, required, failed):
    for name in ("conftest.py", "helpers.py"):
        shutil.copy(TESTS / name, tmp_path / name)
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {**os.environ, "HISPEC_REQUIRE": required, "PYTHONPATH": str(TESTS.parent)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-o", "addopts=", "-q", "-rfs",
                          str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert (run.returncode != 0) == bool(failed), run.stdout[-2000:]
    for name in ("test_kernel", "test_browser"):
        assert (f"FAILED test_sample.py::{name}" in run.stdout) == (name in failed), run.stdout[-2000:]
    assert f"{len(failed)} failed" in run.stdout if failed else "3 skipped" in run.stdout
