"""What a benchmark, sweep or profile JSON records about the run that made it, beside its figures.

Every artifact the package writes starts from ``run_record``: the command line that asked for the
run, the code it ran (the commit, and whether the working tree had uncommitted changes: the same
commit with local edits is not the same code), the machine and software (CPU model, AVX-512, cores,
threads, torch and transformers, the load at the start; ``finish`` adds the load at the end), the
priors the adaptive policy starts from with this model's exit heads, and the decoding settings in
full. Hosts of this project's kind differ up to 5x, and code and priors change between releases, so
a figure without these cannot be read or reproduced.

The commit comes from ``git`` where the package sits in a git working tree of its own; anywhere else
(an installed package, a copy without .git, no git at all) it is "unknown", and recording it never
fails a run.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import torch

from hispec.evaluation.host import cpu_flags, cpu_model, loadavg

REPOSITORY = Path(__file__).resolve().parents[2]  # the checkout that holds hispec/, when there is one
UNKNOWN = "unknown"


def code_version(root: Path = REPOSITORY) -> dict:
    """{"commit": the checked-out commit or "unknown", "dirty": uncommitted changes to tracked files
    (None when unknown)}. Only a repository whose top level is `root` counts: a package installed
    inside some other repository (a virtual environment in a checkout) is not that repository's code."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20,
                              check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != Path(root).resolve():
            return {"commit": UNKNOWN, "dirty": None}
        commit = git("rev-parse", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, ValueError, subprocess.SubprocessError):
        return {"commit": UNKNOWN, "dirty": None}
    return {"commit": commit or UNKNOWN, "dirty": dirty if commit else None}


def environment(lm) -> dict:
    """The machine and software of a run: every absolute figure needs it (hosts differ up to 5x)."""
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "threads": torch.get_num_threads(), "cpus": os.cpu_count(), "machine": platform.machine(),
            "processor": platform.processor() or platform.machine(), "cpu": cpu_model(),
            "avx512": "avx512f" in cpu_flags(), "loadavg_start": loadavg(), "device": lm.device, "dtype": lm.dtype,
            "weights": getattr(lm, "weights", "fp32"), "model": lm.name, "layers": lm.ee.num_layers,
            # where a float32 model's products come from: its file's blocks (since 2026-12-07) or its float weights
            "f32_products": "blocks" if getattr(lm.ee, "blocks", None) is not None else "float weights"}


def priors(ee) -> dict:
    """The acceptance the adaptive policy starts from with this model's exit heads (engine.planning.policy):
    the measured priors the heads' manifest ships (by level pair, and for lookup by match length), the
    heads' held-out agreement it falls back on where a pair has none, the prior of a pair with nothing
    measured, and how many judged tokens a prior counts as."""
    from hispec.engine.planning.policy import LOOKUP_UNMEASURED, PRIOR_WEIGHT, UNKNOWN_PRIOR

    info = getattr(ee, "exit_info", None) or {}
    shipped = info.get("policy_priors") or {}
    evaluation = info.get("evaluation") or {}
    trained = lambda table: {k: v.get("trained") for k, v in (table or {}).items() if isinstance(v, dict)}  # noqa: E731
    return {"heads": (info.get("head") or {}).get("type"), "exits": list(info.get("layers") or []),
            "measured": {k: v for k, v in shipped.items() if k in ("exits", "lookup")},
            "agreement": trained(evaluation.get("agreement")), "pairs": trained(evaluation.get("pairs")),
            "unknown_prior": UNKNOWN_PRIOR, "lookup_unmeasured": {str(k): v for k, v in LOOKUP_UNMEASURED.items()},
            "prior_weight": PRIOR_WEIGHT}


def settings(config) -> dict | None:
    """A decoding configuration in full (engine.config.DecodeConfig.settings: levels, lengths, budget,
    sampling and the preset's names, plus its stop strings), JSON-ready; None stays None."""
    if config is None:
        return None
    return json.loads(json.dumps({**config.settings(), "stop_strings": list(config.stop_strings)}, default=str))


def run_record(lm, command: str | None, config=None) -> dict:
    """The start of every benchmark, sweep and profile report: command, code, environment, priors, config."""
    return {"command": command, "code": code_version(), "environment": environment(lm), "priors": priors(lm.ee),
            "config": settings(config)}


def finish(report: dict) -> dict:
    """The end of a run: the load average again (a shared machine changes during a run)."""
    report["environment"]["loadavg_end"] = loadavg()
    return report


def write(path: str | None, report: dict) -> None:
    """A measurement's JSON, where its --json asked (folders made; nothing when None)."""
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(report, indent=1) + "\n")
