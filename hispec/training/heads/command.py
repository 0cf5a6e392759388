"""`python -m hispec train-exits`: its options, the teacher-data caches (--data, --forced-text,
--extra-prompts) and the run (pipeline.run), saved where the engine finds the heads."""

from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from hispec.errors import ConfigError
from hispec.model.heads import candidate_folders, model_identity, save_heads, user_exits_folder
from hispec.training.heads.data import Progress, TeacherData, add_layers, collect, collect_forced, generation_inputs
from hispec.training.heads.evaluation import format_evaluation
from hispec.training.heads.pipeline import run
from hispec.training.heads.prompts import prompt_ids
from hispec.training.heads.train import TrainSettings

HELP = "train exit heads by self-distillation and evaluate them held out"
DESCRIPTION = ("Train a small head per exit layer (norm + residual linear map in front of the model's own LM head, "
               "optionally after one attention block with its own KV cache: --head attention) to predict the full "
               "model's next token, on the full model's own greedy continuations of a prompt set; the model's "
               "weights never change. Reports held-out top-1 agreement before/after and saves the heads with a "
               "manifest; the engine then loads them for this model.")
EPILOG = """examples:
  python -m hispec train-exits --layers 4,8
  python -m hispec train-exits --model ./my-llama --layers 2,4,6,8 --prompts sharegpt:400,mtbench:80 \
      --steps 4000 --data teacher.pt --out ./my-exits
  python -m hispec generate --model ./my-llama --exits ./my-exits --prompt "Hi"
"""


def add_parser(sub, parents=(), whole_number: Callable[[str], int] = int, **kwargs) -> argparse.ArgumentParser:
    """The `train-exits` subcommand of `sub` (the CLI's subparsers) with its options; `parents` carry the
    shared options (the model's), `whole_number` the CLI's parser of whole numbers."""
    tx = sub.add_parser("train-exits", help=HELP, description=DESCRIPTION, epilog=EPILOG, parents=list(parents),
                        **kwargs)
    tx.add_argument("--layers", required=True, help="exit layers to train, comma-separated, e.g. 4,8")
    tx.add_argument("--prompts", default="sharegpt:200",
                    help="prompt sets as in bench (SET[:N],...; default sharegpt:200); some are held out")
    tx.add_argument("--holdout", type=float, default=0.1, help="fraction of prompts held out for evaluation (0.1)")
    tx.add_argument("--max-new-tokens", type=whole_number, default=128, help="teacher continuation length (128)")
    tx.add_argument("--max-prompt-tokens", type=whole_number, default=256, help="skip longer prompts (256)")
    tx.add_argument("--vocab", type=whole_number, default=4096,
                    help="exits score only the K most frequent tokens of the model's own outputs (default 4096; "
                         "0 = full vocabulary); the full model always uses the full vocabulary")
    tx.add_argument("--head", choices=("linear", "attention"), default="linear",
                    help="linear: norm + residual map (default); attention: one attention block over the exit's "
                         "earlier positions first, with its own KV cache (better agreement, about 1.8 MB more "
                         "per head on the default model)")
    tx.add_argument("--rank", type=whole_number, default=0, help="rank of the residual map (0 = full, default)")
    tx.add_argument("--steps", type=whole_number, default=2000, help="training steps (2000)")
    tx.add_argument("--batch-size", type=whole_number, default=256,
                    help="tokens per training step (256); attention heads take whole sequences up to about this many")
    tx.add_argument("--lr", type=float, default=4e-3, help="AdamW learning rate, cosine decay (4e-3)")
    tx.add_argument("--attention-lr", type=float, default=1e-3,
                    help="learning rate of an attention head's attention block (1e-3)")
    tx.add_argument("--gen-batch", type=whole_number, default=32,
                    help="prompts per teacher generation batch (32; the lean path decodes them together)")
    tx.add_argument("--seed", type=whole_number, default=0)
    tx.add_argument("--save-layers", default=None,
                    help="save only these trained layers, or 'best': the estimated best hispec (draft, verify) "
                         "pair and layerskip exit (default: all)")
    tx.add_argument("--save-dtype", default="float16", help="float16 (default), bfloat16 or float32")
    tx.add_argument("--out", default=None, help="output folder (default: the HiSpec cache, where the engine "
                                                "finds heads for this model automatically)")
    tx.add_argument("--data", metavar="FILE.pt", default=None,
                    help="teacher-data cache: reused when it matches the prompts and settings, else written")
    tx.add_argument("--forced-text", type=whole_number, default=0, metavar="N",
                    help="also train on N ShareGPT exchanges (question + reply, never used as prompts) run "
                         "teacher-forced through the full model: cheap extra data, no generation (default 0)")
    tx.add_argument("--extra-prompts", type=whole_number, default=0, metavar="N",
                    help="also train on the full model's own generations for N more ShareGPT questions (after the "
                         "prompt pool and the --forced-text exchanges): training only, never held out, so the "
                         "held-out set of --prompts stays the same (default 0)")
    tx.add_argument("--forced-max-tokens", type=whole_number, default=512,
                    help="cut each teacher-forced exchange to this many tokens (512)")
    tx.add_argument("--generated-only", action="store_true",
                    help="train on the positions the full model wrote only, not also on the prompts' positions")
    tx.add_argument("--threads", type=whole_number, default=0, help="torch CPU threads (0 = torch's default)")
    tx.add_argument("--quiet", action="store_true", help="no progress bars")
    return tx


def parse_layers(text: str) -> list[int]:
    try:
        layers = sorted({int(x) for x in text.replace(" ", "").split(",") if x})
    except ValueError:
        raise ConfigError(f"--layers '{text}': expected comma-separated whole numbers, e.g. 4,8") from None
    if not layers:
        raise ConfigError("--layers is empty: give the exit layers to train, e.g. 4,8")
    return layers


def _data_key(prompts: list[list[int]], max_new_tokens: int, identity: dict) -> str:
    import hashlib
    import json

    # "v2": prompt positions from 0 on (what attention heads need); older caches are not reused.
    blob = json.dumps([prompts, max_new_tokens, identity, "v2"], sort_keys=True).encode()
    return hashlib.sha1(blob).hexdigest()


def _forced_data(lm, args, layers: list[int], identity: dict, say: Progress) -> TeacherData:
    """Teacher-forced ShareGPT exchanges (--forced-text N), cached next to --data when given."""
    from pathlib import Path

    from hispec.data.prompts import load_sharegpt_dialogues

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

    from hispec.data.prompts import load_sharegpt_questions

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
    prompts = prompt_ids(lm, args.prompts, args.max_prompt_tokens, args.seed)
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
