"""Self-distilled exit heads: teach each exit to predict what the full model predicts.

1. Teacher data: the full model writes greedy continuations of a set of prompts (batched, so
   cheap); one more pass over prompt + continuation keeps, for every generated position, the
   raw hidden state at each candidate exit layer and the final layer's (normed) hidden state,
   from which the teacher's next-token distribution is recomputed with the LM head when needed.
   No full-vocabulary logits are stored.
2. Vocabulary subset (optional): the K tokens the model emits most often in its own training
   generations; exits then score only those (a contiguous slice of the LM head weight).
3. Training: every head learns, on the same batches, to minimise KL(teacher || exit) over the
   head's vocabulary (the teacher renormalised to the subset). Target weights never change.
4. Evaluation on held-out prompts: top-1 agreement of each exit with the full model before
   (raw exit) and after training, the subset's coverage, and agreement between pairs of exits.

This module is the pipeline; the steps live in data (1, 2), train (3) and evaluation (4), the
command `python -m hispec train-exits` in command.
"""

from __future__ import annotations

import math
import time

import torch

from hispec.errors import ConfigError
from hispec.model.heads import HEAD_TYPES, SAVE_DTYPES, ExitHead, make_heads, model_identity
from hispec.training.heads.data import Progress, TeacherData, collect, frequent_tokens, split_prompts
from hispec.training.heads.estimate import measured_costs
from hispec.training.heads.evaluation import default_layers_from, evaluate, suggest
from hispec.training.heads.train import TrainSettings, round_to, train


def run(ee, prompts: list[list[int]], layers: list[int], *, eos_ids=(), name: str = "", max_new_tokens: int = 128,
        holdout: float = 0.1, vocab_size: int = 0, rank: int = 0, settings: TrainSettings | None = None,
        save_dtype: str = "float16", batch_size: int = 16, data: TeacherData | None = None,
        prompt_positions: bool = False, pick_from: list[int] | None = None, show_progress: bool = False,
        log: Progress | None = None, head_type: str = "linear", forced: TeacherData | None = None,
        extra: TeacherData | None = None) -> tuple[dict[int, ExitHead], dict, TeacherData]:
    """Collect teacher data (unless given), train heads for `layers`, evaluate them held out
    (on the positions the full model wrote). `prompt_positions`: also train on the prompts'
    positions. `pick_from`: the layers the suggested hispec/layerskip settings may use (default all).
    `head_type`: 'linear' or 'attention' (see hispec.model.heads). `forced`: extra training data from
    teacher-forced text (collect_forced), never held out. `extra`: more teacher generations (collect)
    for prompts outside `prompts`, training only, never held out. Returns (heads, manifest without the
    save-time fields, the teacher data)."""
    settings = settings or TrainSettings()
    say = log or (lambda msg: None)
    ee.check_layers(*layers)
    if head_type not in HEAD_TYPES:
        raise ConfigError(f"unknown --head '{head_type}'; choose {', '.join(HEAD_TYPES)}")
    attention = head_type == "attention"
    if save_dtype not in SAVE_DTYPES:
        raise ConfigError(f"unknown --save-dtype '{save_dtype}'; choose {', '.join(SAVE_DTYPES)}")
    lm_head = ee.final_head.lm_head
    vocab_total = lm_head.weight.shape[0]
    if vocab_size < 0 or vocab_size > vocab_total:
        raise ConfigError(f"--vocab {vocab_size} is impossible: use 0 (full vocabulary) or 1..{vocab_total}")
    if rank < 0 or rank > ee.config.hidden_size:
        raise ConfigError(f"--rank {rank} is impossible: use 0 (full rank) or 1..{ee.config.hidden_size}")
    t0 = time.perf_counter()
    whole = prompt_positions or attention  # attention heads need each sequence from position 0
    if (data is None or not set(layers) <= set(data.layers) or data.num_prompts != len(prompts)
            or (whole and not data.meta.get("prompt_positions"))):
        say(f"Collecting teacher data: {len(prompts)} prompts, up to {max_new_tokens} new tokens each")
        data = collect(ee.model, prompts, sorted(set(layers)), max_new_tokens, eos_ids, batch_size, show_progress,
                       whole, ee=ee)
    collect_s = data.meta.get("collect_s") or time.perf_counter() - t0
    data.meta["collect_s"] = round(collect_s, 1)
    train_idx, held_idx = split_prompts(len(prompts), holdout, settings.seed)
    # Attention heads read whole sequences; without prompt_positions only their loss is restricted.
    train_data = data.select(train_idx, generated_only=not prompt_positions and not attention)
    loss_mask = train_data.generated if attention and not prompt_positions else None
    held_data = data.select(held_idx)  # scored on the generated positions only (see evaluate)
    # All training parts are joined in one copy; then only the joined data is kept (see cli).
    parts, masks = [train_data], [loss_mask]
    extra_generated = extra_prompts = 0
    if extra is not None:  # more of the full model's generations: trained on like the training prompts
        if not prompt_positions and not attention:
            extra = extra.masked(extra.generated, extra.num_prompts)
        extra_generated, extra_prompts = int(extra.generated.sum()), extra.num_prompts
        parts.append(extra)
        masks.append(extra.generated)
    generated = torch.cat([p.tokens[p.generated] for p in parts])
    forced_tokens = forced_sequences = 0
    if forced is not None:  # teacher-forced text: training positions all, context and targets
        forced_tokens, forced_sequences = len(forced), forced.num_prompts
        parts.append(forced)
        masks.append(torch.ones(forced_tokens, dtype=torch.bool))
    extra = forced = None
    if len(parts) > 1:
        train_data = TeacherData.concat(*parts)
        loss_mask = torch.cat(masks) if loss_mask is not None else None
    del parts, masks
    trained_on = int(loss_mask.sum()) if loss_mask is not None else len(train_data)
    say(f"Teacher data: {trained_on} training positions ({len(generated)} generated, {len(train_idx)} prompts"
        + (f" + {extra_prompts} extra prompts" if extra_prompts else "")
        + (f", {forced_tokens} teacher-forced" if forced_tokens else "")
        + f"), {int(held_data.generated.sum())} held-out generated tokens ({len(held_idx)} prompts), {collect_s:.0f} s")
    vocab = None
    if vocab_size and vocab_size < vocab_total:
        vocab = frequent_tokens(generated, vocab_size, vocab_total, always=sorted(set(eos_ids)))
    heads = make_heads(ee, layers, rank=rank, vocab_ids=vocab, head_type=head_type)
    for head in heads.values():
        torch.manual_seed(settings.seed)  # low-rank heads start from a seeded random projection
        if head.rank:
            with torch.no_grad():
                head.down.copy_(torch.randn(head.down.shape) / math.sqrt(head.hidden_size))
    t1 = time.perf_counter()
    history = train(heads, train_data, lm_head.weight, settings, show_progress, loss_mask)
    train_s = time.perf_counter() - t1
    round_to(heads, SAVE_DTYPES[save_dtype])
    evaluation, seqs = evaluate(ee, heads, held_data)
    pick = sorted(pick_from or layers)
    costs = measured_costs(ee, {layer: heads[layer] for layer in pick})  # the heads' own costs
    estimate = suggest(evaluation, seqs, ee.num_layers, pick, costs)
    evaluation["estimate"] = estimate
    defaults = default_layers_from(estimate)
    if defaults:
        pair = f"{defaults['draft']}-{defaults['verify']}"
        evaluation["draft_vs_verify"] = {"draft": defaults["draft"], "verify": defaults["verify"],
                                         **evaluation["pairs"][pair]}
    manifest = {
        "model": model_identity(ee.model, name),
        "default_layers": defaults,
        "vocab": {"coverage_held_out": evaluation["subset_coverage"]},
        "training": {
            "objective": "KL(full model || exit) on the full model's own greedy continuations"
                         + (" and on the prompts" if prompt_positions else "")
                         + (" (plus generations for extra prompts, never held out)" if extra_prompts else "")
                         + (" and on teacher-forced text" if forced_tokens else ""),
            "prompts": len(train_idx), "tokens": len(train_data), "generated_tokens": len(generated),
            **({"extra_prompts": extra_prompts, "extra_generated_tokens": extra_generated} if extra_prompts else {}),
            **({"forced_sequences": forced_sequences, "forced_tokens": forced_tokens} if forced_tokens else {}),
            "max_new_tokens": max_new_tokens,
            "steps": settings.steps, "batch_size": settings.batch_size, "lr": settings.lr,
            "warmup": settings.warmup, "weight_decay": settings.weight_decay, "seed": settings.seed,
            **({"attention_lr": settings.attention_lr} if attention else {}),
            "holdout": holdout, "collect_s": round(collect_s, 1), "train_s": round(train_s, 1),
            "loss_history": history[-5:],
        },
        "evaluation": evaluation,
    }
    return heads, manifest, data
