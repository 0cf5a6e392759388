"""Faults lose nothing: an interrupted conversion's temporary folder goes on the next start, and a
download the disk cannot hold is refused before anything is fetched."""

import os
import time

import pytest
from transformers import LlamaConfig

from hispec.errors import ModelLoadError
from hispec.model import loading


def test_an_interrupted_conversions_folder_is_removed_on_the_next_start(tmp_path):
    target = tmp_path / "smollm2-135m-instruct-1234"
    dead = tmp_path / f"{target.name}.tmp-999999999-abc"  # its process is gone
    mine = tmp_path / f"{target.name}.tmp-{os.getpid()}-def"  # a conversion running now
    old = tmp_path / f"{target.name}.tmp-xyz"  # an older release's name, no process in it, hours old
    fresh = tmp_path / f"{target.name}.tmp-uvw"
    for folder in (dead, mine, old, fresh):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x" * 1024)
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    removed = loading.remove_stale_conversions(target)
    assert sorted(removed) == sorted([dead, old])
    assert mine.is_dir() and fresh.is_dir() and not dead.exists() and not old.exists()


def test_a_download_the_disk_cannot_hold_is_refused_before_it_starts(monkeypatch, tmp_path):
    big = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
                      vocab_size=32000, torch_dtype="bfloat16")
    monkeypatch.setattr(loading, "_hub_cache", lambda: tmp_path / "hub")
    monkeypatch.setattr("transformers.AutoConfig.from_pretrained", lambda *a, **k: big)
    monkeypatch.setattr(loading, "free_disk_bytes", lambda path: 2**30)  # 1 GiB free
    monkeypatch.setattr(loading, "check_fits", _disk_only(loading.check_fits))

    def no_download(*a, **k):
        raise AssertionError("nothing may be fetched once the disk check refused")

    monkeypatch.setattr("transformers.AutoModelForCausalLM.from_pretrained", no_download)
    with pytest.raises(ModelLoadError, match=r"model 'someone/llama-7b' needs about 12\.\d GiB of disk, only 1\.0"):
        loading.load_model("someone/llama-7b", device="cpu")


def _disk_only(check):
    """check_fits with the memory check passed (this machine's RAM is not what is tested)."""
    def wrapped(name, size, device, free_memory=None, free_disk=None):
        return check(name, size, device, free_memory=2**62, free_disk=free_disk)

    return wrapped
