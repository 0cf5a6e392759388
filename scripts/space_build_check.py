"""Builds this repository as a Hugging Face Space does, starts its app and checks what a visitor gets.

    python scripts/space_build_check.py [--work DIR] [--tokens 12]

A Gradio Space gets the repository's files, runs `pip install -r pre-requirements.txt` (when there is one)
and `pip install -r requirements.txt` in a fresh environment, and starts `python app.py` with SPACE_ID set
and only the variables its owner chose (here: none). This does the same: the files git tracks (and new ones
it does not ignore) copied to a folder, a fresh venv of this interpreter with only those files installed,
from the package index pip is configured with (that pip's cache is shared, as a Space's builder has its own;
nothing of this checkout's environment is), then app.py headless on a free loopback port, with SPACE_ID set,
no HISPEC_* variable, HOME a new folder (no HiSpec, Hugging Face or pip cache of this user's) and the Hub
offline (the Space's path needs none of it). It checks, over HTTP as a visitor would:

- the app started on the default model, its file fetched at start (model.default_gguf),
- its Levels box offers the engine's precision list first (`lookup,full@a8`: the 4-bit levels are there),
- a greedy /generate with the page's defaults runs that list and equals plain float32 decoding (transformers' generate() in this process) token for token.

It prints each step's time and exits 1 with the app's log tail when a check fails. tests/ui/test_space_build.py
runs it (marked space_build).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Name three colours of the rainbow."
sys.path.insert(0, str(ROOT))
from hispec.engine.config import PRECISION_LIST as _LIST  # noqa: E402  the engine's own default list

PRECISION_LIST = ",".join(map(str, _LIST))
START_TIMEOUT_S = 900.0  # a fresh start fetches the file, converts the GGUF (~35 s) and builds the 4-bit kernel


class SpaceCheckFailed(AssertionError):
    pass


@dataclass
class Outcome:
    seconds: dict[str, float] = field(default_factory=dict)
    levels_box: str = ""
    model_box: str = ""
    levels_run: str = ""  # the level list the generation ran
    token_ids: list[int] = field(default_factory=list)
    reference_ids: list[int] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


def space_files(repo: Path = ROOT) -> list[str]:
    """The files a Space built from this repository gets: tracked ones, and new ones git does not ignore
    (outside a git checkout: every file but git's, environments, builds and caches)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=repo,
                             capture_output=True, check=True).stdout.decode()
        names = out.split("\0")
    except (OSError, subprocess.CalledProcessError):
        skip = {".git", ".venv", ".build", "__pycache__", ".pytest_cache", "out"}
        names = [str(p.relative_to(repo)) for p in repo.rglob("*") if not skip & set(p.relative_to(repo).parts)]
    return sorted(name for name in names if name and (repo / name).is_file())


def copy_space(dest: Path, repo: Path = ROOT) -> Path:
    for name in space_files(repo):
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, dest / name)
    return dest


def build(app_dir: Path, venv: Path) -> Path:
    """A fresh venv with only what a Space installs; its python."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    for name in ("pre-requirements.txt", "requirements.txt"):  # the order a Space installs them in
        if (app_dir / name).is_file():
            subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", name],
                           cwd=app_dir, check=True, env=_without_venv(os.environ))
    return python


def _without_venv(env) -> dict:
    return {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}


def pip_config_file() -> str | None:
    """The pip configuration this user's pip reads from HOME (the package index), kept when HOME changes."""
    for path in (Path.home() / ".config" / "pip" / "pip.conf", Path.home() / ".pip" / "pip.conf"):
        if path.is_file():
            return str(path)
    return None


def space_env(home: Path, port: int) -> dict:
    """The app's environment on a Space with no variables set: SPACE_ID, a new HOME, no HISPEC_*."""
    env = {k: v for k, v in _without_venv(os.environ).items()
           if not k.startswith(("HISPEC_", "GRADIO_", "HF_", "TRANSFORMERS_"))}
    config = os.environ.get("PIP_CONFIG_FILE") or pip_config_file()
    if config:
        env["PIP_CONFIG_FILE"] = config
    env.update(SPACE_ID="hispec-check/space-build", HOME=str(home), GRADIO_SERVER_NAME="127.0.0.1",
               GRADIO_SERVER_PORT=str(port), GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def started_app(app_dir: Path, python: Path, env: dict, log_path: Path, timeout_s: float = START_TIMEOUT_S):
    """`python app.py` running until its page answers; yields its URL, stops it after."""
    url = f"http://127.0.0.1:{env['GRADIO_SERVER_PORT']}/"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([str(python), "app.py"], cwd=app_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            while not _answers(url + "config"):
                if proc.poll() is not None:
                    raise SpaceCheckFailed(f"app.py exited with {proc.returncode} before serving: {tail(log_path)}")
                if time.monotonic() > deadline:
                    raise SpaceCheckFailed(f"app.py did not serve within {timeout_s:.0f} s: {tail(log_path)}")
                time.sleep(1.0)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def tail(path: Path, lines: int = 15) -> str:
    return " | ".join(deque((line.rstrip() for line in open(path, errors="replace")), maxlen=lines))


def component_value(config: dict, elem_id: str | None = None, label: str | None = None):
    for component in config.get("components", []):
        props = component.get("props", {})
        if (elem_id and props.get("elem_id") == elem_id) or (label and props.get("label") == label):
            return props.get("value")
    raise SpaceCheckFailed(f"the page has no component {elem_id or label!r}")


def check_page(url: str, outcome: Outcome) -> None:
    from ui.labels import LEVELS

    with urllib.request.urlopen(url + "config", timeout=30) as response:
        config = json.load(response)
    outcome.model_box = component_value(config, label="Model")
    outcome.levels_box = component_value(config, elem_id="hs-levels")
    if outcome.model_box != "default":
        raise SpaceCheckFailed(f"the page serves {outcome.model_box!r}, not the default model")
    if LEVELS.get(outcome.levels_box) != PRECISION_LIST:
        raise SpaceCheckFailed(f"the Levels box starts at {outcome.levels_box!r}, not the list {PRECISION_LIST}")


def generate(url: str, tokens: int) -> dict:
    from gradio_client import Client

    client = Client(url, verbose=False)
    try:  # the page's default method and levels (levels None: the model's recommended list)
        return client.predict(prompt=PROMPT, max_new_tokens=tokens, api_name="/generate")
    finally:
        client.close()


def reference(tokens: int) -> list[int]:
    """Plain float32 greedy decoding of the prompt by transformers' generate(), in this environment."""
    import torch

    from hispec.model.loading import load_model

    lm = load_model("default", device="cpu", dtype="float32", weights="fp32")
    ids = lm.encode(PROMPT)
    out = lm.model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                            attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def check_space(work: Path, tokens: int = 12, say=print) -> Outcome:
    """The whole check in `work` (left there: the app's log is work/app.log); raises SpaceCheckFailed."""
    outcome = Outcome()
    t0 = time.perf_counter()
    app_dir = copy_space(work / "space")
    python = build(app_dir, work / "venv")
    outcome.seconds["build"] = time.perf_counter() - t0
    say(f"built a fresh environment from requirements.txt in {outcome.seconds['build']:.0f} s")
    (work / "home").mkdir()
    log = work / "app.log"
    t0 = time.perf_counter()
    with started_app(app_dir, python, space_env(work / "home", free_port()), log) as url:
        outcome.seconds["start"] = time.perf_counter() - t0
        say(f"app.py served at {url} after {outcome.seconds['start']:.0f} s")
        check_page(url, outcome)
        t0 = time.perf_counter()
        answer = generate(url, tokens)
        outcome.seconds["generate"] = time.perf_counter() - t0
    outcome.log = log.read_text(errors="replace").splitlines()
    outcome.token_ids = list(answer["token_ids"])
    outcome.levels_run = ",".join(map(str, answer["settings"]["levels"] or ()))
    if not any("Fetched the default model's file" in line for line in outcome.log):
        raise SpaceCheckFailed(f"the app did not fetch the default model's file at start: {tail(log)}")
    if outcome.levels_run != PRECISION_LIST:
        raise SpaceCheckFailed(f"the generation ran the levels {outcome.levels_run!r}, not {PRECISION_LIST}")
    outcome.reference_ids = reference(tokens)
    if outcome.token_ids != outcome.reference_ids:
        raise SpaceCheckFailed(f"/generate gave {outcome.token_ids}, plain float32 decoding {outcome.reference_ids}")
    return outcome


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="an empty folder to build in (default: a new temporary one, removed)")
    parser.add_argument("--tokens", type=int, default=12)
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="hispec-space-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        outcome = check_space(work, args.tokens)
    except (SpaceCheckFailed, subprocess.CalledProcessError) as exc:
        print(f"space build check FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    print(f"OK: default model, Levels box {outcome.levels_box!r}, {len(outcome.token_ids)} tokens equal to plain "
          f"float32 decoding; seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in outcome.seconds.items()))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
