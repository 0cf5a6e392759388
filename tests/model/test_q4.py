"""4-bit weights in the file's own formats (hispec/model/formats/q4.py, csrc/q4_kernel.cpp): the kernel's
products, its batch invariance on both builds (AVX-512 and AVX2), exactness of every method in 4-bit
against 4-bit plain decoding, exit heads, GGUF reading (q/k rows back in transformers' order), the
switch in load_model and the bench, and (real_model) the default model's own file."""

import json
import random

import numpy as np
import pytest
import torch
from helpers import hf_greedy, kernel_product, tiny_model

from hispec.engine.config import DecodeConfig, preset
from hispec.errors import ConfigError, ModelLoadError
from hispec.runs.runner import run
from hispec.model.formats import q4_kernel
from hispec.model.early_exit import EarlyExitModel
from hispec.model.heads import make_heads
from hispec.model.formats.q4 import (Q4_1, Q8_0, Q4Linear, Q8Embedding, QuantizedMatrix, WeightView, cached_gguf, is_q4,
                             quantize_q4_1, quantize_q8_0, read_gguf, to_q4, weight_bytes)

REASON = q4_kernel.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"4-bit kernel unavailable here: {REASON}")
# Both builds where the CPU has AVX-512 (the AVX2 one is what a host without AVX-512 runs); AVX2 only otherwise.
ISAS = [isa for isa in ("avx512", "avx2") if q4_kernel.host_isa() == "avx512" or isa == "avx2"]
QUANTIZE = {Q4_1: quantize_q4_1, Q8_0: quantize_q8_0}


def _product(matrix: QuantizedMatrix, x: torch.Tensor, isa: str) -> torch.Tensor:
    return kernel_product(matrix, x, isa)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (37, 64)], ids=["qkv", "down", "odd-columns"])
def test_product_matches_the_dequantised_weights(kind, isa, shape):
    torch.manual_seed(0)
    matrix = QUANTIZE[kind](torch.randn(shape) * 0.05)
    x = torch.randn(5, shape[1])
    ref = (x.double() @ matrix.dequantize().double().T).float()
    torch.testing.assert_close(_product(matrix, x, isa), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", [Q4_1, Q8_0])
@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (37, 64)], ids=["qkv", "down", "odd-columns"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(kind, isa, shape, threads):
    """One row alone vs the same row among 1, 2, 4, 8, 16 (and 33) rows, at every position, with
    other neighbours each time: identical bits, on both builds and any thread count."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(1)
        matrix = QUANTIZE[kind](torch.randn(shape, generator=g) * 0.05)
        row = torch.randn(1, shape[1], generator=g)
        alone = _product(matrix, row, isa)
        for n in (1, 2, 4, 8, 16, 33):
            for pos in sorted({0, n // 2, n - 1}):
                batch = torch.randn(n, shape[1], generator=g)
                batch[pos] = row[0]
                assert torch.equal(_product(matrix, batch, isa)[pos], alone[0]), (n, pos)
    finally:
        torch.set_num_threads(before)


def test_the_two_builds_are_each_chosen_by_the_environment(monkeypatch):
    monkeypatch.delenv("HISPEC_Q4_ISA", raising=False)
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert q4_kernel.host_isa() == "avx2"  # torch's kernels held to AVX2: ours too
    monkeypatch.setenv("HISPEC_Q4_ISA", "avx2")
    assert q4_kernel.host_isa() == "avx2"
    for isa in ISAS:
        assert q4_kernel.load(isa).hispec_q4_isa().decode() == isa


def test_rows_are_the_files_values_and_views_stay_4bit():
    torch.manual_seed(2)
    w = torch.randn(8, 64)
    m41 = quantize_q4_1(w)
    d = m41.d.view(torch.float16).float().repeat_interleave(32, -1)
    mins = m41.m.view(torch.float16).float().repeat_interleave(32, -1)
    packed = m41.qs.view(8, 2, 16)
    q = torch.cat([packed & 15, packed >> 4], -1).reshape(8, 64).float()
    assert torch.equal(m41.dequantize(), q * d + mins)
    assert (m41.dequantize() - w).abs().max() < 0.2  # a quantisation, not noise
    m80 = quantize_q8_0(w)
    assert torch.equal(m80.rows([3, 1]), m80.qs[[3, 1]].float() * m80.d[[3, 1]].view(torch.float16).float().repeat_interleave(32, -1))
    view = WeightView(m41)
    assert view.shape == (8, 64) and view.dtype == torch.float32 and view.detach() is view
    assert torch.equal(view[2], m41.dequantize()[2]) and torch.equal(view[-1], m41.dequantize()[7])
    assert torch.equal(view[torch.tensor([4, 0])], m41.dequantize()[[4, 0]])
    assert torch.equal(torch.cat([view, view]), torch.cat([m41.dequantize()] * 2))  # explicit copies only
    assert m41.nbytes == 8 * 32 + 2 * 8 * 2 * 2


def _q4_model(arch="llama", layers=8, seed=3, **overrides):
    return to_q4(tiny_model(arch, layers=layers, seed=seed, **overrides))


def test_to_q4_swaps_every_product_and_keeps_the_rest():
    model = tiny_model("llama", layers=4, seed=1, tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    to_q4(model)
    assert is_q4(model) and isinstance(model.model.embed_tokens, Q8Embedding)
    assert model.lm_head.matrix is model.model.embed_tokens.matrix  # tied: one copy of the bytes
    for layer in model.model.layers:
        for proj in (layer.self_attn.q_proj, layer.mlp.down_proj):
            assert isinstance(proj, Q4Linear) and proj.matrix.kind == Q4_1
    assert all(p.is_floating_point() and p.ndim == 1 for p in model.parameters())  # norms only
    fp32_bytes = 4 * sum(p.numel() for p in tiny_model("llama", layers=4, seed=1, tie_word_embeddings=True).parameters())
    assert weight_bytes(model) < 0.3 * fp32_bytes


ARCHS = [("llama", {}), ("llama", {"attention_bias": True}), ("qwen2", {}), ("qwen3", {}), ("mistral", {})]
CONFIGS = [
    preset("layerskip", draft_layer=2, draft_len=3),
    preset("hispec", draft_layer=2, verify_layer=5, draft_len=2, verify_threshold=3),
    preset("hispec", draft_layer=1, verify_layer=4, draft_len=3, verify_threshold=1),
    preset("hispec", policy="auto"),
    preset("lookup"),
    preset("hispec", levels=("lookup", 2, 5)),
]


@pytest.mark.parametrize("arch,extra", ARCHS, ids=lambda a: a if isinstance(a, str) else "-".join(a) or "plain")
def test_every_method_in_4bit_equals_4bit_plain_decoding(arch, extra):
    model = _q4_model(arch, seed=5, **extra)
    ee = EarlyExitModel(model)
    assert ee.lean is not None and not ee.lean.packed, ee.stock_reason  # the lean path, on the 4-bit products
    r = random.Random(0)
    for prompt in ([5, 9, 11, 3, 7, 5, 9, 11], [r.randrange(3, 100) for _ in range(12)], [70]):
        ref = run(ee, prompt, preset("autoregressive", max_new_tokens=40)).token_ids
        for config in CONFIGS:
            from dataclasses import replace

            assert run(ee, prompt, replace(config, max_new_tokens=40)).token_ids == ref, (prompt, config)
    # transformers' own layers and generate() on the same 4-bit modules: the same tokens
    prompt = [5, 9, 11, 3, 7]
    ref = run(ee, prompt, preset("autoregressive", max_new_tokens=24)).token_ids
    assert hf_greedy(model, prompt, 24) == ref


def test_exit_heads_work_in_4bit():
    """Attention heads with a vocabulary subset (the shipped heads' kind) on a 4-bit model: they
    start from the layer's dequantised attention, score the file's LM-head rows through the 4-bit
    kernel, and hispec with them still equals 4-bit plain decoding."""
    model = _q4_model(seed=7)
    ee = EarlyExitModel(model)
    vocab = torch.arange(3, 60)
    heads = make_heads(ee, [2, 5], vocab_ids=vocab, head_type="attention")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for head in heads.values():
            head.proj.copy_(torch.randn(head.proj.shape, generator=g) * 0.3)
    assert torch.equal(heads[2]._sub_weight.dequantize(), model.lm_head.matrix.rows(vocab))  # the file's rows, in 4-bit
    x = torch.randn(3, 64)
    torch.testing.assert_close(heads[2].subset_logits(x), heads[2].features(x) @ model.lm_head.matrix.rows(vocab).T,
                               rtol=1e-5, atol=1e-5)
    ee.attach_exit_heads(heads, {"default_layers": {"draft": 2, "verify": 5}})
    prompt = [5, 17, 33, 2, 9, 41]
    ref = run(ee, prompt, preset("autoregressive", max_new_tokens=30)).token_ids
    for config in (preset("hispec", draft_layer=2, verify_layer=5, draft_len=2, verify_threshold=2,
                                max_new_tokens=30),
                   preset("layerskip", draft_layer=5, draft_len=3, max_new_tokens=30),
                   preset("hispec", policy="auto", max_new_tokens=30)):
        assert run(ee, prompt, config).token_ids == ref, config


def _permute_like_llama_cpp(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf permutation of q/k rows (its rotary layout)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def test_read_gguf_puts_q_and_k_rows_back_in_transformers_order(tmp_path):
    import gguf
    from gguf import quants

    model = tiny_model("llama", layers=2, seed=9)
    config = model.config
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    names = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    expected = {}
    for i, layer in enumerate(model.model.layers):
        for part in ("self_attn", "mlp"):
            for name, gname in names.items():
                if not hasattr(getattr(layer, part), name):
                    continue
                w = getattr(getattr(layer, part), name).weight.detach().numpy()
                stored = w
                if name == "q_proj":
                    stored = _permute_like_llama_cpp(w, config.num_attention_heads)
                elif name == "k_proj":
                    stored = _permute_like_llama_cpp(w, config.num_key_value_heads)
                q = quants.quantize(stored, gguf.GGMLQuantizationType.Q4_1)
                writer.add_tensor(f"blk.{i}.{gname}.weight", q, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.Q4_1)
                # what transformers' dequantising loader computes: dequantise, then permute back
                expected[f"model.layers.{i}.{part}.{name}"] = quants.dequantize(quants.quantize(w, gguf.GGMLQuantizationType.Q4_1),
                                                                                gguf.GGMLQuantizationType.Q4_1)
    emb = model.model.embed_tokens.weight.detach().numpy()
    q8 = quants.quantize(emb, gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    matrices = read_gguf(path, config)
    assert matrices["model.embed_tokens"].kind == Q8_0
    assert torch.equal(matrices["model.embed_tokens"].dequantize(),
                       torch.from_numpy(quants.dequantize(q8, gguf.GGMLQuantizationType.Q8_0)))
    for key, values in expected.items():
        assert matrices[key].kind == Q4_1
        assert torch.equal(matrices[key].dequantize(), torch.from_numpy(values)), key
    for _ in range(2):  # the cache beside a converted model: written once, then read back as the same bytes
        cached = cached_gguf(path, config, tmp_path / "cache")
        assert sorted(cached) == sorted(matrices)
        for key, matrix in matrices.items():
            assert cached[key].kind == matrix.kind and torch.equal(cached[key].qs, matrix.qs)
            assert torch.equal(cached[key].d, matrix.d) and (matrix.m is None or torch.equal(cached[key].m, matrix.m))
    to_q4(model, matrices)  # the file's blocks in the model; the untied LM head is quantised here
    assert model.model.layers[1].self_attn.k_proj.matrix is matrices["model.layers.1.self_attn.k_proj"]


def test_the_switch_refuses_what_it_cannot_run(monkeypatch):
    from hispec.model.loading import load_model, resolve_weights

    assert resolve_weights("q4") == "q4" and resolve_weights("FP32") == "fp32"
    monkeypatch.delenv("HISPEC_WEIGHTS", raising=False)
    assert resolve_weights(None) == "fp32"
    monkeypatch.setenv("HISPEC_WEIGHTS", "q4")
    assert resolve_weights(None) == "q4"
    monkeypatch.setenv("HISPEC_WEIGHTS", "int3")
    with pytest.raises(ConfigError, match="HISPEC_WEIGHTS"):
        resolve_weights(None)
    with pytest.raises(ConfigError, match="GGUF"):
        load_model("some/other-model", weights="q4")
    monkeypatch.setenv("HISPEC_WEIGHTS", "q4")  # the setting: other models stay float32 (and fail here as usual)
    with pytest.raises(ModelLoadError, match="could not load model"):
        load_model("some/other-model")
    monkeypatch.delenv("HISPEC_WEIGHTS")
    with pytest.raises(ConfigError, match="CPU"):
        load_model("default", weights="q4", device="cuda")
    with pytest.raises(ConfigError, match="float32"):
        load_model("default", weights="q4", dtype="bfloat16")
    # a8 (the same blocks, int8 activations): the same switch, the same checks, its own name in each refusal
    assert resolve_weights("A8") == "a8"
    with pytest.raises(ConfigError, match=r"'int3': choose fp32 .*, q4 .*, a8 .* or fp32-torch"):
        resolve_weights("int3")
    with pytest.raises(ConfigError, match="--weights a8 runs the 4-bit blocks of a GGUF file"):
        load_model("some/other-model", weights="a8")
    with pytest.raises(ConfigError, match="--weights a8 runs on the CPU"):
        load_model("default", weights="a8", device="cuda")
    with pytest.raises(ConfigError, match="--weights a8 computes in float32"):
        load_model("default", weights="a8", dtype="bfloat16")


def test_bench_runs_both_formats_side_by_side(tmp_path, monkeypatch):
    """METHOD@FORMAT runs on that format's model; each format's methods are judged against its own
    plain decoding; the host and the memory bound are recorded."""
    from helpers import EOS, char_tokenizer

    from hispec.evaluation import host
    from hispec.evaluation.bench import benchmark, expand_weights
    from hispec.evaluation.method import BenchMethod
    from hispec.data.prompts import Prompt
    from hispec.model.loading import LoadedModel

    def loaded(model, weights):
        model.generation_config.eos_token_id = EOS
        return LoadedModel("tiny", model, char_tokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "t", weights)

    monkeypatch.setattr(host, "BANDWIDTH_BYTES", 8 * 2**20)  # the real run copies 256 MiB
    fp32 = loaded(tiny_model("llama", layers=8, seed=3), "fp32")
    q4 = loaded(_q4_model(seed=3), "q4")
    methods = expand_weights([BenchMethod.parse("autoregressive"), BenchMethod.parse("hispec/fixed")], ["fp32", "q4"])
    keys = [m.key for m in methods]
    assert keys == ["autoregressive@fp32", "hispec/fixed@fp32", "autoregressive@q4", "hispec/fixed@q4"]
    with pytest.raises(ConfigError):
        BenchMethod.parse("autoregressive@int3")
    sets = {"t": [Prompt("a", "hello there", False), Prompt("b", "abcabcabc", False)]}
    report = benchmark(fp32, sets, methods, preset("hispec", draft_layer=2, verify_layer=5, max_new_tokens=12),
                       json_path=str(tmp_path / "b.json"), models={"fp32": fp32, "q4": q4}, host=True)
    summary = report["summary"]["all"]["methods"]
    assert all(summary[m]["outputs_equal"] for m in keys)  # each against its own format's plain decoding
    assert report["host"]["bandwidth_start"]["copy_gbs"] > 0 and report["host"]["q4_kernel_isa"] in ISAS
    bound = report["memory_bound"]
    assert bound["q4"]["weight_bytes"] < bound["fp32"]["weight_bytes"] / 3 and bound["q4"]["step_ms"] > 0
    assert json.loads((tmp_path / "b.json").read_text())["weights"] == {"fp32": "fp32", "q4": "q4"}


def test_llamacpp_method_says_what_is_missing(monkeypatch):
    from hispec.evaluation.llama_cpp import llamacpp

    monkeypatch.setattr(llamacpp, "available", lambda: False)

    class Fake:
        name = "default"

    with pytest.raises(ConfigError, match="llama-cpp-python"):
        llamacpp.check(Fake())


# ---- the default model's own file ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_pair():
    from helpers import model_threads

    from hispec.model.loading import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(model_threads())
    yield load_model("default", device="cpu", weights="fp32"), load_model("default", device="cpu", weights="q4")
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def default_a8():
    from helpers import model_threads

    from hispec.model.loading import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(model_threads())
    yield load_model("default", device="cpu", weights="a8")
    torch.set_num_threads(before)


@pytest.mark.real_model
def test_the_default_model_loaded_in_a8_runs_int8_activations_and_every_method_equals_its_plain_decoding(default_a8):
    """--weights a8: the exact model is the 4-bit blocks with int8 activations, its LM head too; every
    method equals its own plain decoding; it offers no level more precise than itself."""
    lm = default_a8
    assert lm.weights == "a8" and lm.ee.lean.native.act8 and type(lm.ee.lean.lm_head).__name__ == "A8Head"
    assert lm.ee.formats() == ()
    with pytest.raises(ConfigError, match="int8 activations .*more precise than the model"):
        lm.ee.in_format("q4")
    with pytest.raises(ConfigError, match="already loaded with int8 activations"):
        lm.ee.in_format("a8")
    for prompt in ("Name three colours.", "Write a Python function that adds two numbers."):
        ids = lm.encode(prompt)
        ref = run(lm.ee, ids, preset("autoregressive", max_new_tokens=24), eos_ids=lm.eos_ids).token_ids
        for config in (preset("hispec", policy="auto", max_new_tokens=24), preset("lookup", max_new_tokens=24),
                       preset("layerskip", max_new_tokens=24), DecodeConfig(levels=("lookup", 4), max_new_tokens=24)):
            assert run(lm.ee, ids, config, eos_ids=lm.eos_ids).token_ids == ref, (prompt, config)


@pytest.mark.real_model
def test_default_model_in_4bit_is_the_files_own_weights(default_pair):
    fp32, q4 = default_pair
    assert q4.weights == "q4" and is_q4(q4.model) and sorted(q4.ee.exit_heads) == sorted(fp32.ee.exit_heads)
    assert weight_bytes(q4.model) < 100e6 < 500e6 < weight_bytes(fp32.model)
    for i in (0, 17, 29):  # every projection dequantises to the float32 path's weight, bit for bit
        a, b = fp32.model.model.layers[i], q4.model.model.layers[i]
        for part, name in (("self_attn", "q_proj"), ("self_attn", "k_proj"), ("self_attn", "o_proj"), ("mlp", "down_proj")):
            assert getattr(getattr(b, part), name).matrix.kind == Q4_1
            assert torch.equal(getattr(getattr(a, part), name).weight, getattr(getattr(b, part), name).matrix.dequantize())
    assert q4.model.lm_head.matrix.kind == Q8_0
    assert torch.equal(fp32.model.lm_head.weight[:4096], q4.model.lm_head.matrix.rows(slice(0, 4096)))


@pytest.mark.real_model
def test_every_method_on_the_default_model_in_4bit_equals_its_plain_decoding(default_pair):
    _, lm = default_pair
    for prompt in ("Name three colours.", "Write a Python function that adds two numbers."):
        ids = lm.encode(prompt)
        ref = run(lm.ee, ids, preset("autoregressive", max_new_tokens=24), eos_ids=lm.eos_ids).token_ids
        for config in (preset("layerskip", max_new_tokens=24), preset("hispec", max_new_tokens=24),
                       preset("hispec", policy="auto", max_new_tokens=24), preset("lookup", max_new_tokens=24),
                       preset("hispec", draft_layer=8, verify_layer=20, draft_len=3, verify_threshold=3,
                                    max_new_tokens=24)):
            assert run(lm.ee, ids, config, eos_ids=lm.eos_ids).token_ids == ref, (prompt, config)


@pytest.mark.real_model
def test_a8_levels_on_the_default_model_keep_each_formats_own_output(default_pair):
    """The default model offers 'a8' in both formats (the file's blocks with int8 activations); a list with
    it equals each format's plain decoding, and the a8 model itself agrees with the 4-bit one on most
    tokens, not all (another format: its own greedy text would differ)."""
    for lm in default_pair:
        assert "a8" in lm.ee.formats()
        ids = lm.encode("Write a Python function that adds two numbers.")
        ref = run(lm.ee, ids, preset("autoregressive", max_new_tokens=24), eos_ids=lm.eos_ids).token_ids
        for levels in (("lookup", "full@a8"), ("full@a8",)):
            got = run(lm.ee, ids, DecodeConfig(levels=levels, policy="auto", max_new_tokens=24), eos_ids=lm.eos_ids)
            assert got.token_ids == ref, (lm.weights, levels)
    a8 = default_pair[1].ee.in_format("a8")
    assert a8.lean.native.act8 and a8.model is default_pair[1].model  # shares the 4-bit blocks
