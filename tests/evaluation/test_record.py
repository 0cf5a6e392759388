"""Every benchmark, sweep and profile JSON records the run that made it: command, commit (and whether
the tree was dirty), machine, priors and settings (issue 33, item 5); the commit is "unknown" where
there is no repository of the package's own, and recording it never fails."""

import json
import shutil
import subprocess

import pytest

from hispec.engine.config import preset
from hispec.engine.planning.policy import PRIOR_WEIGHT, UNKNOWN_PRIOR
from hispec.evaluation import record
from hispec.evaluation.profile import profile


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("no git on this host")
    root = tmp_path / "checkout"
    root.mkdir()
    _git(root, "init", "-q")
    (root / "a.txt").write_text("one\n")
    _git(root, "add", "a.txt")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    return root


def test_the_commit_and_a_dirty_tree_are_recorded(repo):
    assert record.code_version(repo) == {"commit": _git(repo, "rev-parse", "HEAD"), "dirty": False}
    (repo / "untracked.txt").write_text("not the code\n")
    assert record.code_version(repo)["dirty"] is False  # files git does not track do not count
    (repo / "a.txt").write_text("two\n")
    assert record.code_version(repo)["dirty"] is True


def test_no_repository_of_its_own_or_no_git_is_unknown_and_never_fails(repo, tmp_path, monkeypatch):
    unknown = {"commit": "unknown", "dirty": None}
    outside = tmp_path / "plain"
    outside.mkdir()
    assert record.code_version(outside) == unknown  # no repository at all
    inside = repo / "site-packages"  # a package installed inside some other checkout is not its code
    inside.mkdir()
    assert record.code_version(inside) == unknown
    monkeypatch.setenv("PATH", str(tmp_path / "no-git-here"))  # git missing
    assert record.code_version(repo) == unknown


def test_the_record_holds_command_code_machine_priors_and_settings(tiny_loaded):
    lm = tiny_loaded
    lm.ee.exit_info = {"head": {"type": "attention"}, "layers": [2, 4],
                       "policy_priors": {"exits": {"2-target": 0.37}, "lookup": {"lookup:3": 0.89}, "source": "text"},
                       "evaluation": {"agreement": {"2": {"trained": 0.39, "raw": 0.04}},
                                      "pairs": {"2-4": {"trained": 0.6, "raw": 0.5}}}}
    try:
        out = record.run_record(lm, "python -m hispec bench x", preset("hispec", 2, 4, max_new_tokens=9))
    finally:
        lm.ee.exit_info = None
    assert out["command"] == "python -m hispec bench x"
    assert set(out["code"]) == {"commit", "dirty"} and out["code"]["commit"]
    env = out["environment"]
    assert {"cpu", "avx512", "cpus", "threads", "torch", "transformers", "loadavg_start", "model"} <= set(env)
    assert out["priors"] == {"heads": "attention", "exits": [2, 4],
                             "measured": {"exits": {"2-target": 0.37}, "lookup": {"lookup:3": 0.89}},
                             "agreement": {"2": 0.39}, "pairs": {"2-4": 0.6}, "unknown_prior": UNKNOWN_PRIOR,
                             "lookup_unmeasured": out["priors"]["lookup_unmeasured"], "prior_weight": PRIOR_WEIGHT}
    assert out["config"]["max_new_tokens"] == 9 and out["config"]["method"] == "hispec"
    assert json.loads(json.dumps(out)) == out  # JSON-ready as it is
    assert record.run_record(lm, None)["config"] is None
    end = record.finish(out)["environment"]["loadavg_end"]
    assert end is None or len(end) == 3  # the load at the end: None where the host cannot say


def test_a_checkout_records_its_own_commit():
    root = record.REPOSITORY
    if shutil.which("git") is None or not (root / ".git").exists():
        pytest.skip("not a git checkout")
    assert record.code_version()["commit"] == _git(root, "rev-parse", "HEAD")


def test_a_profile_json_records_the_run(tiny_loaded):
    out = profile(tiny_loaded, context=8, repeats=1, counts=(1, 2))
    assert {"command", "code", "environment", "priors", "config", "counts"} <= set(out)
    assert out["config"]["method"] == "layerskip" and out["counts"] == [1, 2]
    json.dumps(out)


def test_the_float32_step_is_stated_against_its_products_bound_too():
    """Issue 51: beside the read bandwidth, every run records the host's float32 matrix-vector rate, and the
    float32 plain step is stated against the floor it sets (the product, not the read, bounds that step)."""
    from hispec.evaluation import host

    rate = host.matvec(repeats=2, shape=(512, 64))
    assert rate["gbs"] > 0 and rate["shape"] == [512, 64]
    report = {"host": {"bandwidth_start": {"read_gbs": 50.0}, "matvec_fp32_start": {"gbs": 10.0}},
              "summary": {"all": {"methods": {"autoregressive@fp32": {"tokens_per_s": 20.0},
                                              "autoregressive@q4": {"tokens_per_s": 100.0}}}}}
    bound = host.memory_bound(report, {"fp32": 500_000_000, "q4": 100_000_000})
    assert bound["fp32"]["matvec_bound_ms"] == 50.0 and bound["fp32"]["step_over_matvec_bound"] == 1.0
    assert bound["fp32"]["bound_ms"] == 10.0 and bound["fp32"]["step_over_bound"] == 5.0
    assert "matvec_bound_ms" not in bound["q4"]  # the 4-bit step's products are the kernel's, not torch.mv
