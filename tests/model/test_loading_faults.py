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


def test_a_host_that_cannot_build_the_4bit_kernel_is_not_offered_q4_and_keeps_the_exits(monkeypatch):
    """The float32 default model runs lookup -> 4-bit -> exact by default where its 4-bit copy is offered;
    a host without a C++ compiler (or AVX2) is not offered the copy, so the default falls back to the exits
    instead of failing at the first generation; naming a @q4 level there says why."""
    from helpers import ee_of, tiny_model

    from hispec.engine.config import DecodeConfig, preset
    from hispec.engine.decoding import Decoder
    from hispec.errors import ConfigError
    from hispec.model.formats import q4_kernel

    monkeypatch.setattr(q4_kernel, "compiler", lambda: None)
    ee = ee_of(tiny_model("llama", layers=8))
    loading._offer_q4_levels(ee, loading.DEFAULT_MODEL, "unused", "fp32", "cpu")
    assert ee.formats() == ()
    assert preset("hispec").resolve_for(ee).levels == ("lookup", 1, 2)
    with pytest.raises(ConfigError, match=r"cannot run a level in q4: .*needs a C\+\+ compiler \(g\+\+\)"):
        Decoder(ee, [1, 2], DecodeConfig(levels=("lookup", "full@q4")))
    monkeypatch.undo()
    if q4_kernel.host_isa() is not None and q4_kernel.compiler() is not None:  # a host that can: offered
        loading._offer_q4_levels(ee, loading.DEFAULT_MODEL, "unused", "fp32", "cpu")
        assert ee.formats() == ("q4",) and preset("hispec").resolve_for(ee).levels == ("lookup", "full@q4")
