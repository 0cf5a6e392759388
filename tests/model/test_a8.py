"""The 'a8' precision: the 4-bit blocks with int8 activations per block of 32 (hispec_q41_matmul_a8 and the
native route's act8 mode in csrc/q4_kernel.cpp). A cheaper format of the same weights: close to the float
product (int8 rounding of the activations, never bit for bit), batch-invariant on its own (a row's bits do
not depend on the rows beside it or its place in the pass), and, as a level below the exact model, never
changing a token of the exact model's output."""

import pytest
import torch
from helpers import ee_of, hf_greedy, tiny_model

from hispec.engine.config import preset
from hispec.engine.levels import parse_levels
from hispec.errors import ConfigError
from hispec.runs.runner import run
from hispec.model.formats import q4_kernel, q4_layer
from hispec.model.early_exit import EarlyExitModel
from hispec.model.formats.q4 import Q4_1, QuantizedMatrix, q4_copy, quantize_q8_0, to_q4

REASON = q4_kernel.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
ISAS = [isa for isa in ("avx512", "avx2") if q4_kernel.host_isa() == "avx512" or isa == "avx2"]
L = 6


def _matrix(N, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    qs = torch.randint(0, 256, (N, K // 2), dtype=torch.uint8, generator=g)
    d = (torch.rand(N, K // 32, generator=g) * 0.02 + 1e-3).half().view(torch.int16)
    m = (-torch.rand(N, K // 32, generator=g) * 0.1).half().view(torch.int16)
    return QuantizedMatrix(Q4_1, qs, d, m, (N, K))


def _a8(lib, w, x):
    N, K = w.shape
    out = torch.empty(x.shape[0], N)
    lib.hispec_q41_matmul_a8(x.data_ptr(), x.shape[0], K, w.qs.data_ptr(), w.d.data_ptr(), w.m.data_ptr(), N,
                             out.data_ptr(), N, 2)
    return out


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("K,N", [(576, 1536), (1536, 576), (544, 96), (96, 64)])  # 544, 96: an odd block count
def test_the_int8_product_is_close_to_the_float_one_and_batch_invariant(isa, K, N):
    lib, w = q4_kernel.load(isa), _matrix(N, K)
    x = torch.randn(9, K, generator=torch.Generator().manual_seed(1))
    y = _a8(lib, w, x)
    exact = x.double() @ w.dequantize().double().T
    rel = ((y.double() - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 2e-2  # int8 activations: about 0.7% here, far from float32 rounding (1e-7)
    for i in range(9):  # alone, or anywhere in a pass of another size
        assert torch.equal(_a8(lib, w, x[i : i + 1].contiguous())[0], y[i])
    assert torch.equal(_a8(lib, w, x[2:7].contiguous()), y[2:7])


def _reference(w, x):
    """The a8 product in float64 from its definition: xq = round(x / dx) per block (dx = amax / 127),
    sum_b d_b * dx_b * (q_b . xq_b) + m_b * sum(x_b)."""
    N, K = w.shape
    xb = x.double().view(x.shape[0], K // 32, 32)
    dx = xb.abs().amax(-1, keepdim=True) / 127
    xq = torch.where(dx > 0, torch.round(xb / torch.where(dx > 0, dx, 1)), 0).clamp(-127, 127)
    packed = w.qs.view(N, K // 32, 16)
    q = torch.cat([packed & 15, packed >> 4], dim=-1).double()  # [N, nb, 32]
    d = w.d.view(torch.float16).double()
    m = w.m.view(torch.float16).double()
    ints = torch.einsum("rbi,nbi->rnb", xq, q)
    return (ints * d[None] * dx[..., 0][:, None]).sum(-1) + (xb.sum(-1)[:, None] * m[None]).sum(-1)


@pytest.mark.parametrize("isa", ISAS)
def test_the_int8_product_computes_its_definition(isa):
    """Against a float64 reference of the same quantisation: equal to float32 rounding, so the blocks' and
    the activations' layouts (pairs of blocks interleaved on AVX-512) line up."""
    lib = q4_kernel.load(isa)
    for K, N in [(576, 64), (544, 32), (96, 40)]:
        w = _matrix(N, K, seed=K)
        x = torch.randn(5, K, generator=torch.Generator().manual_seed(2))
        ref = _reference(w, x)
        torch.testing.assert_close(_a8(lib, w, x).double(), ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item())


def test_a_zero_block_of_activations_gives_the_minimum_term_only():
    """amax 0: a scale of 0 and no division by it; the block contributes nothing but m * sum(x) = 0."""
    lib, w = q4_kernel.lib(), _matrix(64, 96)
    x = torch.randn(2, 96, generator=torch.Generator().manual_seed(3))
    x[:, 32:64] = 0
    y = _a8(lib, w, x)
    assert torch.isfinite(y).all()
    ref = _reference(w, x)  # its definition, with the zero block contributing nothing
    torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-4 * ref.abs().max().item())


def _views(seed=4):
    q4 = EarlyExitModel(to_q4(tiny_model("llama", layers=L, seed=seed)))
    return q4, q4_layer.a8_copy(q4)


def _run(ee, ids, chunks, layers=L):
    cache, outs, at = ee.new_cache(64), [], 0
    for n in chunks:
        outs.append(ee.run_layers(ee.embed(ids[at : at + n]), 0, layers, cache))
        at += n
    return torch.cat(outs, dim=1), cache


def test_the_a8_view_shares_the_blocks_and_runs_act8():
    q4, a8 = _views()
    assert a8.lean.native.act8 and not q4.lean.native.act8 and a8.model is q4.model
    assert a8.lean.native.dims.mode == q4_layer.MODES["a8"] == 1
    ids = list(range(5, 25))
    h8, _ = _run(a8, ids, [20], layers=1)
    h4, _ = _run(q4, ids, [20], layers=1)
    rel = ((h8 - h4).norm() / h4.norm()).item()
    assert 0 < rel < 0.1  # one layer in another format of the same weights: close, not the same


@pytest.mark.parametrize("isa", ISAS)
def test_an_a8_rows_bits_do_not_depend_on_the_pass_that_carries_it(isa):
    q4 = EarlyExitModel(to_q4(tiny_model("llama", layers=L, seed=5)))
    a8 = q4_layer.a8_copy(q4)
    a8.lean.native = q4_layer.NativeLayers(a8.lean, isa, act8=True)
    ids = list(range(3, 23))
    ref, ref_cache = _run(a8, ids, [20])
    for chunks in ([1] * 20, [7, 1, 5, 3, 4], [12, 8]):
        out, cache = _run(a8, ids, chunks)
        assert torch.equal(out, ref), chunks
        for i in range(L):
            assert torch.equal(cache.keys[i][..., :20, :], ref_cache.keys[i][..., :20, :])


def test_a8_is_refused_where_the_native_route_is_off(monkeypatch):
    monkeypatch.setenv("HISPEC_Q4_NATIVE", "0")
    q4 = EarlyExitModel(to_q4(tiny_model("llama", layers=2, seed=1)))
    with pytest.raises(ConfigError, match="a8 levels: int8 activations run only in the native 4-bit route.*HISPEC_Q4_NATIVE=0"):
        q4_layer.a8_copy(q4)


def test_a8_sits_below_q4_at_equal_depth():
    assert parse_levels("lookup,full@a8,full@q4") == ("lookup", "full@a8", "full@q4")
    assert parse_levels("2@a8,full@a8") == ("2@a8", "full@a8")
    with pytest.raises(ConfigError, match="more precise"):
        parse_levels("full@q4,full@a8")
    with pytest.raises(ConfigError, match="choose from q4, a8"):
        parse_levels("full@a4")


# ---- as a level: the exact model keeps the last word -----------------------------------------------
PROMPTS = [[5, 17, 33, 5, 17, 33, 5, 9, 41], [70], [8, 9, 10, 11, 8, 9, 10]]


def _tokens(ee, prompt, **config):
    return run(ee, prompt, preset(max_new_tokens=20, **config)).token_ids


@pytest.fixture(scope="module")
def fp32_with_formats():
    model = tiny_model("llama", layers=8, seed=3)
    ee = ee_of(model)
    ee.add_format("q4", lambda: EarlyExitModel(q4_copy(model)))
    ee.add_format("a8", lambda: q4_layer.a8_copy(ee.in_format("q4")))
    return model, ee


@pytest.mark.parametrize("levels", [("full@a8",), ("lookup", "full@a8"), ("full@a8", "full@q4"),
                                    ("lookup", "2@a8", "full@a8"), ("2@a8", "full@q4")],
                         ids=lambda x: "+".join(map(str, x)))
@pytest.mark.parametrize("policy", ["fixed", "auto"])
def test_a8_levels_give_the_float32_models_greedy_output(fp32_with_formats, levels, policy):
    model, ee = fp32_with_formats
    for prompt in PROMPTS:
        tokens = _tokens(ee, prompt, levels=levels, policy=policy, draft_len=3, verify_threshold=2)
        assert tokens == hf_greedy(model, prompt, 20), (levels, policy, prompt)


@pytest.mark.parametrize("levels", [("full@a8",), ("lookup", "full@a8"), ("2@a8", "full@a8")],
                         ids=lambda x: "+".join(map(str, x)))
def test_a8_levels_on_the_4bit_model_give_its_own_plain_output(levels):
    q4 = EarlyExitModel(to_q4(tiny_model("llama", layers=8, seed=6)))
    q4.add_format("a8", lambda: q4_layer.a8_copy(q4))
    for prompt in PROMPTS:
        plain = _tokens(q4, prompt, method="autoregressive")
        tokens = _tokens(q4, prompt, levels=levels, policy="fixed", draft_len=4, verify_threshold=2)
        assert tokens == plain, (levels, prompt)


def test_attention_rows_wider_than_the_hidden_size():
    """Qwen3-style heads (heads x head_dim > hidden and > intermediate): the per-thread buffers hold
    the widest row a product takes; the a8 view runs and stays batch-invariant."""
    model = tiny_model("qwen3", layers=2, seed=2, hidden_size=32, intermediate_size=32, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=16)
    q4 = EarlyExitModel(to_q4(model))
    a8 = q4_layer.a8_copy(q4)
    ids = list(range(3, 15))
    ref, _ = _run(a8, ids, [12], layers=2)
    out, _ = _run(a8, ids, [5, 1, 6], layers=2)
    assert torch.isfinite(ref).all() and torch.equal(out, ref)


# ---- one kernel for every pass width: a row's bits never depend on how many rows share the pass -------
WIDTHS = range(1, 17)


def _head(N, K, seed=7):
    g = torch.Generator().manual_seed(seed)
    return quantize_q8_0(torch.randn(N, K, generator=g) * 0.05)


def _product(lib, w, x, threads):
    """x @ W.T through the packed int8 entry points (what the a8 layers and head call)."""
    N, K = w.shape
    out = torch.empty(x.shape[0], N)
    packed = q4_layer.packed_a8(lib, w) if w.kind == Q4_1 else q4_layer.A8Head(lib, w).packed
    fn = lib.hispec_q41_matmul_a8p if w.kind == Q4_1 else lib.hispec_q80_matmul_a8p
    fn(x.data_ptr(), x.shape[0], K, packed.data_ptr(), N, out.data_ptr(), N, threads)
    return out


def width_mismatches(lib, threads: int) -> list[str]:
    """Every (matrix, width k, row) whose k-row product differs in any bit from the same row alone, for
    k = 1..16 and two placements of the window (the pass's first rows, its last rows). Matrices: Q4_1 with
    a partial last column group and an odd block count, and a Q8_0 head."""
    bad = []
    for name, w in (("q41 96x80", _matrix(80, 96, seed=1)), ("q41 544x64", _matrix(64, 544, seed=2)),
                    ("q80 head 64x200", _head(200, 64))):
        x = torch.randn(16, w.shape[1], generator=torch.Generator().manual_seed(5))
        x[3, :32] = 0  # an all-zero block
        alone = torch.cat([_product(lib, w, x[i : i + 1].contiguous(), threads) for i in range(16)])
        for k in WIDTHS:
            for lo in (0, 16 - k):
                y = _product(lib, w, x[lo : lo + k].contiguous(), threads)
                bad += [f"{name} k={k} row {lo + i}" for i in range(k) if not torch.equal(y[i], alone[lo + i])]
    return bad


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ISAS)
def test_k_row_products_equal_one_row_products_bit_for_bit(isa, threads):
    assert width_mismatches(q4_kernel.load(isa), threads) == []


def test_the_q8_head_computes_its_definition():
    """The a8 LM head (Q8_0 weights, signed: dpbusd takes w + 128 and takes 128 * sum(xq) off) against a
    float64 reference of the same quantisation, weights at both ends of the byte range included."""
    w = _head(72, 96)
    w.qs[0, :8] = torch.tensor([-128, 127, -127, 0, 5, -1, 1, -128], dtype=torch.int8)
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(8))
    xb = x.double().view(5, 3, 32)
    dx = xb.abs().amax(-1, keepdim=True) / 127
    xq = torch.round(xb / dx).clamp(-127, 127)
    ref = (torch.einsum("rbi,nbi->rnb", xq, w.qs.view(72, 3, 32).double())
           * w.d.view(torch.float16).double()[None] * dx[..., 0][:, None]).sum(-1)
    for isa in ISAS:
        y = _product(q4_kernel.load(isa), w, x, 2)
        torch.testing.assert_close(y.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())


def _a8_view(isa, layers=4, seed=9):
    q4 = EarlyExitModel(to_q4(tiny_model("llama", layers=layers, seed=seed)))
    a8 = q4_layer.a8_copy(q4)
    a8.lean.native = q4_layer.NativeLayers(a8.lean, isa, act8=True)
    head = q4.lean.lm_head
    a8.lean.lm_head = q4_layer.A8Head(a8.lean.native.lib, head.matrix, head.bias)
    return a8


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", ISAS)
def test_k_token_logits_equal_one_token_logits_bit_for_bit(isa, threads):
    """The a8 view's whole pass (layers, cache, LM head) over k = 1..16 new tokens after a prompt: each
    row's logits equal, bit for bit, those of the same position decoded one token at a time."""
    a8, prompt, ids = _a8_view(isa), [5, 9, 14, 3, 22, 7], list(range(30, 46))
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cache = a8.new_cache(64)
        a8.run_layers(a8.embed(prompt), 0, a8.num_layers, cache)
        one = []
        for t in ids:
            one.append(a8.exit_logits(a8.run_layers(a8.embed([t]), 0, a8.num_layers, cache), a8.num_layers)[0, 0])
        for k in WIDTHS:
            for layer in range(a8.num_layers):
                cache.crop(layer, len(prompt))
            logits = a8.exit_logits(a8.run_layers(a8.embed(ids[:k]), 0, a8.num_layers, cache), a8.num_layers)[0]
            assert all(torch.equal(logits[i], one[i]) for i in range(k)), k
    finally:
        torch.set_num_threads(saved)


def test_the_a8_view_runs_its_lm_head_in_int8():
    q4, a8 = _views()
    assert isinstance(a8.lean.lm_head, q4_layer.A8Head) and not isinstance(q4.lean.lm_head, q4_layer.A8Head)
    h = torch.randn(1, 3, q4.lean.lm_head.matrix.shape[1])
    rel = ((a8.lean.lm_head(h) - q4.lean.lm_head(h)).norm() / q4.lean.lm_head(h).norm()).item()
    assert 0 < rel < 0.05
    with pytest.raises(TypeError, match="a8 LM head takes float32"):
        a8.lean.lm_head(h.double())


ROW_DEPENDENT = ("            acc[r] = vfma(s, vmul(dw, vset1(x.dx[r * nb + b])), acc[r]);",
                 "            acc[r] = vfma(s, vmul(dw, vset1(x.dx[r * nb + b])), acc[r]);\n"
                 "            if constexpr (R > 1) acc[r] = vmul(acc[r], vset1(1.0000001f));  // rows in company drift")


def test_the_width_check_catches_a_row_dependent_kernel(tmp_path):
    """The check above fails on a build whose arithmetic depends on the tile's row count (a deliberate
    change compiled from a copy of the source): the bit check can fail."""
    source = q4_kernel.SOURCE.read_text()
    assert ROW_DEPENDENT[0] in source, "the kernel's a8 accumulation line moved: update ROW_DEPENDENT"
    broken = tmp_path / "q4_kernel.cpp"
    broken.write_text(source.replace(ROW_DEPENDENT[0], ROW_DEPENDENT[1]))
    lib = q4_kernel.open_library(q4_kernel.build(q4_kernel.host_isa(), source=broken))
    bad = width_mismatches(lib, 1)
    assert bad and all(int(b.split("k=")[1].split()[0]) > 1 for b in bad)


# ---- as the exact model (--weights a8): every method equals its own plain decoding ----------------------
@pytest.fixture(scope="module")
def a8_exact():
    return q4_layer.a8_copy(EarlyExitModel(to_q4(tiny_model("llama", layers=8, seed=9))))


@pytest.mark.parametrize("config", [dict(method="lookup"), dict(method="layerskip", draft_len=3),
                                    dict(method="hispec", draft_len=3, verify_threshold=2),
                                    dict(method="hispec", policy="auto"),
                                    dict(levels=("lookup", 2, 4), policy="auto")],
                         ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_every_method_on_the_a8_model_gives_its_own_plain_output(a8_exact, config):
    for prompt in PROMPTS:
        plain = _tokens(a8_exact, prompt, method="autoregressive")
        assert _tokens(a8_exact, prompt, **config) == plain, (config, prompt)


def test_the_a8_model_is_its_own_format_not_the_4bit_ones():
    """The check above can fail: the a8 model's greedy output is its own, and on some prompt it parts from
    the 4-bit model's (another arithmetic of the same blocks), so equal outputs are not a given."""
    q4 = EarlyExitModel(to_q4(tiny_model("llama", layers=8, seed=9)))
    a8 = q4_layer.a8_copy(q4)
    prompts = [[i, i + 7, i + 3] for i in range(5, 60, 5)]
    differ = [p for p in prompts if _tokens(a8, p, method="autoregressive") != _tokens(q4, p, method="autoregressive")]
    assert differ, "a8 and q4 gave the same text on every prompt: the equality test would prove nothing"


def test_a_4bit_model_knows_its_arithmetic_and_runs_lookup_alone_as_hispec(a8_exact):
    """EarlyExitModel.arithmetic names the model's own 4-bit arithmetic, which picks hispec's own list."""
    q4 = EarlyExitModel(to_q4(tiny_model("llama", layers=8, seed=9)))
    assert q4.arithmetic == "q4" and a8_exact.arithmetic == "a8"
    assert EarlyExitModel(tiny_model("llama", layers=8, seed=9)).arithmetic is None
    for ee in (q4, a8_exact):
        assert preset("hispec", policy="auto").resolve_for(ee).levels == ("lookup",)
