"""Trained exit heads on tiny random models: training helps, heads round-trip, other models'
heads are refused, and greedy output stays exactly the target's with heads and reduced vocabularies."""

import json
import random

import pytest
import torch
from helpers import ee_of, hf_greedy, save_tiny_folder, tiny_model

from hispec.engine.config import preset
from hispec.errors import ModelLoadError
from hispec.runs.runner import run
from hispec.model.heads import (ExitHead, find_and_attach, load_heads, make_heads, model_identity, preferred_layers,
                               save_heads)
from hispec.training.heads.data import collect, frequent_tokens
from hispec.training.heads.pipeline import run as train_run
from hispec.training.heads.train import TrainSettings


def random_prompts(n, seed=0, vocab=100):
    r = random.Random(seed)
    return [[r.randrange(3, vocab) for _ in range(r.randint(3, 9))] for _ in range(n)]


@pytest.fixture(scope="module")
def trained():
    """Heads at layers 2 and 5 of a tiny llama, trained for a few hundred steps."""
    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    heads, manifest, data = train_run(ee, random_prompts(128), [2, 5], max_new_tokens=32, holdout=0.25,
                                      settings=TrainSettings(steps=600, batch_size=64, lr=3e-3), save_dtype="float32")
    return model, ee, heads, manifest, data


def test_fresh_head_is_the_raw_exit():
    """The head's own RMS norm and LM-head call equal the final head's (the lean path's) up to
    rounding: different kernels, so not bit for bit (AVX2 vs AVX-512 hosts differ in the last bit)."""
    ee = ee_of(tiny_model("llama", seed=1))
    hidden = torch.randn(1, 5, 64)
    head = make_heads(ee, [3])[3]
    # float32 norm + 64-wide dot products, logits up to ~8: a few ulp (~1e-6); 1e-5 leaves room, not slack
    torch.testing.assert_close(head(hidden), ee.final_head(hidden), rtol=1e-5, atol=1e-5)
    low = make_heads(ee, [3], rank=8)[3]
    torch.testing.assert_close(low(hidden), ee.final_head(hidden), rtol=1e-5, atol=1e-5)


def test_reduced_vocabulary_scores_only_the_subset():
    ee = ee_of(tiny_model("llama", seed=1))
    ids = torch.tensor([3, 7, 9, 40, 41])
    head = make_heads(ee, [2], vocab_ids=ids)[2]
    hidden = torch.randn(1, 4, 64)
    logits = head(hidden)
    assert logits.shape == (1, 4, 100)
    outside = torch.ones(100, dtype=torch.bool)
    outside[ids] = False
    assert torch.isinf(logits[..., outside]).all() and (logits[..., outside] < 0).all()
    assert torch.allclose(logits[..., ids], ee.final_head(hidden)[..., ids], atol=1e-5)
    assert head._sub_weight.is_contiguous() and head._sub_weight.shape == (5, 64)


def test_frequent_tokens():
    tokens = torch.tensor([5, 5, 5, 9, 9, 1, 7])
    assert frequent_tokens(tokens, 3, 20, always=[2]).tolist() == [2, 5, 9]
    assert frequent_tokens(tokens, 6, 20).tolist() == [0, 1, 2, 5, 7, 9]  # 0 and 2 fill the unseen rest


def test_training_improves_held_out_agreement(trained):
    _, _, _, manifest, _ = trained
    ev = manifest["evaluation"]
    assert ev["tokens"] >= 500
    for layer in ("2", "5"):
        a = ev["agreement"][layer]
        assert a["trained"] > a["raw"] + 0.04, (layer, a)
    assert set(ev["pairs"]) == {"2-5"}
    defaults = manifest["default_layers"]
    assert (defaults["draft"], defaults["verify"]) == (2, 5) and defaults["layerskip_exit"] in (2, 5)
    assert ev["estimate"]["hispec"]["speedup"] > 0 and "2-5" in ev["estimate"]["pairs_at_2_4"]


def test_speed_estimate_follows_agreement():
    from hispec.engine.planning.costs import CostModel
    from hispec.training.heads.estimate import Sequence, estimate

    target = list(range(200))
    perfect = [Sequence(target, {2: target, 5: target})]
    wrong = [Sequence(target, {2: [-1] * 200, 5: [-1] * 200})]
    # a synthetic cost model (seconds): a layer costs a little more for more tokens, the full head most
    costs = CostModel.given({1: 0.48e-3, 4: 0.50e-3, 8: 0.62e-3},
                            {(e, n): 2.4e-3 if e == 8 else 0.75e-3 for e in (2, 5, 8) for n in (1, 8)})
    assert (estimate(perfect, 8, "hispec", 2, 5, 2, 4, costs=costs) > 1.5 > 1
            > estimate(wrong, 8, "hispec", 2, 5, 2, 4, costs=costs))
    assert (estimate(perfect, 8, "layerskip", 2, drafts=4, costs=costs) > 1.5 > 1
            > estimate(wrong, 8, "layerskip", 2, costs=costs))


def test_teacher_data_is_the_models_greedy_output():
    model = tiny_model("llama", seed=4)
    prompts = random_prompts(3, seed=9)
    data = collect(model, prompts, [2], max_new_tokens=10, batch_size=2)
    for i, prompt in enumerate(prompts):
        assert data.tokens[data.seq == i].tolist() == hf_greedy(model, prompt, 10)
    # the stored final hidden state gives back the teacher's token (an argmax, not bits: fp16 storage
    # moves these logits by <2e-3 while their top-2 gaps are >=2e-2, so this holds on any kernel)
    assert torch.equal(model.lm_head(data.final.float()).argmax(-1), data.tokens)


def test_heads_round_trip(trained, tmp_path):
    _, ee, heads, manifest, _ = trained
    save_heads(tmp_path / "exits", heads, manifest, dtype="float32")
    loaded, saved = load_heads(tmp_path / "exits", ee)
    assert sorted(loaded) == [2, 5]
    hidden = torch.randn(1, 3, 64)
    for layer in (2, 5):  # float32 storage, the same weights through the same code: equal bit for bit
        assert torch.equal(loaded[layer](hidden), heads[layer](hidden))
    assert saved["layers"] == [2, 5] and saved["model"]["num_layers"] == 8
    assert saved["evaluation"]["agreement"]["2"] == manifest["evaluation"]["agreement"]["2"]
    # fp16 storage: small, and still close
    save_heads(tmp_path / "half", heads, manifest, dtype="float16")
    half, _ = load_heads(tmp_path / "half", ee)
    assert torch.allclose(half[5](hidden), heads[5](hidden), atol=5e-2)


def test_heads_for_another_model_are_refused(trained, tmp_path):
    _, _, heads, manifest, _ = trained
    save_heads(tmp_path / "exits", heads, manifest)
    same_shape = ee_of(tiny_model("llama", seed=5))
    with pytest.raises(ModelLoadError, match="made for another model.*different weights"):
        load_heads(tmp_path / "exits", same_shape)
    deeper = ee_of(tiny_model("llama", layers=10, seed=4))
    with pytest.raises(ModelLoadError, match="another model.*num_layers differs"):
        find_and_attach(deeper, "x", exits=str(tmp_path / "exits"))
    with pytest.raises(ModelLoadError, match="manifest.json is missing"):
        find_and_attach(deeper, "x", exits=str(tmp_path))


def _perturbed(ee, layers, vocab_ids=None, seed=0):
    """Heads that disagree with the raw exits often (random residual maps)."""
    heads = make_heads(ee, layers, vocab_ids=vocab_ids)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in heads.values():
            head.proj.copy_(torch.randn(head.proj.shape, generator=g) * 0.3)
    return heads


SETTINGS = [
    dict(method="layerskip", draft_layer=2, draft_len=3),
    dict(method="hispec", draft_layer=2, verify_layer=5, draft_len=2, verify_threshold=3),
    dict(method="hispec", draft_layer=2, verify_layer=5, draft_len=3, verify_threshold=1),
]


@pytest.mark.parametrize("vocab", [None, 40], ids=["full-vocab", "subset-40"])
@pytest.mark.parametrize("kind", ["trained", "perturbed"])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_greedy_exactness_with_heads(trained, kind, vocab, settings):
    model, _, heads, _, data = trained
    ee = ee_of(model)
    ids = frequent_tokens(data.tokens, vocab, 100) if vocab else None
    if kind == "trained":
        for head in heads.values():
            head.set_vocab(ids)
        attached = heads
    else:
        attached = _perturbed(ee, [2, 5], vocab_ids=ids)
    ee.attach_exit_heads(attached, {"default_layers": {"draft": 2, "verify": 5}})
    try:
        for prompt in ([5, 17, 33, 2, 9, 41], [70]):
            result = run(ee, prompt, preset(max_new_tokens=30, **settings, policy="fixed"))
            assert result.token_ids == hf_greedy(model, prompt, 30)
    finally:
        for head in heads.values():
            head.set_vocab(None)
    assert preferred_layers(ee) == (2, 5)


def test_sampling_with_reduced_vocabulary_heads_runs(trained):
    model, _, _, _, data = trained
    ee = ee_of(model)
    ee.attach_exit_heads(_perturbed(ee, [2, 5], vocab_ids=frequent_tokens(data.tokens, 30, 100)))
    result = run(ee, [5, 17, 33], preset(max_new_tokens=20, draft_layer=2, verify_layer=5, temperature=0.8,
                                               seed=3))
    assert len(result.token_ids) == 20 and all(0 <= t < 100 for t in result.token_ids)


def test_cli_train_exits_on_a_folder(tmp_path, monkeypatch, capsys):
    from hispec.cli.main import main
    from hispec.model.loading import load_model

    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    folder = str(save_tiny_folder(tmp_path / "model"))
    r = random.Random(0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "".join(r.choice("abcdefgh ijk") for _ in range(r.randint(4, 12)))})
                               + "\n" for _ in range(24)))
    code = main(["train-exits", "--model", folder, "--layers", "2,4,6", "--save-layers", "2,6",
                 "--prompts", str(prompts), "--max-new-tokens", "16", "--vocab", "60", "--steps", "40",
                 "--batch-size", "32", "--quiet", "--data", str(tmp_path / "teacher.pt")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "held-out evaluation" in out and "saved heads for layers 2, 6" in out
    assert "loads them automatically" in out
    # saved in the cache, found automatically, with the manifest's pair as the suggested exits
    lm = load_model(folder, device="cpu")
    assert sorted(lm.ee.exit_heads) == [2, 6] and isinstance(lm.ee.exit_heads[2], ExitHead)
    info = lm.ee.exit_info
    assert info["vocab"]["size"] == 60 and info["model"]["num_layers"] == 8
    assert set(info["evaluation"]["agreement"]) == {"2", "4", "6"}
    assert preferred_layers(lm.ee) == (2, 6)
    assert info["training"]["tokens"] > 0 and info["model"] == {**model_identity(lm.model, folder)}
    prompt = lm.encode("abc def")
    result = run(lm.ee, prompt, preset(max_new_tokens=20, draft_layer=2, verify_layer=6, policy="fixed"),
                 eos_ids=lm.eos_ids)
    assert result.token_ids == hf_greedy(lm.model, prompt, 20, eos=2)
    # raw exits on request; an explicit folder for another model is refused
    assert load_model(folder, device="cpu", exits="none").ee.exit_heads == {}
    other = str(save_tiny_folder(tmp_path / "other", layers=6))
    with pytest.raises(ModelLoadError, match="another model"):
        load_model(other, device="cpu", exits=info["path"])
    # the teacher-data cache is reused on a second run
    code = main(["train-exits", "--model", folder, "--layers", "2,4", "--save-layers", "best", "--prompts",
                 str(prompts), "--max-new-tokens", "16", "--vocab", "0", "--steps", "5", "--quiet",
                 "--data", str(tmp_path / "teacher.pt"), "--out", str(tmp_path / "x")])
    captured = capsys.readouterr()
    assert code == 0 and "use them with --exits" in captured.out and "from " + str(tmp_path / "teacher.pt") in captured.err
    assert "saved heads for layers 2, 4" in captured.out and "estimated best hispec: draft 2, verify 4" in captured.out


def test_cli_rejects_bad_layers(tmp_path, capsys):
    from hispec.cli.main import main

    folder = str(save_tiny_folder(tmp_path / "model"))
    assert main(["train-exits", "--model", folder, "--layers", "9"]) == 2
    assert "exit layer 9 is impossible" in capsys.readouterr().err
    assert main(["train-exits", "--model", folder, "--layers", "a,b"]) == 2
    assert "--layers 'a,b'" in capsys.readouterr().err


def test_exits_view_in_the_app(trained):
    from ui.model_view import exits_html

    assert "raw" in exits_html(None) and "train-exits" in exits_html(None)
    manifest = trained[3]
    info = dict(manifest, layers=[2, 5], head={"description": "<b>x</b>"}, vocab={"size": 40})
    page = exits_html(info)
    raw2, trained2 = manifest["evaluation"]["agreement"]["2"].values()
    assert f"<td>2</td><td>{raw2:.1%}</td><td>{trained2:.1%}</td>" in page
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert "draft 2 vs verify 5" in page and "40 most frequent" in page
    other = exits_html({"kind": "hispec-lora", "default_layers": {"draft": 3, "verify": 9}})
    assert "draft 3, verify 9" in other and "<table" not in other


@pytest.mark.real_model
def test_shipped_heads_of_the_default_model():
    from hispec.model.heads import ASSETS_EXITS, DEFAULT_MODEL_KEY, read_manifest
    from hispec.model.loading import load_model

    manifest = read_manifest(ASSETS_EXITS / DEFAULT_MODEL_KEY)
    lm = load_model("default", device="cpu")
    assert sorted(lm.ee.exit_heads) == manifest["layers"] and lm.ee.exit_info["path"].endswith(DEFAULT_MODEL_KEY)
    d, v = preferred_layers(lm.ee)
    pref = manifest["default_layers"]
    for layer in manifest["layers"]:  # trained beats raw, as measured held out
        a = manifest["evaluation"]["agreement"][str(layer)]
        assert a["trained"] > a["raw"] + 0.15
    ids = lm.encode("Name three colours.")
    ref = hf_greedy(lm.model, ids, 24)
    for config in (preset("hispec", d, v, pref["draft_len"], pref["verify_threshold"], max_new_tokens=24,
                                policy="fixed"),
                   preset("layerskip", pref["layerskip_exit"], max_new_tokens=24, policy="fixed")):
        assert run(lm.ee, ids, config).token_ids == ref
