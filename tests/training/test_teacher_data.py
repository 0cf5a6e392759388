"""Teacher data for exit heads: batched greedy decoding on the lean path gives transformers'
greedy tokens, and generations for extra prompts are training data only, never held out."""

import random

import pytest
import torch
from helpers import ee_of, hf_greedy, tiny_model

from hispec.training.heads.data import TeacherData, collect, segments
from hispec.training.heads.pipeline import run as train_run
from hispec.training.heads.teacher import greedy
from hispec.training.heads.train import TrainSettings


def prompts_of(n, seed=0, vocab=100, lengths=(1, 12)):
    r = random.Random(seed)
    return [[r.randrange(3, vocab) for _ in range(r.randint(*lengths))] for _ in range(n)]


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_batched_greedy_equals_transformers_greedy_for_every_prompt(arch):
    model = tiny_model(arch, seed=3)
    ee = ee_of(model)
    assert ee.lean is not None
    prompts = prompts_of(7, seed=1)  # lengths 1..12: every row but the longest is left-padded
    assert len({len(p) for p in prompts}) > 2
    free = [hf_greedy(model, p, 10) for p in prompts]
    assert greedy(ee, prompts, 10) == free
    # An eos cuts a row after its first eos; the other rows go on (and finished rows are dropped).
    eos = free[0][3]
    cut = [out[: out.index(eos) + 1] if eos in out else out for out in free]
    assert any(len(c) < 10 for c in cut) and any(len(c) == 10 for c in cut)
    assert greedy(ee, prompts, 10, eos_ids=[eos], pad_id=eos) == cut


def test_batched_greedy_without_the_engines_lean_path():
    model = tiny_model("llama", seed=5)
    ee = ee_of(model)
    ee.set_lean(False)  # the engine on the stock path: greedy builds its own lean path
    prompts = prompts_of(4, seed=2)
    assert greedy(ee, prompts, 8) == [hf_greedy(model, p, 8) for p in prompts]


def test_collect_on_the_lean_path_matches_transformers_generate():
    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    prompts = prompts_of(9, seed=3, lengths=(3, 9))
    fast = collect(model, prompts, [2, 5], max_new_tokens=12, eos_ids=[7], batch_size=4, prompt_positions=True,
                   ee=ee)
    stock = collect(model, prompts, [2, 5], max_new_tokens=12, eos_ids=[7], batch_size=4, prompt_positions=True)
    assert torch.equal(fast.tokens, stock.tokens) and torch.equal(fast.seq, stock.seq)
    # the states of both come from the same model.model pass over the same (now equal) batches: same bits
    assert torch.equal(fast.hidden[5], stock.hidden[5]) and torch.equal(fast.final, stock.final)


def test_concat_keeps_every_sequence_apart():
    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    data = collect(model, prompts_of(6, seed=4, lengths=(2, 5)), [2], max_new_tokens=3, prompt_positions=True, ee=ee)
    picked = data.select({1, 2, 5})  # keeps the original numbers 1, 2, 5: 5 == its number of prompts + 2
    both = TeacherData.concat(picked, data)
    assert len(segments(both)) == len(segments(picked)) + len(segments(data)) == 3 + 6
    assert both.num_prompts == 9


def test_extra_prompts_are_training_data_never_held_out():
    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    extra = collect(model, prompts_of(20, seed=9, lengths=(3, 9)), [2, 5], max_new_tokens=16, prompt_positions=True,
                    ee=ee)
    settings = TrainSettings(steps=10, batch_size=128, lr=3e-3)
    prompts = prompts_of(32, seed=0, lengths=(3, 9))
    for head_type in ("linear", "attention"):
        plain = train_run(ee, prompts, [2, 5], max_new_tokens=16, holdout=0.25, settings=settings,
                          head_type=head_type)[1]
        more = train_run(ee, prompts, [2, 5], max_new_tokens=16, holdout=0.25, settings=settings,
                         head_type=head_type, extra=extra)[1]
        generated = int(extra.generated.sum())
        assert more["training"]["extra_prompts"] == 20 and more["training"]["extra_generated_tokens"] == generated
        assert more["training"]["generated_tokens"] == plain["training"]["generated_tokens"] + generated
        assert more["evaluation"]["tokens"] == plain["evaluation"]["tokens"]  # the held-out set is unchanged
        assert more["evaluation"]["prompts"] == plain["evaluation"]["prompts"]


def test_sharegpt_questions_overlap_neither_the_pool_nor_the_forced_text():
    from hispec.data.prompts import SHAREGPT_POOL, load_sharegpt, load_sharegpt_dialogues, load_sharegpt_questions

    pool = {p.text for p in load_sharegpt(pool=SHAREGPT_POOL)}
    forced = {user["content"] for user, _ in load_sharegpt_dialogues(30)}
    questions = load_sharegpt_questions(40, after_dialogues=30)
    assert len(questions) == 40 and all(q.chat and q.text.strip() for q in questions)
    texts = [q.text for q in questions]
    assert not set(texts) & pool and not set(texts) & forced
    # they start right after the forced exchanges' records
    assert load_sharegpt_questions(1, after_dialogues=29)[0].text in forced


def test_cli_extra_prompts_are_cached_and_recorded(tmp_path, monkeypatch, capsys):
    import json

    from helpers import save_tiny_folder

    from hispec.cli.main import main

    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    folder = str(save_tiny_folder(tmp_path / "model"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "a{i}", "chat": false}}\n' for i in range(8)))  # 2 tokens each
    args = ["train-exits", "--model", folder, "--layers", "2,5", "--prompts", str(prompts), "--max-new-tokens", "6",
            "--vocab", "0", "--steps", "3", "--quiet", "--extra-prompts", "12", "--max-prompt-tokens", "400",
            "--data", str(tmp_path / "t.pt"), "--out", str(tmp_path / "x")]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "Extra prompts: " in err and "Extra teacher data saved to " + str(tmp_path / "t.pt.extra.pt") in err
    training = json.loads((tmp_path / "x" / "manifest.json").read_text())["training"]
    fitting = int(err.split("Extra prompts: ")[1].split()[0])
    assert 0 < fitting <= 12 and training["extra_prompts"] == fitting and training["extra_generated_tokens"] > 0
    assert main(args) == 0  # the second run reuses both caches
    err = capsys.readouterr().err
    assert "Teacher data from " in err and "Extra teacher data from " + str(tmp_path / "t.pt.extra.pt") in err
    more = [a if a != "2,5" else "2,5,6" for a in args]
    assert main(more) == 0  # a new exit layer: the cached generations are reused, not made again
    err = capsys.readouterr().err
    assert err.count("adding layers 6 by one teacher-forced pass") == 2 and "afresh" not in err
    assert main(more) == 0
    assert "adding layers" not in capsys.readouterr().err
    assert main(args[:-6] + ["--max-prompt-tokens", "3", "--out", str(tmp_path / "y")]) == 2
    assert "none of the 12 extra ShareGPT questions fits --max-prompt-tokens 3" in capsys.readouterr().err


def test_cli_more_extra_prompts_keep_the_cached_ones_and_generate_only_the_rest(tmp_path, monkeypatch, capsys):
    from helpers import save_tiny_folder

    from hispec.cli.main import main

    monkeypatch.setenv("HISPEC_CACHE", str(tmp_path / "cache"))
    folder = str(save_tiny_folder(tmp_path / "model"))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(f'{{"prompt": "a{i}", "chat": false}}\n' for i in range(8)))

    def args(extra, layers, data):
        return ["train-exits", "--model", folder, "--layers", layers, "--prompts", str(prompts),
                "--max-new-tokens", "6", "--vocab", "0", "--steps", "2", "--quiet", "--extra-prompts", str(extra),
                "--max-prompt-tokens", "400", "--data", str(tmp_path / data), "--out", str(tmp_path / "x")]

    assert main(args(6, "2,5", "t.pt")) == 0
    first = TeacherData.load(tmp_path / "t.pt.extra.pt")
    capsys.readouterr()
    # More questions and a new layer: the cached generations stay, layer 6 is added to them, and
    # only the new questions are generated.
    assert main(args(12, "2,5,6", "t.pt")) == 0
    err = capsys.readouterr().err
    assert f"covers the first {first.num_prompts} prompts" in err and "afresh" not in err
    grown = TeacherData.load(tmp_path / "t.pt.extra.pt")
    assert grown.num_prompts > first.num_prompts and grown.layers == [2, 5, 6]
    n = len(first)
    assert torch.equal(grown.tokens[:n], first.tokens) and torch.equal(grown.hidden[5][:n], first.hidden[5])
    # The same as making the 12 questions' data from nothing.
    assert main(args(12, "2,5,6", "u.pt")) == 0
    fresh = TeacherData.load(tmp_path / "u.pt.extra.pt")
    assert grown.num_prompts == fresh.num_prompts and len(grown) == len(fresh)
    for seq in range(fresh.num_prompts):  # collect orders sequences its own way: compare each one
        a, b = grown.seq == seq, fresh.seq == seq
        assert a.any() and torch.equal(grown.tokens[a], fresh.tokens[b])
        assert torch.allclose(grown.hidden[6][a].float(), fresh.hidden[6][b].float(), rtol=1e-2, atol=5e-2)  # fp16 states
    assert grown.meta["key"] == fresh.meta["key"]
    assert main(args(12, "2,5,6", "t.pt")) == 0  # now a plain cache hit
    assert "Extra teacher data from " + str(tmp_path / "t.pt.extra.pt") + " (" in capsys.readouterr().err


@pytest.mark.parametrize("prompt_positions", [True, False])
def test_adding_layers_to_teacher_data_equals_collecting_them(prompt_positions):
    from hispec.training.heads.data import add_layers, collect_forced, generation_inputs

    model = tiny_model("llama", seed=4)
    ee = ee_of(model)
    prompts = prompts_of(6, seed=6, lengths=(2, 8))
    kw = dict(max_new_tokens=7, eos_ids=[7], prompt_positions=prompt_positions, ee=ee)
    full = collect(model, prompts, [2, 5], **kw)
    grown = add_layers(ee, collect(model, prompts, [2], **kw), generation_inputs(full, prompts), [5, 2])
    assert grown.layers == [2, 5] and torch.equal(grown.tokens, full.tokens)
    torch.testing.assert_close(grown.hidden[5].float(), full.hidden[5].float(), rtol=1e-2, atol=1e-2)
    texts = prompts_of(3, seed=7)
    forced = add_layers(ee, collect_forced(ee, texts, [5]), dict(enumerate(texts)), [2])
    torch.testing.assert_close(forced.hidden[2].float(), collect_forced(ee, texts, [2]).hidden[2].float())
    with pytest.raises(Exception, match="has .* positions but only"):
        add_layers(ee, collect_forced(ee, texts, [5]), {i: t[:1] for i, t in enumerate(texts)}, [2])
