"""Attention exit heads (one attention block with its own KV cache before the linear head):
the cache follows the exit's frontier through drafts and rollbacks, incremental results equal a
whole-sequence pass, training helps, heads round-trip, and greedy output stays the target's."""

import random

import pytest
import torch
from helpers import ee_of, hf_greedy, tiny_model

from hispec.engine.config import preset
from hispec.engine.stack import StageStack
from hispec.errors import ConfigError
from hispec.runs.runner import run
from hispec.model.heads import ExitHead, load_heads, make_heads, save_heads
from hispec.training.heads.data import frequent_tokens
from hispec.training.heads.pipeline import run as train_run
from hispec.training.heads.train import TrainSettings


def random_prompts(n, seed=0, vocab=100):
    r = random.Random(seed)
    return [[r.randrange(3, vocab) for _ in range(r.randint(3, 9))] for _ in range(n)]


@pytest.fixture(scope="module")
def trained():
    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    heads, manifest, data = train_run(ee, random_prompts(128), [2, 5], max_new_tokens=32, holdout=0.25,
                                      settings=TrainSettings(steps=150, batch_size=256, lr=3e-3),
                                      save_dtype="float32", head_type="attention")
    return model, ee, heads, manifest, data


def _scrambled(ee, layers, seed=0):
    """Attention heads whose attention step changes the states a lot (random output map)."""
    heads = make_heads(ee, layers, head_type="attention")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in heads.values():
            head.attention.o.copy_(torch.randn(head.attention.o.shape, generator=g))
    return heads


def test_training_improves_agreement_and_describes_the_head(trained):
    _, _, heads, manifest, _ = trained
    for layer in ("2", "5"):
        a = manifest["evaluation"]["agreement"][layer]
        assert a["trained"] > a["raw"] + 0.04, (layer, a)
    assert all(h.stateful for h in heads.values())
    assert heads[2].describe().startswith("attention (own KV cache) + norm + full linear")
    assert manifest["training"]["attention_lr"] == TrainSettings().attention_lr


def _held(stack) -> dict[int, int]:
    """Positions each attention head holds: attended (in its cache) plus waiting for its step."""
    waiting = stack.head_waiting()
    return {layer: n + waiting[layer] for layer, n in stack.head_cache_lengths().items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_incremental_states_equal_a_whole_sequence_pass_through_rollbacks(arch):
    model = tiny_model(arch, seed=2)
    ee = ee_of(model)
    ee.attach_exit_heads(_scrambled(ee, [2, 5]))
    tokens = [random.Random(1).randrange(3, 100) for _ in range(14)]
    stack = StageStack(ee, (0, 2, 5, 8), ("draft", "verify", "target"), 64)
    got = {2: {}, 5: {}}  # exit -> position -> exit states as the stack returned them (last write wins)
    for t in tokens[:5]:
        stack.append(t)
    stack.run_to(3, 5)  # prefill
    for step, t in enumerate(tokens[5:] + [7, 7]):
        stack.append(t)
        h = stack.run_to(1, len(stack))
        got[2][len(stack) - 1] = h[0, -1]
        assert _held(stack) == {2: stack.frontier[1], 5: stack.frontier[2]}
        assert stack.head_cache_lengths()[2] == stack.frontier[1]  # consulted: attended at once
        if step % 3 != 2:  # exit 5 not consulted since the last verify: its positions wait, unattended
            assert stack.head_waiting()[5] == stack.frontier[2] - stack.head_cache_lengths()[5]
        if step % 3 == 2:
            lo = stack.frontier[2]
            h = stack.run_to(2, len(stack))
            for i in range(h.shape[1]):
                got[5][lo + i] = h[0, i]
            if len(stack) > 12:  # reject the last two, as a verifier would
                stack.truncate(len(stack) - 2)
                for states in got.values():  # what was returned for the cut positions is void
                    for pos in [p for p in states if p >= len(stack)]:
                        del states[pos]
                assert _held(stack) == {2: len(stack), 5: min(stack.frontier[2], len(stack))}
    # the same positions in one pass over the final sequence, on a fresh cache
    final = stack.tokens
    cache = ee.new_cache(64)
    with torch.inference_mode():
        hidden = ee.run_layers(ee.embed(final), 0, 2, cache)
        whole = {2: ee.exit_heads[2].attend(hidden)[0],
                 5: ee.exit_heads[5].attend(ee.run_layers(hidden, 2, 5, cache))[0]}
    assert len(got[5]) >= 6 and len(got[2]) >= 8
    for layer in (2, 5):
        for pos, state in got[layer].items():
            torch.testing.assert_close(state, whole[layer][pos], rtol=1e-4, atol=1e-4, msg=f"exit {layer}, {pos}")


SETTINGS = [
    dict(method="layerskip", draft_layer=2, draft_len=3),
    dict(method="hispec", draft_layer=2, verify_layer=5, draft_len=2, verify_threshold=3),
    dict(method="hispec", draft_layer=2, verify_layer=5, draft_len=3, verify_threshold=1),
]


@pytest.mark.parametrize("kind", ["trained", "scrambled"])
@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_greedy_exactness_with_attention_heads(trained, kind, settings):
    model, _, heads, _, data = trained
    ee = ee_of(model)
    if kind == "trained":
        for head in heads.values():
            head.set_vocab(frequent_tokens(data.tokens[data.tokens >= 0], 40, 100))
        attached = heads
    else:
        attached = _scrambled(ee, [2, 5])
    ee.attach_exit_heads(attached)
    try:
        for prompt in ([5, 17, 33, 2, 9, 41], [70]):
            result = run(ee, prompt, preset(max_new_tokens=30, **settings, policy="fixed"))
            assert result.token_ids == hf_greedy(model, prompt, 30)
    finally:
        for head in heads.values():
            head.set_vocab(None)


def test_attention_heads_round_trip(trained, tmp_path):
    _, ee, heads, manifest, _ = trained
    save_heads(tmp_path / "exits", heads, manifest, dtype="float32")
    loaded, saved = load_heads(tmp_path / "exits", ee)
    assert saved["head"]["type"] == "attention" and saved["head"]["description"] == heads[2].describe()
    hidden = torch.randn(1, 6, 64)
    for layer in (2, 5):  # float32 storage, the same weights through the same code: equal bit for bit
        assert isinstance(loaded[layer], ExitHead) and loaded[layer].stateful
        assert torch.equal(loaded[layer](loaded[layer].attend(hidden)), heads[layer](heads[layer].attend(hidden)))


def test_teacher_forced_data_is_the_models_prediction_on_the_text():
    from hispec.training.heads.data import collect_forced

    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    texts = random_prompts(3, seed=5) + [[7] * 12]
    data = collect_forced(ee, texts, [2, 5])
    assert len(data) == sum(map(len, texts)) and not data.generated.any() and (data.tokens == -1).all()
    for i, ids in enumerate(texts):
        rows = data.seq == i
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_hidden_states=True)
        # an argmax, not bits: fp16 storage moves these logits by <2e-3, their top-2 gaps are >=2e-2
        assert torch.equal(model.lm_head(data.final[rows].float()).argmax(-1), out.logits[0].argmax(-1))
        torch.testing.assert_close(data.hidden[2][rows].float(), out.hidden_states[2][0], rtol=1e-2, atol=1e-2)


def test_forced_text_is_extra_training_data_never_held_out():
    from hispec.training.heads.data import collect_forced

    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    forced = collect_forced(ee, random_prompts(40, seed=8), [2, 5])
    settings = TrainSettings(steps=20, batch_size=128, lr=3e-3)
    plain = train_run(ee, random_prompts(32), [2, 5], max_new_tokens=16, holdout=0.25, settings=settings,
                      head_type="attention")[1]
    more = train_run(ee, random_prompts(32), [2, 5], max_new_tokens=16, holdout=0.25, settings=settings,
                     head_type="attention", forced=forced)[1]
    assert more["training"]["forced_tokens"] == len(forced) and "teacher-forced" in more["training"]["objective"]
    assert more["training"]["tokens"] == plain["training"]["tokens"] + len(forced)
    assert more["evaluation"]["tokens"] == plain["evaluation"]["tokens"]  # held-out set unchanged


def test_sharegpt_dialogues_come_after_the_prompt_pool():
    from hispec.data.prompts import load_sharegpt, load_sharegpt_dialogues

    prompts = {p.text for p in load_sharegpt(pool=50)}
    dialogues = load_sharegpt_dialogues(5, skip=50)
    assert len(dialogues) == 5
    for user, reply in dialogues:
        assert user["role"] == "user" and reply["role"] == "assistant" and reply["content"].strip()
        assert user["content"] not in prompts


def test_cli_trains_attention_heads_that_the_engine_loads(tmp_path, monkeypatch, capsys):
    import json

    from helpers import save_tiny_folder

    from hispec.cli.main import main
    from hispec.model.loading import load_model

    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    folder = str(save_tiny_folder(tmp_path / "model"))
    r = random.Random(0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": "".join(r.choice("abcdefgh ijk") for _ in range(r.randint(4, 12)))})
                               + "\n" for _ in range(16)))
    code = main(["train-exits", "--model", folder, "--layers", "2,5", "--head", "attention", "--prompts",
                 str(prompts), "--max-new-tokens", "12", "--vocab", "60", "--steps", "20", "--quiet"])
    assert code == 0, capsys.readouterr()
    lm = load_model(folder, device="cpu")
    assert sorted(lm.ee.exit_heads) == [2, 5] and all(h.stateful for h in lm.ee.exit_heads.values())
    assert lm.ee.exit_info["head"]["type"] == "attention"
    prompt = lm.encode("abc def")
    result = run(lm.ee, prompt, preset(max_new_tokens=20, draft_layer=2, verify_layer=5, policy="fixed"),
                 eos_ids=lm.eos_ids)
    assert result.token_ids == hf_greedy(lm.model, prompt, 20, eos=2)
    # the prompts the heads were held out from: a clean benchmark set
    from hispec.training.heads.prompts import heldout_prompts

    held = heldout_prompts(lm)
    texts = [json.loads(line)["prompt"] for line in prompts.read_text().splitlines()]
    assert list(held) == ["heldout-p"] and len(held["heldout-p"]) == 2
    assert all(p.text in texts for p in held["heldout-p"])
    capsys.readouterr()
    assert main(["bench", "--model", folder, "--prompts", "heldout", "--methods", "autoregressive,layerskip",
                 "--max-new-tokens", "6", "--no-warmup"]) == 0
    assert "heldout-p" in capsys.readouterr().out
    with pytest.raises(ConfigError, match="prompt set 'heldout' needs trained exit heads"):
        heldout_prompts(load_model(folder, device="cpu", exits="none"))
    assert main(["train-exits", "--model", folder, "--layers", "2", "--attention-lr", "0"]) == 2
    assert "--attention-lr must be positive" in capsys.readouterr().err


def test_cli_forced_text_on_a_model_without_a_chat_template(tmp_path, monkeypatch, capsys):
    import json

    from helpers import save_tiny_folder

    from hispec.cli.main import main

    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    folder = save_tiny_folder(tmp_path / "model")
    for template in folder.glob("chat_template.*"):  # a base model: no chat template
        template.unlink()
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    from hispec.model.loading import load_model

    assert not getattr(load_model(str(folder), device="cpu").tokenizer, "chat_template", None)
    folder = str(folder)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "abc {i} def"}}\n' for i in range(8)))
    args = ["train-exits", "--model", folder, "--layers", "2,5", "--prompts", str(prompts), "--max-new-tokens", "6",
            "--vocab", "0", "--steps", "3", "--quiet", "--forced-text", "4", "--forced-max-tokens", "40",
            "--data", str(tmp_path / "t.pt"), "--out", str(tmp_path / "x")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "Teacher-forced text: 4 ShareGPT exchanges" in err and "teacher-forced" in err
    assert main(args) == 0  # the second run reuses the cache next to --data
    assert "Teacher-forced data from " + str(tmp_path / "t.pt.forced.pt") in capsys.readouterr().err
