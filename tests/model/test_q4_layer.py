"""The 4-bit path's native route (hispec/model/formats/q4_layer.py, hispec_q4_layers in csrc/q4_kernel.cpp): whole
layer ranges in one call. Against the Python route (kernel.decoder_layer on the same 4-bit products) within
float32 rounding (different sums: never bit for bit); within itself bit for bit, whatever the rows of the
pass, their place in it, the layer ranges, the threads, a cache grown mid-pass or a draft cut back; on both
kernel builds where the CPU has AVX-512."""

import pytest
import torch
from helpers import tiny_model

from hispec.model.formats import q4_kernel, q4_layer
from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats.q4 import to_q4

REASON = q4_kernel.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
ISAS = [isa for isa in ("avx512", "avx2") if q4_kernel.host_isa() == "avx512" or isa == "avx2"]
ARCHS = [("llama", {}), ("llama", {"attention_bias": True, "mlp_bias": True}), ("qwen2", {}), ("qwen3", {}),
         ("mistral", {})]
IDS = ["llama", "llama-bias", "qwen2", "qwen3", "mistral"]
L = 6


def _ee(arch="llama", seed=4, **extra) -> EarlyExitModel:
    return EarlyExitModel(to_q4(tiny_model(arch, layers=L, seed=seed, **extra)))


def _ids(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 100, (n,), generator=g).tolist()


def _run_chunks(ee, ids, chunks, capacity=256, ranges=((0, L),)):
    """Feed `ids` in passes of the given sizes; the concatenated outputs of the last range and the cache."""
    cache = ee.new_cache(capacity)
    outs, at = [], 0
    for n in chunks:
        h = ee.embed(ids[at : at + n])
        for start, end in ranges:
            h = ee.run_layers(h, start, end, cache)
        outs.append(h)
        at += n
    assert at == len(ids)
    return torch.cat(outs, dim=1), cache


def _kv(cache, n):
    return [(cache.keys[i][..., :n, :].clone(), cache.values[i][..., :n, :].clone()) for i in range(L)]


def test_the_lean_path_of_a_4bit_model_runs_native_unless_told_not_to(monkeypatch):
    for (arch, extra) in ARCHS:
        ee = _ee(arch, **extra)
        assert ee.lean.native is not None, (arch, q4_layer.support(ee.lean))
    monkeypatch.setenv("HISPEC_Q4_NATIVE", "0")
    assert _ee().lean.native is None
    monkeypatch.delenv("HISPEC_Q4_NATIVE")
    assert EarlyExitModel(tiny_model("llama", layers=2)).lean.native is None  # float32: never
    gelu = _ee(hidden_act="gelu_pytorch_tanh")
    assert gelu.lean.native is None and "activation" in q4_layer.support(gelu.lean)  # the Python route instead


@pytest.mark.parametrize("arch,extra", ARCHS, ids=IDS)
def test_native_route_agrees_with_the_python_route(arch, extra):
    """Prefill, 1-token steps, a 5-token pass and an exit-split range: hidden states and the cache's
    keys/values within float32 rounding of the Python route on the same 4-bit products."""
    ee = _ee(arch, **extra)
    ids = _ids(20, seed=1)
    chunks = [9, 1, 1, 5, 1, 3]
    results = {}
    for on in (True, False):
        assert q4_layer.set_enabled(ee, on) == on
        results[on] = _run_chunks(ee, ids, chunks, ranges=((0, 2), (2, L)))
    (native, cn), (python, cp) = results[True], results[False]
    scale = python.abs().max()
    assert scale > 1
    torch.testing.assert_close(native, python, rtol=1e-4, atol=1e-5 * scale)
    for (kn, vn), (kp, vp) in zip(_kv(cn, 20), _kv(cp, 20)):
        torch.testing.assert_close(kn, kp, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(vn, vp, rtol=1e-4, atol=1e-4)
    assert not torch.equal(native, python)  # two kernels: the test must not pass by accident of one route


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("arch,extra", ARCHS, ids=IDS)
def test_a_rows_bits_do_not_depend_on_the_pass_that_carries_it(arch, extra, isa):
    """One token at a time is the reference; the same tokens in passes of other sizes (the row at every
    place of a pass), through split layer ranges (exits), on a cache that grows mid-pass, and with 1 or 2
    threads: every row's hidden state and every key/value identical, bit for bit."""
    ee = _ee(arch, seed=6, **extra)
    q4_layer.set_enabled(ee, True, isa)
    ids = _ids(23, seed=2)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        ref, ref_cache = _run_chunks(ee, ids, [1] * 23)
        ref_kv = _kv(ref_cache, 23)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for chunks, capacity, ranges in (([23], 256, ((0, L),)),
                                             ([7, 1, 4, 11], 256, ((0, L),)),
                                             ([2, 16, 5], 8, ((0, L),)),  # grows inside the 16-token pass
                                             ([5, 3, 1, 1, 13], 256, ((0, 1), (1, 4), (4, L)))):
                out, cache = _run_chunks(ee, ids, chunks, capacity, ranges)
                assert torch.equal(out, ref), (threads, chunks)
                for (k, v), (rk, rv) in zip(_kv(cache, 23), ref_kv):
                    assert torch.equal(k, rk) and torch.equal(v, rv), (threads, chunks)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("isa", ISAS)
def test_a_rejected_draft_cut_from_the_cache_leaves_no_trace(isa):
    """Draft layers run ahead on tokens a verifier then rejects; the cache is cut back and other tokens
    follow, in one pass: the same bits as if the draft had never been there."""
    ee = _ee(seed=8)
    q4_layer.set_enabled(ee, True, isa)
    ids = _ids(14, seed=3)
    ref, _ = _run_chunks(ee, ids, [10, 4])
    cache = ee.new_cache(12)  # the draft and the pass after it both grow the buffers
    first = ee.run_layers(ee.embed(ids[:10]), 0, L, cache)
    draft = _ids(6, seed=4)
    for t in draft:  # one-token drafts through the first 2 layers only
        ee.run_layers(ee.embed([t]), 0, 2, cache)
    ee.run_layers(ee.embed(draft[:3]), 2, L, cache)  # part of it verified by the deeper layers
    for layer in range(L):
        cache.crop(layer, 10)
    rest = ee.run_layers(ee.embed(ids[10:]), 0, L, cache)
    assert torch.equal(torch.cat([first, rest], dim=1), ref)
    assert cache.lengths == [14] * L


def test_the_frontier_invariant_is_checked():
    ee = _ee()
    cache = ee.new_cache(16)
    ee.run_layers(ee.embed([5, 6]), 0, 2, cache)
    with pytest.raises(RuntimeError, match="expected"):
        ee.run_layers(ee.embed([7]), 0, L, cache)
