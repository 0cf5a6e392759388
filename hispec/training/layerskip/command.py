"""`python -m hispec train-ee`: its options, the data (prompt sets -> the original model's greedy
continuations), training (train.train), the held-out evaluation and the saved adapter."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from hispec.errors import ConfigError
from hispec.model import lora
from hispec.training.layerskip.forward import ensure_sdpa
from hispec.training.layerskip.train import TrainConfig, train

HELP = "LayerSkip-style early-exit training of the model itself, as LoRA adapters"
DESCRIPTION = ("Train LoRA adapters so that every exit (final norm + LM head on an early layer) predicts the final "
               "layer: early-exit loss weighted by depth, layer dropout rising with depth, and self-distillation "
               "(KL) from the original model; then report exit agreement and fidelity to the original on held-out "
               "data. Checkpointed and resumable (--resume).")
EPILOG = ("example:\n  python -m hispec train-ee --out ee-run --prompts sharegpt:600 --steps 300 --rank 8\n"
          "  python -m hispec train-ee --out ee-run --steps 600 --resume\n"
          "  python -m hispec train-ee --out ee-eval --data ee-run/data.pt --eval-only --adapter ee-run")


def add_parser(sub, **kwargs) -> argparse.ArgumentParser:
    """The `train-ee` subcommand of `sub` (the CLI's subparsers), with its options."""
    p = sub.add_parser("train-ee", help=HELP, description=DESCRIPTION, epilog=EPILOG, **kwargs)
    add_arguments(p)
    return p


def _int_list(text: str | None) -> tuple[int, ...] | None:
    if text is None or text.strip().lower() in ("", "all"):
        return None
    try:
        return tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ConfigError(f"expected 'all' or a comma-separated list of whole numbers, got '{text}'") from None


def add_arguments(p) -> None:
    """The options of `python -m hispec train-ee` (cli/main.py adds the subcommand)."""
    p.add_argument("--model", default="default", help="'default', a local folder or a Hugging Face id (Llama family)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output folder: data.pt, checkpoint.pt, train_log.jsonl, adapter.safetensors, "
                        "manifest.json, eval.json")
    p.add_argument("--data", metavar="FILE", default=None,
                   help="prepared data (default DIR/data.pt; made from --prompts when missing)")
    p.add_argument("--prompts", default="sharegpt:600",
                   help="prompt sets for new data, SET[:N][,...] as in bench (default sharegpt:600)")
    p.add_argument("--heldout", type=int, default=32, help="held-out prompts for the evaluation (default 32)")
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="longer prompts are dropped (default 256)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="length of the greedy continuations (default 128)")
    p.add_argument("--gen-batch", type=int, default=16, help="batch size of the data generation (default 16)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps in all (a resumed run continues to it)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8)")
    p.add_argument("--alpha", type=float, default=None, help="LoRA alpha; scale = alpha / rank (default 2 * rank)")
    p.add_argument("--targets", default="all", help="projections: all, attention, mlp or a list like q_proj,v_proj")
    p.add_argument("--lora-layers", default="all", help="decoder layers with adapters, 0-based list (default all)")
    p.add_argument("--exits", default="all", help="exits trained, e.g. 4,8,12 (default all layers 1..L-1)")
    p.add_argument("--rotation", type=int, default=0, help="rotational curriculum: train 1 in R exits per step")
    p.add_argument("--ee-scale", type=float, default=1.0, help="weight of the early-exit loss (default 1)")
    p.add_argument("--exit-weighting", default="depth", choices=("depth", "uniform"))
    p.add_argument("--exit-kd", type=float, default=0.5,
                   help="exit loss = (1-kd) CE(next token) + kd KL(original final || exit) (default 0.5)")
    p.add_argument("--final-ce", type=float, default=0.1, help="weight of CE at the final layer (default 0.1)")
    p.add_argument("--kl", type=float, default=1.0, help="weight of KL(original || tuned) at the final layer")
    p.add_argument("--layer-dropout", type=float, default=0.1, help="drop rate of the deepest layer (default 0.1)")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--warmup", type=float, default=0.05, help="warm-up fraction of the steps")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save-every", type=int, default=50, help="checkpoint every N steps (default 50)")
    p.add_argument("--max-minutes", type=float, default=None, help="stop (checkpointed) after this many minutes")
    p.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt")
    p.add_argument("--save-dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    p.add_argument("--draft-exit", type=int, default=None, help="draft exit recorded in the manifest (default L/8)")
    p.add_argument("--verify-exit", type=int, default=None, help="verify exit recorded in the manifest (default L/4)")
    p.add_argument("--eval-only", action="store_true",
                   help="only evaluate: the untouched model, or with --adapter DIR a saved adapter")
    p.add_argument("--adapter", default=None, metavar="DIR", help="adapter to evaluate with --eval-only")
    p.add_argument("--no-eval", action="store_true", help="skip the evaluation after training")
    p.add_argument("--eval-exits", default="all", help="exits evaluated (default all)")
    p.add_argument("--eval-seqs", type=int, default=None, help="held-out sequences evaluated (default all)")
    p.add_argument("--free-run", type=int, default=4, help="held-out prompts also generated free-running (default 4)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="base weights dtype (adapters always train in float32)")


def config_from_args(args) -> TrainConfig:
    return TrainConfig(
        steps=args.steps, rank=args.rank, alpha=args.alpha, targets=lora.parse_targets(args.targets),
        lora_layers=_int_list(args.lora_layers), exits=_int_list(args.exits), rotation=args.rotation,
        ee_scale=args.ee_scale, exit_weighting=args.exit_weighting, exit_kd=args.exit_kd, final_ce=args.final_ce,
        kl=args.kl, layer_dropout=args.layer_dropout, lr=args.lr, warmup=args.warmup, batch_size=args.batch_size,
        seq_len=args.seq_len, seed=args.seed, save_every=args.save_every,
        max_seconds=args.max_minutes * 60 if args.max_minutes else None)


def build_data(lm, spec: str, heldout: int, max_prompt_tokens: int, max_new_tokens: int, gen_batch: int,
               seed: int, log: Callable[[str], None]) -> dict:
    """Prompts from prompt sets -> tokenized split -> the original model's greedy continuations."""
    from hispec.data.prompts import load_sets
    from hispec.training.layerskip.data import generate_continuations, tokenize_prompts

    prompts = [p for ps in load_sets(spec, seed=seed).values() for p in ps]
    tok = lm.tokenizer
    data = tokenize_prompts(prompts, lambda t: lm.encode(t, chat=True),
                            lambda t: list(tok.encode(t, add_special_tokens=False)), heldout, max_prompt_tokens, seed)
    data["meta"]["spec"] = spec
    pad = tok.pad_token_id if tok.pad_token_id is not None else min(lm.eos_ids or {0})
    log(f"generating greedy continuations of {len(data['train']['prompt'])} + {heldout} prompts "
        f"({max_new_tokens} tokens each at most)")
    return generate_continuations(data, lm.model, max_new_tokens, lm.eos_ids, pad, gen_batch, log)


def write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1))
    os.replace(tmp, path)


def run_from_args(args, log: Callable[[str], None]) -> int:
    from hispec.engine.config import default_exits
    from hispec.model.loading import load_model
    from hispec.training.layerskip.data import load_data, save_data
    from hispec.training.layerskip.evaluation import evaluate, summary_lines

    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = config_from_args(args)
    out = Path(args.out)
    lm = load_model(args.model, device=args.device, dtype=args.dtype, progress=log)
    model = lm.model
    L = model.config.num_hidden_layers
    cfg.validate(L)
    base = lora.base_identity(model, args.model)
    data_path = Path(args.data) if args.data else out / "data.pt"
    if data_path.is_file():
        data = load_data(data_path)
    else:
        data = build_data(lm, args.prompts, args.heldout, args.max_prompt_tokens, args.max_new_tokens,
                          args.gen_batch, args.seed, log)
        save_data(data, data_path)
        log(f"data written to {data_path}: {data['meta']}")
    eval_kw = dict(exits=list(_int_list(args.eval_exits) or range(1, L)), max_seqs=args.eval_seqs,
                   free_run=args.free_run, eos_ids=lm.eos_ids, progress=None)
    d, v = (given if given is not None else default for given, default in
            zip((args.draft_exit, args.verify_exit), default_exits(L)))
    out.mkdir(parents=True, exist_ok=True)
    if args.eval_only:
        if args.adapter:
            manifest, tensors = lora.read_adapter(args.adapter)
            ensure_sdpa(model)
            lora.attach_lora(model, int(manifest["rank"]), float(manifest["alpha"]),
                             tuple(manifest["training"]["targets"]), manifest["training"]["lora_layers"])
            lora.load_adapter_state(model, tensors)
        report = evaluate(model, data, **eval_kw)
        write_json(out / "eval.json", report)
        for line in summary_lines(report, (d, v)):
            print(line)
        return 0
    result = train(model, data, cfg, out, base, resume=args.resume, progress=not args.no_progress, log=log)
    log(f"trained {result.steps_done} steps ({result.tokens_seen} tokens this run) in {result.seconds:.0f} s"
        + (" (stopped by the time budget)" if result.stopped_early else ""))
    report = None
    if not args.no_eval:
        report = evaluate(model, data, **eval_kw)
        write_json(out / "eval.json", report)
        for line in summary_lines(report, (d, v)):
            print(line)
    manifest = {"base": base, "training": dict(cfg.as_dict(), steps_done=result.steps_done,
                                               stopped_early=result.stopped_early, data=data["meta"]),
                "figures": report, "exits": {"draft": d, "verify": v}}
    lora.save_adapter(model, out, manifest, dtype=args.save_dtype)
    log(f"adapter written to {out}")
    return 0
