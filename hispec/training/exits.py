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

This module is the pipeline and `python -m hispec train-exits`; the steps live in exit_data (1, 2),
exit_train (3) and exit_eval (4).
"""

from __future__ import annotations

import math
import time
from typing import Callable

import torch

from hispec.errors import ConfigError
from hispec.model.heads import ExitHead, make_heads, model_identity
from hispec.training.exit_data import (
    Progress,
    TeacherData,
    add_layers,
    collect,
    collect_forced,
    frequent_tokens,
    generation_inputs,
    split_prompts,
)
from hispec.training.exit_eval import default_layers_from, evaluate, format_evaluation, suggest
from hispec.training.exit_train import TrainSettings, round_to, train


def run(ee, prompts: list[list[int]], layers: list[int], *, eos_ids=(), name: str = "", max_new_tokens: int = 128,
        holdout: float = 0.1, vocab_size: int = 0, rank: int = 0, settings: TrainSettings | None = None,
        save_dtype: str = "float16", batch_size: int = 16, data: TeacherData | None = None,
        prompt_positions: bool = False, pick_from: list[int] | None = None, show_progress: bool = False,
        log: Progress | None = None, head_type: str = "linear", forced: TeacherData | None = None,
        extra: TeacherData | None = None) -> tuple[dict[int, ExitHead], dict, TeacherData]:
    """Collect teacher data (unless given), train heads for `layers`, evaluate them held out
    (on the positions the full model wrote). `prompt_positions`: also train on the prompts'
    positions. `pick_from`: the layers the suggested hispec/layerskip settings may use (default all).
    `head_type`: 'linear' or 'attention' (see exit_heads). `forced`: extra training data from
    teacher-forced text (collect_forced), never held out. `extra`: more teacher generations (collect)
    for prompts outside `prompts`, training only, never held out. Returns (heads, manifest without the
    save-time fields, the teacher data)."""
    from hispec.model.heads import HEAD_TYPES, SAVE_DTYPES

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
    estimate = suggest(evaluation, seqs, ee.num_layers, sorted(pick_from or layers), vocab is not None, attention)
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


def parse_layers(text: str) -> list[int]:
    try:
        layers = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise ConfigError(f"--layers '{text}': expected comma-separated whole numbers, e.g. 4,8") from None
    if not layers:
        raise ConfigError("--layers is empty: give the exit layers to train, e.g. 4,8")
    return layers


def _usable_prompts(lm, spec: str, max_prompt_tokens: int, seed: int) -> list[tuple[str, object, list[int]]]:
    """(set name, prompt, token ids) of the prompts train-exits uses, in its order."""
    from hispec.evaluation.prompts import load_sets

    out = []
    for name, prompts in load_sets(spec, seed=seed).items():
        for p in prompts:
            if p.text.strip():
                tokens = lm.encode(p.text, chat=p.chat)
                if len(tokens) <= max_prompt_tokens:
                    out.append((name, p, tokens))
    return out


def heldout_prompts(lm) -> dict[str, list]:
    """The prompts the attached exit heads were evaluated on and never trained on, by set: the
    clean prompts to benchmark them with (prompt set 'heldout' in bench)."""
    info = getattr(lm.ee, "exit_info", None) or {}
    training = info.get("training") or {}
    options = training.get("options") or {}
    spec = training.get("prompt_spec")
    if not spec:
        raise ConfigError("prompt set 'heldout' needs trained exit heads whose manifest records their prompts "
                          "(made by train-exits); this model has none")
    usable = _usable_prompts(lm, spec, int(options.get("max_prompt_tokens", 256)), int(training.get("seed", 0)))
    _, held = split_prompts(len(usable), float(training.get("holdout", 0.1)), int(training.get("seed", 0)))
    sets: dict[str, list] = {}
    for i in sorted(held):
        name, prompt, _ = usable[i]
        sets.setdefault(f"heldout-{name}", []).append(prompt)
    return sets


def _prompt_ids(lm, spec: str, max_prompt_tokens: int, seed: int) -> list[list[int]]:
    ids = [tokens for _, _, tokens in _usable_prompts(lm, spec, max_prompt_tokens, seed)]
    if len(ids) < 2:
        raise ConfigError(f"--prompts '{spec}' gives {len(ids)} usable prompt(s) of at most {max_prompt_tokens} "
                          f"tokens; give more prompts (train-exits holds some out for evaluation)")
    return ids


def _data_key(prompts: list[list[int]], max_new_tokens: int, identity: dict) -> str:
    import hashlib
    import json

    # "v2": prompt positions from 0 on (what attention heads need); older caches are not reused.
    blob = json.dumps([prompts, max_new_tokens, identity, "v2"], sort_keys=True).encode()
    return hashlib.sha1(blob).hexdigest()


def _forced_data(lm, args, layers: list[int], identity: dict, say: Progress) -> TeacherData:
    """Teacher-forced ShareGPT exchanges (--forced-text N), cached next to --data when given."""
    from pathlib import Path

    from hispec.evaluation.prompts import load_sharegpt_dialogues

    if args.forced_max_tokens < 2:
        raise ConfigError(f"--forced-max-tokens must be at least 2 (got {args.forced_max_tokens})")
    sequences = []
    chat = bool(getattr(lm.tokenizer, "chat_template", None))
    for messages in load_sharegpt_dialogues(args.forced_text):
        if chat:
            ids = lm.tokenizer.apply_chat_template(messages, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "input_ids") else ids
        else:  # a model without a chat template reads the exchange as plain text
            ids = lm.tokenizer.encode("\n\n".join(m["content"] for m in messages), add_special_tokens=True)
        sequences.append(list(ids)[: args.forced_max_tokens])
    say(f"Teacher-forced text: {len(sequences)} ShareGPT exchanges, up to {args.forced_max_tokens} tokens each")
    path = Path(str(args.data) + ".forced.pt") if args.data else None
    return _cached(path, _data_key(sequences, 0, identity), layers, "Teacher-forced data", say,
                   lambda: collect_forced(lm.ee, sequences, layers, show_progress=not args.quiet),
                   lambda d: add_layers(lm.ee, d, dict(enumerate(sequences)), layers, not args.quiet))


def _extra_data(lm, args, layers: list[int], identity: dict, say: Progress) -> TeacherData:
    """Teacher generations for --extra-prompts N more ShareGPT questions, cached next to --data."""
    from pathlib import Path

    from hispec.evaluation.prompts import load_sharegpt_questions

    prompts = [ids for ids in (lm.encode(p.text, chat=p.chat)
                               for p in load_sharegpt_questions(args.extra_prompts, args.forced_text))
               if len(ids) <= args.max_prompt_tokens]
    if not prompts:
        raise ConfigError(f"none of the {args.extra_prompts} extra ShareGPT questions fits --max-prompt-tokens "
                          f"{args.max_prompt_tokens}; raise either")
    say(f"Extra prompts: {len(prompts)} ShareGPT questions of at most {args.max_prompt_tokens} tokens "
        f"(of {args.extra_prompts}), for training only")
    path = Path(str(args.data) + ".extra.pt") if args.data else None

    def generate(some: list[list[int]]) -> TeacherData:
        return collect(lm.model, some, layers, args.max_new_tokens, lm.eos_ids, args.gen_batch,
                       not args.quiet, prompt_positions=True, ee=lm.ee)

    return _cached(path, _data_key(prompts, args.max_new_tokens, identity), layers, "Extra teacher data", say,
                   lambda: generate(prompts),
                   lambda d: add_layers(lm.ee, d, generation_inputs(d, prompts), layers, not args.quiet),
                   grow=(lambda n: _data_key(prompts[:n], args.max_new_tokens, identity),
                         lambda n: generate(prompts[n:])))


def _cached(path, key: str, layers: list[int], label: str, say: Progress, make: Callable[[], TeacherData],
            extend: Callable[[TeacherData], TeacherData] | None = None,
            grow: tuple[Callable[[int], str], Callable[[int], TeacherData]] | None = None):
    """Teacher data from the cache file `path` when it was made with `key`: for these layers, or,
    with `extend`, for fewer (the missing ones are added without generating again, and the
    cache is rewritten). `grow` = (key of the first n prompts, data for the prompts after n):
    a cache made for a prefix of the prompts is kept and only the rest is generated.
    Otherwise the data is made now and written there."""
    if path is not None and path.is_file():
        cached = TeacherData.load(path)
        prefix_key, rest = grow or (None, None)
        n = cached.num_prompts
        if (prefix_key is not None and cached.meta.get("key") != key and cached.meta.get("key") == prefix_key(n)
                and (set(layers) <= set(cached.layers) or extend is not None)):
            if not set(layers) <= set(cached.layers):
                cached = extend(cached)
            say(f"{label} from {path} covers the first {n} prompts ({len(cached)} tokens): generating the rest")
            t0 = time.perf_counter()
            data = TeacherData.concat(_only_layers(cached, layers), rest(n))
            data.meta = {**cached.meta, "key": key,
                         "collect_s": round(cached.meta.get("collect_s", 0) + time.perf_counter() - t0, 1)}
            data.save(path)
            say(f"{label} saved to {path} ({len(data)} tokens)")
            return data
        if cached.meta.get("key") == key and set(layers) <= set(cached.layers):
            say(f"{label} from {path} ({len(cached)} tokens)")
            return _only_layers(cached, layers)
        if cached.meta.get("key") == key and extend is not None:
            missing = sorted(set(layers) - set(cached.layers))
            say(f"{label} from {path} ({len(cached)} tokens); adding layers {', '.join(map(str, missing))} "
                "by one teacher-forced pass over its sequences (no generation)")
            data = extend(cached)
            data.save(path)
            return _only_layers(data, layers)
        say(f"{path} holds data for other prompts/settings: collecting afresh")
    t0 = time.perf_counter()
    data = make()
    data.meta.update(key=key, collect_s=round(time.perf_counter() - t0, 1))
    if path is not None:
        data.save(path)
        say(f"{label} saved to {path}")
    return data


def _only_layers(data: TeacherData, layers: list[int]) -> TeacherData:
    return TeacherData(sorted(layers), {k: data.hidden[k] for k in layers}, data.final, data.tokens, data.seq,
                       data.num_prompts, data.meta, data.generated)


def cli(args) -> int:
    """python -m hispec train-exits (argparse namespace from hispec/cli/main.py)."""
    import sys
    from pathlib import Path

    from hispec.model.heads import candidate_folders, save_heads, user_exits_folder
    from hispec.model.loading import load_model

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    layers = parse_layers(args.layers)
    best = (args.save_layers or "").strip() == "best"
    save_layers = layers if best or not args.save_layers else parse_layers(args.save_layers)
    if not set(save_layers) <= set(layers):
        raise ConfigError(f"--save-layers {args.save_layers} must be among --layers {args.layers}")
    if args.max_new_tokens < 1:
        raise ConfigError(f"--max-new-tokens must be at least 1 (got {args.max_new_tokens})")
    for name in ("steps", "batch_size"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1 (got {getattr(args, name)})")
    for name in ("lr", "attention_lr"):
        if not getattr(args, name) > 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be positive (got {getattr(args, name)})")
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=say, exits="none")
    ee = lm.ee
    ee.check_layers(*layers)
    out = Path(args.out) if args.out else user_exits_folder(args.model, lm.source)
    prompts = _prompt_ids(lm, args.prompts, args.max_prompt_tokens, args.seed)
    identity = model_identity(lm.model, args.model)
    say(f"Teacher data: {len(prompts)} prompts, up to {args.max_new_tokens} new tokens each")
    data = _cached(Path(args.data) if args.data else None, _data_key(prompts, args.max_new_tokens, identity), layers,
                   "Teacher data", say, lambda: collect(lm.model, prompts, layers, args.max_new_tokens, lm.eos_ids,
                                                        args.gen_batch, not args.quiet, prompt_positions=True, ee=ee),
                   lambda d: add_layers(ee, d, generation_inputs(d, prompts), layers, not args.quiet))
    # Passed straight to `run` (no names kept here), which frees them once joined: they can be gigabytes.
    sources = {"forced": _forced_data(lm, args, layers, identity, say) if args.forced_text else None}
    sources["extra"] = _extra_data(lm, args, layers, identity, say) if args.extra_prompts else None
    settings = TrainSettings(steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                             attention_lr=args.attention_lr)
    heads, manifest, data = run(ee, prompts, layers, eos_ids=lm.eos_ids, name=args.model,
                                max_new_tokens=args.max_new_tokens, holdout=args.holdout, vocab_size=args.vocab,
                                rank=args.rank, settings=settings, save_dtype=args.save_dtype,
                                batch_size=args.gen_batch, data=data, prompt_positions=not args.generated_only,
                                pick_from=save_layers, show_progress=not args.quiet, log=say, head_type=args.head,
                                forced=sources.pop("forced"), extra=sources.pop("extra"))
    manifest["training"]["prompt_spec"] = args.prompts
    manifest["training"]["options"] = {k: v for k, v in sorted(vars(args).items())
                                       if k not in ("command", "data", "quiet")}  # no local cache paths
    print(format_evaluation(manifest))
    pair = manifest.get("default_layers")
    if best and not pair:
        raise ConfigError("--save-layers best needs at least two --layers to choose a (draft, verify) pair from")
    keep = {pair["draft"], pair["verify"], pair.get("layerskip_exit") or pair["draft"]} if best else save_layers
    kept = {layer: heads[layer] for layer in sorted(keep)}
    save_heads(out, kept, manifest, dtype=args.save_dtype)
    size = sum(f.stat().st_size for f in out.iterdir() if f.is_file())
    auto = out.resolve() in [p.resolve() for p in candidate_folders(args.model, lm.source)]
    print(f"saved heads for layers {', '.join(map(str, sorted(kept)))} to {out} ({size / 2**20:.2f} MB); "
          + ("the engine loads them automatically for this model" if auto else f"use them with --exits {out}"))
    return 0
