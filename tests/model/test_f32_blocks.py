"""The float32 model on its file's blocks (EarlyExitModel.use_blocks, q4.WideProjection, csrc/q4_kernel.cpp's
wide arithmetic): each weight widened in registers to the float32 model's own value, so the exact lane reads
4.5 bits per weight. Pinned here: the wide product against the dequantised weights in float64; a row's bits
whatever rows share its pass (both builds); the native route in wide mode against the float route within
float32 rounding; every method's greedy output equal to transformers' generate(); a file that is not the
model's refused by name; and (real_model) the default model loading on its blocks unless told not to."""

import pytest
import torch
from helpers import hf_greedy, kernel_product, on_blocks, tiny_model

from hispec.engine.config import DecodeConfig, preset
from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats import q4_kernel, q4_layer
from hispec.model.formats.q4 import (Q4_1, Q8_0, QuantizedMatrix, WideProjection, quantize_q4_1,
                                     quantize_q8_0)
from hispec.runs.runner import run

REASON = q4_kernel.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
ISAS = [isa for isa in ("avx512", "avx2") if q4_kernel.host_isa() == "avx512" or isa == "avx2"]
QUANTIZE = {Q4_1: quantize_q4_1, Q8_0: quantize_q8_0}


def _wide(matrix: QuantizedMatrix, x: torch.Tensor, isa: str) -> torch.Tensor:
    return kernel_product(matrix, x, isa, wide=True)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (37, 64)], ids=["qkv", "down", "odd-columns"])
def test_the_wide_product_is_the_dequantised_weights_product(kind, isa, shape):
    torch.manual_seed(0)
    matrix = QUANTIZE[kind](torch.randn(shape) * 0.05)
    x = torch.randn(5, shape[1])
    ref = (x.double() @ matrix.dequantize().double().T).float()
    got = _wide(matrix, x, isa)
    torch.testing.assert_close(got, ref, rtol=2e-6, atol=2e-6)
    # the 4-bit arithmetic (d * sum(q x) + m * sum(x)) is another rounding of the same product
    assert torch.equal(matrix.matmul(x, wide=True), _wide(matrix, x, q4_kernel.host_isa()))


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_wide_bits_do_not_depend_on_the_rows_beside_it(kind, isa, threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(1)
        matrix = QUANTIZE[kind](torch.randn(576, 1536, generator=g) * 0.05)
        row = torch.randn(1, 1536, generator=g)
        alone = _wide(matrix, row, isa)
        for n in (1, 2, 4, 8, 16, 33):
            for pos in sorted({0, n // 2, n - 1}):
                batch = torch.randn(n, 1536, generator=g)
                batch[pos] = row[0]
                assert torch.equal(_wide(matrix, batch, isa)[pos], alone[0]), (n, pos)
    finally:
        torch.set_num_threads(before)


def test_a_row_made_to_depend_on_its_neighbours_is_caught():
    """The check above, shown to catch what it checks: a product whose row 0 reads row 1 fails it."""
    g = torch.Generator().manual_seed(2)
    matrix = quantize_q4_1(torch.randn(64, 128, generator=g) * 0.05)
    row = torch.randn(1, 128, generator=g)

    def leaky(x):
        out = matrix.matmul(x, wide=True)
        if x.shape[0] > 1:
            out[0] = out[0] + 1e-7 * x[1].sum()
        return out
    alone = leaky(row)
    batch = torch.cat([row, torch.randn(1, 128, generator=g)])
    assert not torch.equal(leaky(batch)[0], alone[0])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_a_float32_model_on_its_blocks_runs_the_wide_native_route_and_agrees_with_its_float_route(arch):
    model, matrices = on_blocks(tiny_model(arch, layers=4, seed=3))
    ee = EarlyExitModel(model)
    ids = list(range(5, 25))

    def hidden_and_logits():
        cache = ee.new_cache(64)
        h = ee.run_layers(ee.embed(ids[:12]), 0, 4, cache)
        h2 = ee.run_layers(ee.embed(ids[12:]), 0, 4, cache)  # an 8-row pass after a prefill
        return torch.cat([h, h2], 1), ee.exit_logits(torch.cat([h, h2], 1), 4)

    float_h, float_logits = hidden_and_logits()
    ee.use_blocks(matrices)
    assert ee.lean.native is not None and ee.lean.native.mode == "wide"
    assert isinstance(ee.lean.lm_head, WideProjection) and not ee.lean.packed
    wide_h, wide_logits = hidden_and_logits()
    torch.testing.assert_close(wide_h, float_h, rtol=1e-4, atol=1e-4 * float_h.abs().max().item())
    torch.testing.assert_close(wide_logits, float_logits, rtol=1e-4, atol=1e-4 * float_logits.abs().max().item())
    ee.use_blocks(None)  # back to the float weights: the very route of before
    assert ee.lean.native is None and ee.blocks is None
    assert torch.equal(hidden_and_logits()[1], float_logits)


def test_every_method_on_blocks_equals_transformers_greedy():
    model, matrices = on_blocks(tiny_model("llama", layers=8, seed=5))
    ee = EarlyExitModel(model)
    ee.use_blocks(matrices)
    for prompt in ([5, 9, 13, 7, 22, 5, 9], [40, 41, 42, 40, 41]):
        ref = hf_greedy(model, prompt, 20)
        for config in (preset("autoregressive", max_new_tokens=20), preset("hispec", max_new_tokens=20),
                       preset("layerskip", max_new_tokens=20), preset("lookup", max_new_tokens=20),
                       preset("hispec", policy="auto", max_new_tokens=20),
                       DecodeConfig(levels=("lookup", 2, 5), max_new_tokens=20)):
            assert run(ee, prompt, config).token_ids == ref, (prompt, config)


def test_blocks_of_another_file_are_refused_by_name():
    model, matrices = on_blocks(tiny_model("llama", layers=2, seed=7))
    other = dict(matrices)
    other["model.layers.1.mlp.up_proj"] = quantize_q4_1(torch.randn(128, 64))
    ee = EarlyExitModel(model)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj: the file's blocks are not the model's"):
        ee.use_blocks(other)
    missing = {k: v for k, v in matrices.items() if k != "lm_head"}
    with pytest.raises(ValueError, match="lm_head: the file has no blocks"):
        ee.use_blocks(missing)
    assert ee.blocks is None and ee.lean.native is None  # nothing half set


def test_the_wide_mode_bits_of_a_row_do_not_depend_on_the_pass():
    """The native route in wide mode: a token fed alone or inside an 8-token pass leaves the same bits."""
    model, matrices = on_blocks(tiny_model("llama", layers=4, seed=9))
    ee = EarlyExitModel(model)
    ee.use_blocks(matrices)
    ids = list(range(30, 50))
    one = ee.new_cache(64)
    outs = [ee.run_layers(ee.embed([t]), 0, 4, one) for t in ids]
    many = ee.new_cache(64)
    chunked = [ee.run_layers(ee.embed(ids[a:b]), 0, 4, many) for a, b in ((0, 5), (5, 13), (13, 20))]
    assert torch.equal(torch.cat(outs, 1), torch.cat(chunked, 1))


@pytest.fixture(scope="module")
def default_fp32():
    from helpers import model_threads

    from hispec.model.loading import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(model_threads())
    yield load_model("default", device="cpu", weights="fp32")
    torch.set_num_threads(before)


@pytest.mark.real_model
def test_the_default_float32_model_runs_on_its_files_blocks(default_fp32, monkeypatch):
    """Loaded in float32, the default model's lean path runs the wide route on the GGUF's blocks, every one
    of which dequantises to the model's weight value for value; HISPEC_F32_BLOCKS=0 keeps oneDNN."""
    from hispec.model.loading import f32_blocks_reason

    ee = default_fp32.ee
    assert ee.f32_route_reason is None and ee.lean.native.mode == "wide"
    for module in [m for layer in ee.layers for part in (layer.self_attn, layer.mlp) for m in part.children()
                   if isinstance(m, torch.nn.Linear)] + [ee.model.lm_head]:
        assert torch.equal(ee.blocks[id(module)].dequantize(), module.weight), module
    assert "no GGUF blocks" in f32_blocks_reason("some/model", torch.float32, "cpu")
    assert "float32 on the CPU" in f32_blocks_reason("default", torch.bfloat16, "cpu")
    monkeypatch.setenv("HISPEC_F32_BLOCKS", "0")
    assert f32_blocks_reason("default", torch.float32, "cpu") == "HISPEC_F32_BLOCKS=0"
