"""The lean forward path (hispec/lean.py) against transformers' stock layers."""

import json

import pytest
import torch
from helpers import hf_greedy, save_tiny_folder, tiny_model

from hispec.engine.config import preset
from hispec.model.early_exit import EarlyExitModel
from hispec.errors import ConfigError
from hispec.model.lean import LeanPath
from hispec.evaluation.profile import break_even
from hispec.runs.runner import run

ARCHS = ["llama", "qwen2", "qwen3", "mistral"]


def _model(arch):
    extra = {"attention_bias": True} if arch == "llama" else {}  # cover fused q/k/v biases on llama too
    model = tiny_model(arch, seed=5, **extra)
    if arch == "llama":
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.2)
    return model


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "plain"])
def test_layer_ranges_match_stock_layers(arch, pack):
    """Same hidden states and the same cache contents for prefill, 1-token and 5-token calls
    over ranges that start and end mid-model."""
    model = _model(arch)
    stock, lean = EarlyExitModel(model, lean=False), EarlyExitModel(model, lean=False)
    lean.lean = LeanPath(lean, pack=pack)
    lean.final_head.lean = lean.lean
    caches = {id(ee): ee.new_cache(64) for ee in (stock, lean)}
    torch.manual_seed(0)
    for q_len in (7, 1, 5, 1):  # prefill, then growing contexts
        hidden = torch.randn(1, q_len, model.config.hidden_size)
        outs = []
        for ee in (stock, lean):
            h = ee.run_layers(hidden, 0, 3, caches[id(ee)])
            h = ee.run_layers(h, 3, 8, caches[id(ee)])
            outs.append((h, ee.exit_logits(h, 8)))
        torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-3, atol=1e-3)
    a, b = caches[id(stock)], caches[id(lean)]
    assert a.lengths == b.lengths == [14] * 8
    for layer in (0, 4, 7):
        torch.testing.assert_close(b.keys[layer][..., :14, :], a.keys[layer][..., :14, :], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(b.values[layer][..., :14, :], a.values[layer][..., :14, :], rtol=1e-3, atol=1e-3)


def test_engine_uses_the_lean_path_by_default_and_can_switch(monkeypatch):
    model = tiny_model("llama")
    ee = EarlyExitModel(model)
    assert ee.lean is not None and ee.stock_reason is None
    assert ee.lean.packed == torch.backends.mkldnn.is_available()
    ee.set_lean(False)
    assert ee.lean is None and ee.final_head.lean is None
    monkeypatch.setenv("HISPEC_LEAN", "0")
    assert EarlyExitModel(model).lean is None


@pytest.mark.parametrize("method,extra", [("autoregressive", {}), ("layerskip", {"draft_layer": 3}),
                                          ("hispec", {"draft_layer": 2, "verify_layer": 5})])
def test_stock_path_stays_exact(method, extra):
    """The stock layers remain a working engine path (accelerate-dispatched models use it)."""
    model = tiny_model("qwen2", seed=9)
    config = preset(method, max_new_tokens=30, policy="fixed", **extra)
    result = run(EarlyExitModel(model, lean=False), [4, 8, 15], config)
    assert result.token_ids == hf_greedy(model, [4, 8, 15], 30)


def test_models_the_lean_path_cannot_reproduce_keep_the_stock_path(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = save_tiny_folder(tmp_path / "m")
    device_map = {"model.embed_tokens": "cpu", "model.rotary_emb": "cpu", "model.norm": "cpu", "lm_head": "cpu"}
    device_map.update({f"model.layers.{i}": "cpu" if i < 3 else "disk" for i in range(8)})
    spread = AutoModelForCausalLM.from_pretrained(folder, device_map=device_map, offload_folder=tmp_path / "off")
    ee = EarlyExitModel(spread)
    assert ee.lean is None and "accelerate" in ee.stock_reason
    with pytest.raises(ConfigError, match="lean path cannot run this model: layers are dispatched by accelerate"):
        ee.set_lean(True)

    dynamic = tiny_model("llama", rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    reason = LeanPath.support(dynamic)
    assert reason is not None and "dynamic" in reason


def test_break_even_acceptance():
    # Drafting free, verifying k tokens as cheap as one step: any acceptance breaks even.
    assert break_even(0.0, {4: 10.0}, 10.0, 4) == pytest.approx(0.0, abs=1e-3)
    # A round costing 2 steps needs (1 - a^5) / (1 - a) = 2 tokens per round: a ~ 0.5.
    a = break_even(2.5, {4: 10.0}, 10.0, 4)
    assert (1 - a**5) / (1 - a) == pytest.approx(2.0, rel=1e-3)
    # A round costing more than k + 1 steps never pays.
    assert break_even(20.0, {4: 10.0}, 10.0, 4) is None


def test_layerskip_round_counts_the_drafts_second_pass_and_one_final_head():
    from hispec.evaluation.profile import layerskip_round_ms

    # 30 layers, exit 4: draft layers 2 ms, exit head 1 ms, a 2-token full step 17 ms of which
    # 2 ms is the final head.
    draft, verify = layerskip_round_ms(2.0, 1.0, 17.0, 2.0, exit_layer=4, num_layers=30, k=1)
    assert draft == pytest.approx(3.0)
    # the draft's own pass through [0, 4) + 26/30 of the 15 ms of layers + one final head
    assert verify == pytest.approx(2.0 + 15.0 * 26 / 30 + 2.0)
    # the round costs more than one plain step, so the break-even acceptance is above zero
    assert 0.1 < break_even(draft, {1: verify}, 17.0, 1) < 0.5


def test_profile_command_json(tmp_path, capsys):
    from hispec.cli.main import main

    folder = save_tiny_folder(tmp_path / "m")
    assert main(["profile", "--model", str(folder), "--context", "16", "--repeats", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    for key in ("full_step_ms", "hf_full_step_ms", "stock_layers_full_step_ms", "draft_range_ms"):
        assert sorted(int(n) for n in out[key]) == [1, 2, 4, 8, 16]
        assert all(v > 0 for v in out[key].values())
    assert out["lean"] is True and out["num_layers"] == 8 and out["context"] == 16
    assert "final" in out["heads_ms"] and set(out["break_even_acceptance"]) == {"lean", "stock"}
    assert set(out["heads_hot_ms"]) == set(out["heads_ms"])  # every head timed both ways


def test_profile_command_table_and_errors(tmp_path, capsys):
    from hispec.cli.main import main

    folder = save_tiny_folder(tmp_path / "m")
    assert main(["profile", "--model", str(folder), "--context", "8", "--repeats", "1", "--stock"]) == 0
    text = capsys.readouterr().out
    assert "engine path: stock" in text and "hf forward" in text
    assert main(["profile", "--model", str(folder), "--context", "250"]) == 2
    assert "exceeds the model's context of 256 tokens" in capsys.readouterr().err


def test_unpacked_fusion_shares_the_weights_memory():
    """Without packing (GPU, large models) fused q/k/v and gate/up are the modules' own storage."""
    model = tiny_model("llama", seed=2)
    ref = hf_greedy(model, [3, 9], 12)
    ee = EarlyExitModel(model, lean=False)
    ee.lean = LeanPath(ee, pack=False)
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    q, k, v = attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight
    assert k.data_ptr() == q.data_ptr() + q.numel() * q.element_size()
    assert v.data_ptr() == k.data_ptr() + k.numel() * k.element_size()
    assert mlp.up_proj.weight.data_ptr() == mlp.gate_proj.weight.data_ptr() + mlp.gate_proj.weight.numel() * 4
    assert ee.lean.layers[0].qkv.weight.data_ptr() == q.data_ptr()
    assert hf_greedy(model, [3, 9], 12) == ref  # transformers' own forward is unchanged


def test_layers_with_forward_hooks_keep_the_stock_path():
    model = tiny_model("llama")
    calls = []
    model.model.layers[3].register_forward_pre_hook(lambda *a: calls.append(1))
    ee = EarlyExitModel(model)
    assert ee.lean is None and "forward hooks" in ee.stock_reason
    run(ee, [4, 5], preset("autoregressive", max_new_tokens=3))
    assert calls, "the stock path calls the model's own layers, hooks included"
