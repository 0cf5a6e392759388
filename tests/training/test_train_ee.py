"""LayerSkip-style early-exit training as LoRA adapters (hispec/training/layerskip/, model/lora.py,
gguf_pack.py, scripts/gpu/gpu_train_ee.py), on tiny random models."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import save_tiny_folder, tiny_model

from hispec.errors import ConfigError, ModelLoadError
from hispec.model import lora
from hispec.training.layerskip.data import greedy_continuations, pack
from hispec.training.layerskip.evaluation import evaluate
from hispec.training.layerskip.train import TrainConfig, active_exits, dropout_rates, exit_weights, prepare_model, step_loss, train

ROOT = Path(__file__).resolve().parents[2]


def self_data(model, n_train=24, n_held=4, new=24, seed=1):
    """Random prompts and the model's own greedy continuations."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 100, (8,), generator=g) for _ in range(n_train + n_held)]
    conts = greedy_continuations(model, prompts, new, eos_ids={2}, pad_id=0, batch_size=8)
    return {"meta": {"spec": "test"},
            "train": {"prompt": prompts[:n_train], "continuation": conts[:n_train]},
            "heldout": {"prompt": prompts[n_train:], "continuation": conts[n_train:]},
            "heldout_text": [p.clone() for p in prompts[n_train:]]}


def small_cfg(**kw):
    base = dict(steps=40, rank=4, batch_size=4, seq_len=32, lr=2e-2, save_every=100, log_every=5,
                layer_dropout=0.0, exit_kd=1.0)
    base.update(kw)
    return TrainConfig(**base)


def test_fresh_adapters_change_nothing_and_can_be_switched_off():
    model = tiny_model("llama", layers=4, seed=3)
    ids = torch.randint(3, 100, (1, 12))
    before = model(ids).logits
    adapters = lora.attach_lora(model, rank=4, alpha=8)
    assert len(adapters) == 4 * 7
    assert torch.equal(model(ids).logits, before)  # B starts at zero
    with torch.no_grad():
        for m in adapters.values():
            m.lora_B.normal_()
    assert not torch.allclose(model(ids).logits, before)
    with lora.adapters_disabled(model):
        assert torch.equal(model(ids).logits, before)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n for n in trainable)


def test_layerskip_curricula():
    rates = dropout_rates(8, 0.2)
    assert rates[0] == 0 and abs(float(rates[-1]) - 0.2) < 1e-6 and bool((rates[1:] > rates[:-1]).all())
    w = exit_weights([2, 4, 6], "depth")
    assert w[6] > w[4] > w[2] and abs(sum(w.values()) - 1) < 1e-9
    assert active_exits([1, 2, 3, 4, 5], 2, 0) == [1, 3, 5] and active_exits([1, 2, 3, 4, 5], 2, 1) == [2, 4]
    assert active_exits([1, 2, 3], 0, 7) == [1, 2, 3]


def test_loss_goes_down_and_exit_agreement_rises(tmp_path):
    model = tiny_model("llama", layers=6, seed=0, initializer_range=0.05)
    data = self_data(model)
    data["heldout"] = data["train"]  # agreement measured on the text trained on: the tiny model memorises
    cfg = small_cfg(lr=3e-3)
    fixed = pack(data, cfg.seq_len)[:8]  # a fixed batch of training chunks
    prepare_model(model, cfg)
    exits = list(range(1, 6))
    weights = exit_weights(exits, "depth")
    exit_kl = lambda f: np.mean([f[f"exit{e}"]["kl"] for e in exits])
    _, before_fig = step_loss(model, fixed, cfg, exits, weights, None, False)
    before = evaluate(model, data, max_seqs=8)
    result = train(model, data, cfg, tmp_path, lora.base_identity(model, "tiny"), progress=False)
    _, after_fig = step_loss(model, fixed, cfg, exits, weights, None, False)
    after = evaluate(model, data, max_seqs=8)
    assert result.steps_done == 40 and not result.stopped_early
    assert after_fig["loss"] < 0.95 * before_fig["loss"]
    assert exit_kl(after_fig) < 0.92 * exit_kl(before_fig)
    mean = lambda r: np.mean(list(r["exit_agreement"]["tuned"].values()))
    assert before["exit_agreement"]["tuned"] == before["exit_agreement"]["original"]
    assert mean(after) > mean(before) + 0.15
    assert after["exit_agreement"]["original"] == before["exit_agreement"]["original"]
    assert after["fidelity"]["greedy_token_match"] > 0.5
    assert (tmp_path / "checkpoint.pt").is_file() and (tmp_path / "train_log.jsonl").is_file()


def test_layer_dropout_trains_too(tmp_path):
    model = tiny_model("llama", layers=4, seed=0)
    data = self_data(model, n_train=8, n_held=2, new=12)
    r = train(model, data, small_cfg(steps=4, layer_dropout=0.5, rotation=2, exit_kd=0.5, final_ce=0.5),
              tmp_path, lora.base_identity(model, "tiny"), progress=False)
    assert r.steps_done == 4 and all(np.isfinite(h["loss"]) for h in r.history)


def test_adapters_save_load_and_merge_to_base_plus_scaled_product(tmp_path):
    model = tiny_model("llama", layers=4, seed=2)
    base_copy = copy.deepcopy(model)
    identity = lora.base_identity(model, "tiny")
    adapters = lora.attach_lora(model, rank=3, alpha=6.0, targets=("q_proj", "down_proj"), layers=[1, 3])
    with torch.no_grad():
        for m in adapters.values():
            m.lora_B.normal_(0, 0.05)
    lora.save_adapter(model, tmp_path, {"base": identity, "training": {"targets": ["q_proj", "down_proj"]}})
    manifest, tensors = lora.read_adapter(tmp_path)
    assert manifest["rank"] == 3 and manifest["scale"] == 2.0 and len(manifest["modules"]) == 4
    assert manifest["base"]["fingerprint"] == identity["fingerprint"]
    merged = copy.deepcopy(base_copy)
    assert lora.merge_adapter(merged, manifest, tensors) == 4
    for name, module in adapters.items():
        a, b = tensors[f"{name}.lora_A"], tensors[f"{name}.lora_B"]
        assert torch.equal(a, module.lora_A.detach()) and torch.equal(b, module.lora_B.detach())
        w_base = dict(base_copy.named_parameters())[f"{name}.weight"]
        w_merged = dict(merged.named_parameters())[f"{name}.weight"]
        assert torch.equal(w_merged, w_base + 2.0 * (b @ a))
    untouched = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(dict(merged.named_parameters())[untouched], dict(base_copy.named_parameters())[untouched])
    ids = torch.randint(3, 100, (1, 10))
    assert torch.allclose(merged(ids).logits, model(ids).logits, atol=1e-4)
    # load into a freshly wrapped model: identical outputs
    other = copy.deepcopy(base_copy)
    lora.attach_lora(other, rank=3, alpha=6.0, targets=("q_proj", "down_proj"), layers=[1, 3])
    lora.load_adapter_state(other, tensors)
    assert torch.equal(other(ids).logits, model(ids).logits)


def test_merge_refuses_an_adapter_of_another_base(tmp_path):
    model = tiny_model("llama", layers=4, seed=2)
    lora.attach_lora(model, rank=2)
    lora.save_adapter(model, tmp_path, {"base": lora.base_identity(model, "tiny")})
    with pytest.raises(ModelLoadError, match="another base model"):
        lora.merge_adapter(tiny_model("llama", layers=4, seed=9), *lora.read_adapter(tmp_path))
    with pytest.raises(ModelLoadError, match="no adapter"):
        lora.read_adapter(tmp_path / "nowhere")


def test_resume_continues_exactly_from_a_checkpoint(tmp_path):
    seed_model = tiny_model("llama", layers=4, seed=5)
    data = self_data(seed_model, n_train=10, n_held=2, new=16)
    identity = lora.base_identity(seed_model, "tiny")
    cfg = lambda: small_cfg(steps=6, save_every=3, log_every=1, layer_dropout=0.3, rotation=2)
    straight = copy.deepcopy(seed_model)
    train(straight, data, cfg(), tmp_path / "a", identity, progress=False)

    half = copy.deepcopy(seed_model)
    r = train(half, data, cfg(), tmp_path / "b", identity, progress=False, stop_at=3)  # "interrupted"
    assert r.steps_done == 3 and r.stopped_early
    resumed = copy.deepcopy(seed_model)  # a new process would rebuild the model from scratch
    r = train(resumed, data, cfg(), tmp_path / "b", identity, resume=True, progress=False)
    assert r.steps_done == 6 and [h["step"] for h in r.history] == [1, 2, 3, 4, 5, 6]
    a, b = lora.adapter_state(straight), lora.adapter_state(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    with pytest.raises(ConfigError, match="rank"):
        train(copy.deepcopy(seed_model), data, small_cfg(steps=8, rank=2), tmp_path / "b", identity,
              resume=True, progress=False)
    with pytest.raises(ConfigError, match="no checkpoint"):
        train(copy.deepcopy(seed_model), data, cfg(), tmp_path / "c", identity, resume=True, progress=False)


def test_time_budget_stops_with_a_checkpoint(tmp_path):
    model = tiny_model("llama", layers=4, seed=0)
    data = self_data(model, n_train=8, n_held=2, new=12)
    r = train(model, data, small_cfg(steps=50, max_seconds=0.0), tmp_path, lora.base_identity(model, "t"),
              progress=False)
    assert r.stopped_early and r.steps_done == 1
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 1


def test_bad_settings_are_clear_errors():
    model = tiny_model("llama", layers=4)
    with pytest.raises(ConfigError, match="exit 4 is impossible"):
        TrainConfig(exits=(1, 4)).validate(4)
    with pytest.raises(ConfigError, match="layer-dropout"):
        TrainConfig(layer_dropout=1.0).validate(4)
    with pytest.raises(ConfigError, match="unknown LoRA target"):
        lora.parse_targets("q_proj,wq")
    with pytest.raises(ConfigError, match="rank"):
        lora.attach_lora(model, rank=0)
    assert lora.parse_targets("attention,down_proj") == ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj")


def test_default_ee_without_a_shipped_adapter_is_a_clear_error(tmp_path, monkeypatch):
    from hispec.model.loading import load_model

    monkeypatch.setenv("HISPEC_DEFAULT_EE", str(tmp_path / "empty"))
    with pytest.raises(ModelLoadError, match="default-ee.*does not ship one.*--model default"):
        load_model("default-ee", device="cpu")


def test_cli_trains_evaluates_and_saves_on_a_local_model(tmp_path, capsys):
    from hispec.cli.main import main

    folder = save_tiny_folder(tmp_path / "tiny", layers=4)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {w} twice"}) + "\n"
                               for w in ["cat", "dog", "sun", "sea", "red", "big", "old", "new"]))
    out = tmp_path / "run"
    common = ["--model", str(folder), "--out", str(out), "--prompts", str(prompts), "--heldout", "2",
              "--max-new-tokens", "8", "--batch-size", "2", "--seq-len", "16", "--rank", "2", "--free-run", "1",
              "--no-progress", "--device", "cpu"]
    assert main(["train-ee", *common, "--steps", "3", "--save-every", "2"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["training"]["steps_done"] == 3 and manifest["exits"] == {"draft": 1, "verify": 2}
    assert set(manifest["figures"]["exit_agreement"]["tuned"]) == {"1", "2", "3"}
    assert main(["train-ee", *common, "--steps", "5", "--resume"]) == 0
    assert json.loads((out / "manifest.json").read_text())["training"]["steps_done"] == 5
    assert main(["train-ee", *common, "--eval-only", "--adapter", str(out), "--out", str(tmp_path / "ev")]) == 0
    assert json.loads((tmp_path / "ev" / "eval.json").read_text())["has_adapters"] is True
    assert "exit agreement" in capsys.readouterr().out
    assert main(["train-ee", *common, "--exits", "0,9", "--steps", "1"]) == 2  # a message, not a traceback


def test_dequantization_matches_gguf_py():
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from gguf_pack import _reverse_permute
    from gguf_pack import dequantize as ours

    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.05, size=(12, 64)).astype(np.float32)
    for qtype in ("Q8_0", "Q4_1"):
        raw = quantize(w, GGMLQuantizationType[qtype])
        ref = dequantize(raw, GGMLQuantizationType[qtype])
        mine = ours(torch.from_numpy(raw.reshape(-1).copy()), qtype, [12, 64])
        assert torch.equal(mine, torch.from_numpy(ref))
    # llama.cpp's q/k row interleaving, undone as transformers does
    x = torch.arange(8 * 2).reshape(8, 2)
    assert _reverse_permute(x, 2)[:, 0].tolist() == [0, 4, 2, 6, 8, 12, 10, 14]


def _gpu_script():
    spec = importlib.util.spec_from_file_location("gpu_train_ee", ROOT / "scripts" / "gpu" / "gpu_train_ee.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_script_pipeline_on_a_tiny_model(tmp_path):
    script = _gpu_script()
    out = tmp_path / "out"
    rc = script.main(["run", "--tiny", "--device", "cpu", "--dtype", "float32", "--out", str(out),
                      "--work", str(tmp_path / "work"), "--budget-s", "120", "--reserve-s", "30", "--steps", "12",
                      "--smoke-steps", "3", "--batch-size", "4", "--seq-len", "32", "--max-new-tokens", "12",
                      "--gen-batch", "8", "--free-run", "1", "--rank", "4"])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"adapter.safetensors", "manifest.json", "eval.json", "run.json",
                                               "train_log.jsonl"}
    run = json.loads((out / "run.json").read_text())
    assert run["trained"]["steps"] == run["planned_steps"] <= 12 and run["smoke"]["s_per_step"] > 0
    manifest, tensors = lora.read_adapter(out)
    d, v = manifest["exits"]["draft"], manifest["exits"]["verify"]
    assert 0 < d < v < 6
    model, _ = script.tiny_setup("cpu", None)
    assert lora.merge_adapter(model, manifest, tensors) == 6 * 7
    assert script.choose_exits({"1": 0.2, "2": 0.55, "3": 0.75, "4": 0.8, "5": 0.9}, 6) == (2, 3)
    assert script.choose_exits({"1": 0.1, "2": 0.1, "3": 0.1}, 4) == (1, 2)  # goals missed: L/8, L/4
    late = {str(e): 0.0 for e in range(1, 30)} | {"28": 0.6, "29": 0.8}
    assert script.choose_exits(late, 30) == (4, 8)  # reached only near the top: not worth it


def test_gpu_script_run_names_a_missing_part(tmp_path, monkeypatch):
    script = _gpu_script()
    monkeypatch.setattr(script, "STAGE", tmp_path / "stage")
    monkeypatch.setattr(script, "CARRY", tmp_path / "carry")
    (tmp_path / "carry" / "part2").mkdir(parents=True)
    (tmp_path / "carry" / "part2" / "pack.json").write_text(json.dumps(
        {"parts": [{"file": "base-part1.safetensors", "sha256": "0"}, {"file": "base-part2.safetensors",
                                                                      "sha256": "0"}]}))
    assert script.main(["run", "--device", "cpu", "--out", str(tmp_path / "out")]) == 3
    assert "base-part1.safetensors is missing" in (tmp_path / "out" / "run.json").read_text()


@pytest.mark.real_model
def test_packed_default_model_rebuilds_bit_exactly(tmp_path, real_model_threads):
    from gguf_pack import build_model, pack_gguf
    from hispec.model.loading import default_gguf_path, default_model_folder, load_model

    lm = load_model("default", device="cpu", dtype="float32", exits="none")
    pack = pack_gguf(default_gguf_path(), default_model_folder(), tmp_path, max_part_mb=48,
                     fingerprint=lora.model_fingerprint(lm.model))
    assert len(pack["parts"]) == 2 and all(p["bytes"] < 60 * 2**20 for p in pack["parts"])
    rebuilt = build_model(tmp_path)  # checks the fingerprint itself
    ref = lm.model.state_dict()
    assert all(torch.equal(ref[k], v) for k, v in rebuilt.state_dict().items())


@pytest.mark.real_model
def test_default_ee_merges_the_shipped_adapter(tmp_path, monkeypatch, real_model_threads):
    from hispec.model.heads import preferred_layers
    from hispec.model.loading import load_model

    base = load_model("default", device="cpu", dtype="float32", exits="none")
    identity = lora.base_identity(base.model, "default")
    wrapped = copy.deepcopy(base.model)
    adapters = lora.attach_lora(wrapped, rank=1, alpha=1.0, targets=("v_proj",), layers=[0])
    with torch.no_grad():
        adapters["model.layers.0.self_attn.v_proj"].lora_B.normal_(0, 0.01)
    lora.save_adapter(wrapped, tmp_path, {"base": identity, "exits": {"draft": 3, "verify": 9}})
    monkeypatch.setenv("HISPEC_DEFAULT_EE", str(tmp_path))
    ee = load_model("default-ee", device="cpu", dtype="float32")
    m = adapters["model.layers.0.self_attn.v_proj"]
    w0 = base.model.model.layers[0].self_attn.v_proj.weight
    assert torch.equal(ee.model.model.layers[0].self_attn.v_proj.weight, w0 + m.scale * (m.lora_B @ m.lora_A).detach())
    assert torch.equal(ee.model.model.layers[1].self_attn.v_proj.weight, base.model.model.layers[1].self_attn.v_proj.weight)
    assert preferred_layers(ee.ee) == (3, 9)
    assert load_model("default", device="cpu").model.model.layers[0].self_attn.v_proj.weight.equal(w0)
