"""LayerSkip-style early-exit training of the default model on the GPU machine, in two calls.

The GPU machine (one H200, no network, torch + transformers but no `gguf`) takes at most 64 MiB of
carried files per call and returns at most 8 files of 16 MiB through $OUT; a session has 15
minutes of device time, machine starts included, and the machine is given back 30 s after a
call ends. The default model is a 98 MB GGUF, so its quantized blocks travel in two parts
(scripts/gpu/gguf_pack.py: ~48 + ~44 MiB, rebuilt bit-exactly, fingerprint checked), one per call:

  here, once (CPU, ~1 min):
    python scripts/gpu/gpu_train_ee.py prepare            # writes .ee_gpu/{part1,part2}/ and .ee_gpu/prompts.pt
        and prints what each call sends, the working tree included; over 64 MiB it names the largest tracked
        files (on 2026-12-04 the tree was 17.5 MiB and part 1 did not fit until the exit heads, which the
        training does not read, were moved out of the checkout for the two calls and back after)

  device call 1 (carry [".ee_gpu/part1"], timeout_s 240; ~1-2 min with the start):
    python scripts/gpu/gpu_train_ee.py stage
        copies part 1 to /tmp/hispec-ee (kept while the machine stays warm) and runs the whole
        pipeline on a tiny random model on CUDA (bf16, checkpointed heads): a smoke test of the code

  device call 2, AT ONCE after call 1 (the machine goes back after 30 s idle)
    (carry [".ee_gpu/part2", ".ee_gpu/prompts.pt"], timeout_s 570):
    PYTHONUNBUFFERED=1 python scripts/gpu/gpu_train_ee.py run --budget-s 480
        rebuilds the model (fails in seconds, naming what is missing, if part 1 is gone: then
        repeat call 1 and 2), generates the original model's greedy (+ one sampled) continuations
        of the prompts, runs a short smoke training on the real model, sizes the real run to the
        time left from the measured step time, trains, evaluates tuned vs original (float32) and
        writes to $OUT: adapter.safetensors (float16, < 16 MiB), manifest.json, eval.json,
        train_log.jsonl, run.json.

Device time: ~1-2 min per machine start + ~1 min (call 1) + ~8.5 min (call 2) of the 15 minutes, so
there is no room for a second full call 2: if call 2 stops early, rerun it at once with a smaller
--budget-s (e.g. 240). What lands in $OUT is written as each phase ends (run.json at every phase).

Then, here: copy adapter.safetensors + manifest.json into assets/default-ee/ only if the figures
earn it (see README), and `python -m hispec generate --model default-ee ...`.

Every step also runs on the CPU with a tiny random model (tests/training/test_train_ee.py does):
    python scripts/gpu/gpu_train_ee.py run --tiny --device cpu --out /tmp/x
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

CARRY = ROOT / ".ee_gpu"
STAGE = Path(os.environ.get("HISPEC_EE_STAGE", "/tmp/hispec-ee"))
T0 = time.perf_counter()


def say(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f}s] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# here: prepare the carried files


def cmd_prepare(args) -> int:
    import torch

    from hispec.training.layerskip.data import save_data, tokenize_prompts
    from gguf_pack import pack_gguf
    from hispec.model.loading import default_gguf_path, default_model_folder, load_model
    from hispec.model.lora import model_fingerprint
    from hispec.data.prompts import load_sets

    torch.set_num_threads(args.threads)
    lm = load_model("default", device="cpu", dtype="float32", exits="none")
    fingerprint = model_fingerprint(lm.model)
    tmp = CARRY / "pack"
    pack = pack_gguf(default_gguf_path(), default_model_folder(), tmp, max_part_mb=args.max_part_mb,
                     fingerprint=fingerprint)
    if len(pack["parts"]) != 2:
        raise SystemExit(f"expected 2 parts, got {len(pack['parts'])}: adjust --max-part-mb")
    # part1/ holds part 1 and the small files, part2/ holds part 2 (+ the small files again)
    for n in (1, 2):
        folder = CARRY / f"part{n}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        shutil.move(str(tmp / f"base-part{n}.safetensors"), folder)
        for small in ("config.json", "generation_config.json", "pack.json"):
            if (tmp / small).is_file():
                shutil.copy(tmp / small, folder)
    shutil.rmtree(tmp)
    prompts = [p for ps in load_sets(args.prompts, seed=args.seed).values() for p in ps]
    tok = lm.tokenizer
    data = tokenize_prompts(prompts, lambda t: lm.encode(t, chat=True),
                            lambda t: list(tok.encode(t, add_special_tokens=False)), args.heldout,
                            args.max_prompt_tokens, args.seed)
    data["meta"].update(spec=args.prompts, eos_ids=sorted(lm.eos_ids),
                        pad_id=tok.pad_token_id if tok.pad_token_id is not None else min(lm.eos_ids),
                        fingerprint=fingerprint)
    save_data(data, CARRY / "prompts.pt")
    sizes = {str(p.relative_to(ROOT)): p.stat().st_size for p in sorted(CARRY.rglob("*")) if p.is_file()}
    for path, size in sizes.items():
        print(f"{size / 2**20:8.2f} MiB  {path}")
    tree = travelling_tree_bytes()
    for n in (1, 2):
        total = sum(s for p, s in sizes.items() if f"part{n}" in p) + (sizes.get(".ee_gpu/prompts.pt", 0) if n == 2 else 0)
        over = total + tree > 64 * 2**20
        print(f"call {n} carries {total / 2**20:.1f} MiB + the working tree {tree / 2**20:.1f} MiB = "
              f"{(total + tree) / 2**20:.1f} MiB; limit 64 MiB" + (": OVER" if over else ""))
        if over:
            big = sorted(((s, f) for f, s in tracked_files().items()), reverse=True)[:3]
            print("  the tree travels with every call: move large tracked files the training does not read out of the "
                  "checkout during the two calls, and back after (2026-12-04: the exit heads), e.g. "
                  + ", ".join(f"{f} ({s / 2**20:.1f} MiB)" for s, f in big))
    print(f"{len(data['train']['prompt'])} training prompts, {args.heldout} held out; fingerprint {fingerprint}")
    return 0


def tracked_files() -> dict[str, int]:
    """Tracked files present in the checkout and their sizes (what a device call sends, beside what it carries)."""
    import subprocess

    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return {n: (ROOT / n).stat().st_size for n in names.split("\0") if n and (ROOT / n).is_file()}


def travelling_tree_bytes() -> int:
    """Tracked files plus untracked files git does not ignore: the working tree a device call sends."""
    import subprocess

    extra = subprocess.run(["git", "ls-files", "-z", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout
    return sum(tracked_files().values()) + sum((ROOT / n).stat().st_size for n in extra.split("\0")
                                               if n and (ROOT / n).is_file())


# ---------------------------------------------------------------------------------------------
# on the device


def _out_dir(args) -> Path:
    out = Path(args.out or os.environ.get("OUT") or "gpu-ee-out")
    out.mkdir(parents=True, exist_ok=True)
    return out


def tiny_setup(device: str, dtype):
    """A tiny random Llama and random prompt data, standing in for the default model (--tiny)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, eos_token_id=2, bos_token_id=1, pad_token_id=0,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    g = torch.Generator().manual_seed(1)
    prompt = lambda: torch.randint(3, 128, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g)
    empty = lambda n: [torch.zeros(0, dtype=torch.long) for _ in range(n)]
    held = [prompt() for _ in range(4)]
    data = {"meta": {"spec": "tiny", "eos_ids": [2], "pad_id": 0},
            "train": {"prompt": [prompt() for _ in range(32)], "continuation": empty(32)},
            "heldout": {"prompt": held, "continuation": empty(4)},
            "heldout_text": [h.clone() for h in held]}
    return model, data


def pipeline(model, data: dict, out: Path, args, budget_s: float, tiny: bool) -> dict:
    """Continuations -> smoke training -> sized real training -> float32 evaluation -> files in out."""
    import torch

    from hispec.model import lora
    from hispec.training.layerskip.data import generate_continuations
    from hispec.training.layerskip.evaluation import evaluate, summary_lines
    from hispec.training.layerskip.train import TrainConfig, train

    out.mkdir(parents=True, exist_ok=True)
    device = next(model.parameters()).device
    run = {"device": str(device), "tiny": tiny, "torch": torch.__version__, "budget_s": budget_s, "phases": {}}
    if device.type == "cuda":
        run["gpu"] = torch.cuda.get_device_name(0)
    L = model.config.num_hidden_layers
    base = lora.base_identity(model, "tiny" if tiny else "default")
    dtype = torch.bfloat16 if args.dtype == "bfloat16" else torch.float32
    exact = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}  # float32 base
    model.to(dtype)
    eos, pad = set(data["meta"]["eos_ids"]), int(data["meta"]["pad_id"])

    def phase(name, t):
        run["phases"][name] = round(time.perf_counter() - t, 1)
        (out / "run.json").write_text(json.dumps(run, indent=1))

    # 1. the original model's continuations (greedy, plus one sampled per training prompt)
    t = time.perf_counter()
    if args.max_prompts:
        data["train"] = {k: v[:args.max_prompts] for k, v in data["train"].items()}
    if args.eval_seqs:
        data["heldout"] = {k: v[:args.eval_seqs] for k, v in data["heldout"].items()}
        data["heldout_text"] = data["heldout_text"][:args.eval_seqs]
    generate_continuations(data, model, args.max_new_tokens, eos, pad, args.gen_batch,
                           progress=None)
    if args.sampled:
        torch.manual_seed(args.seed)
        sampled = _sampled(model, data["train"]["prompt"], args.max_new_tokens, eos, pad, args.gen_batch)
        data["train"]["prompt"] = data["train"]["prompt"] + data["train"]["prompt"]
        data["train"]["continuation"] = data["train"]["continuation"] + sampled
    tokens = sum(len(p) + len(c) for p, c in zip(data["train"]["prompt"], data["train"]["continuation"]))
    run["train_tokens"] = tokens
    say(f"data: {len(data['train']['prompt'])} training sequences, {tokens} tokens")
    phase("generate", t)

    cfg_kw = dict(rank=args.rank, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                  rotation=args.rotation, layer_dropout=args.layer_dropout, exit_kd=args.exit_kd,
                  final_ce=args.final_ce, kl=args.kl, ee_scale=args.ee_scale, seed=args.seed, exits=None)
    # 2. smoke: a few steps on a throwaway copy of the adapters, timed
    t = time.perf_counter()
    smoke_kw = dict(cfg_kw, log_every=1)
    smoke = TrainConfig(steps=max(3, args.smoke_steps), save_every=10**6, **smoke_kw)
    r = train(model, data, smoke, out / "smoke", base, progress=False)
    first, last = r.history[0], r.history[-1]
    # steady step time: from the end of step 2 to the end (the first steps pay for warm-up)
    step_s = (last["seconds"] - r.history[1]["seconds"]) / max(1, len(r.history) - 2)
    run["smoke"] = {"steps": r.steps_done, "loss_first": first["loss"], "loss_last": last["loss"],
                    "s_per_step": round(step_s, 3)}
    say(f"smoke: loss {first['loss']:.3f} -> {last['loss']:.3f}, {step_s:.3f} s/step")
    shutil.rmtree(out / "smoke", ignore_errors=True)
    for m in lora.find_adapters(model).values():  # start the real run from fresh adapters
        torch.nn.init.zeros_(m.lora_B)
    lora.merge_attached(model)  # B = 0: unwraps without changing any weight
    phase("smoke", t)

    # 3. the real run, sized to the time left
    t = time.perf_counter()
    left = budget_s - (time.perf_counter() - T0) - args.reserve_s
    steps = max(1, min(args.steps, int(left / step_s * 0.9)))
    run["planned_steps"] = steps
    say(f"real run: {steps} steps ({left:.0f} s left for training)")
    work = Path(args.work) if args.work else (STAGE / "run")
    cfg = TrainConfig(steps=steps, save_every=max(50, steps // 4), max_seconds=max(10.0, left), log_every=10,
                      **cfg_kw)
    result = train(model, data, cfg, work, base, progress=False, log=say)
    run["trained"] = {"steps": result.steps_done, "seconds": round(result.seconds, 1),
                      "tokens": result.tokens_seen, "stopped_early": result.stopped_early}
    shutil.copy(work / "train_log.jsonl", out / "train_log.jsonl")
    phase("train", t)

    # 4. evaluation in float32, with the adapters rounded as they are saved
    t = time.perf_counter()
    save_dtype = "float16" if not tiny else "float32"
    with torch.no_grad():
        for p in lora.lora_parameters(model):
            p.copy_(p.to(getattr(torch, save_dtype)).float())
    model.float()
    with torch.no_grad():  # the exact float32 base again (training rounded it to bfloat16)
        for name, tensor in model.state_dict().items():
            key = name.replace(".base.", ".")
            if ".lora_" not in name and key in exact:
                tensor.copy_(exact[key])
    report = evaluate(model, data, exits=list(range(1, L)), free_run=args.free_run,
                      free_run_tokens=min(args.max_new_tokens, 128), eos_ids=eos)
    for line in summary_lines(report):
        say(line)
    (out / "eval.json").write_text(json.dumps(report, indent=1))
    d, v = choose_exits(report["exit_agreement"]["tuned"], L)
    phase("eval", t)
    manifest = {"base": base, "training": dict(cfg.as_dict(), steps_done=result.steps_done,
                                               stopped_early=result.stopped_early, data=data["meta"],
                                               train_tokens=tokens, sampled=args.sampled),
                "figures": report, "exits": {"draft": d, "verify": v}, "run": run}
    lora.save_adapter(model, out, manifest, dtype=save_dtype)
    run["exits"] = {"draft": d, "verify": v}
    phase("total", T0)
    say(f"done: adapter + manifest in {out}; draft {d}, verify {v}")
    return run


def _sampled(model, prompts, max_new_tokens, eos, pad, batch_size):
    """One sampled continuation (temperature 0.8) per prompt, for more varied training text."""
    import torch

    device = next(model.parameters()).device
    out = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start:start + batch_size]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, p in enumerate(chunk):
            ids[row, width - len(p):] = p
            mask[row, width - len(p):] = 1
        gen = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             do_sample=True, temperature=0.8, top_k=0, top_p=1.0,
                             eos_token_id=sorted(eos), pad_token_id=pad)[:, width:].cpu()
        for row in gen.tolist():
            cut = next((k + 1 for k, tok in enumerate(row) if tok in eos), len(row))
            out.append(torch.tensor(row[:cut], dtype=torch.long))
    return out


def choose_exits(agreement: dict, num_layers: int) -> tuple[int, int]:
    """Draft and verify exits for the manifest: the shallowest exit reaching 50% agreement with the
    final layer if it lies in the first third of the layers (else the engine's default L/8), and
    the shallowest reaching 70% if it lies in the first half (else L/4); deeper exits save too
    little to be worth speculating with."""
    import math

    from hispec.engine.config import default_exits

    by_layer = {int(k): a for k, a in agreement.items()}

    def reach(goal, limit):
        e = next((e for e in sorted(by_layer) if by_layer[e] >= goal), None)
        return e if e is not None and e <= limit else None

    default_d, default_v = default_exits(num_layers)
    d = reach(0.5, math.ceil(num_layers / 3)) or default_d
    v = reach(0.7, math.ceil(num_layers / 2)) or default_v
    if v <= d:
        v = d + 1 if d + 1 < num_layers else v
        d = min(d, v - 1)
    return d, v


def _stage_parts() -> Path:
    """Gather the carried parts in STAGE (part 1 came in the previous call)."""
    STAGE.mkdir(parents=True, exist_ok=True)
    for n in (1, 2):
        src = CARRY / f"part{n}"
        if src.is_dir():
            for f in src.iterdir():
                shutil.copy(f, STAGE / f.name)
    return STAGE


def cmd_stage(args) -> int:
    import torch

    from gguf_pack import PACK_FILE

    out = _out_dir(args)
    folder = _stage_parts()
    pack = json.loads((folder / PACK_FILE).read_text()) if (folder / PACK_FILE).is_file() else {"parts": []}
    have = [p["file"] for p in pack["parts"] if (folder / p["file"]).is_file()]
    say(f"staged in {folder}: {have}")
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model, data = tiny_setup(device, None)
    model.to(device)
    args.steps, args.smoke_steps, args.max_new_tokens, args.gen_batch, args.free_run = 20, 3, 16, 8, 2
    args.batch_size, args.seq_len, args.rank = 4, 64, 4
    run = pipeline(model, data, out / "tiny", args, budget_s=120, tiny=True)
    (out / "stage.json").write_text(json.dumps({"staged": have, "tiny_run": run}, indent=1))
    return 0


def cmd_run(args) -> int:
    import torch

    from hispec.training.layerskip.data import load_data
    from hispec.errors import ModelLoadError
    from gguf_pack import build_model, check_parts

    out = _out_dir(args)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cpu":
        torch.set_num_threads(args.threads)
    if args.tiny:
        model, data = tiny_setup(device, None)
        model.to(device)
    else:
        folder = _stage_parts()
        try:
            check_parts(folder)  # names the missing part at once
        except (ModelLoadError, OSError, ValueError) as exc:
            say(f"cannot rebuild the model: {exc}. Run call 1 (stage) and then this call at once.")
            (out / "run.json").write_text(json.dumps({"error": str(exc)}))
            return 3
        say("rebuilding the default model from its packed GGUF blocks")
        model = build_model(folder).to(device)
        data_path = CARRY / "prompts.pt"
        if not data_path.is_file():
            data_path = STAGE / "prompts.pt"
        data = load_data(data_path)
        say(f"model ready on {device}; {len(data['train']['prompt'])} training prompts")
    pipeline(model, data, out, args, budget_s=args.budget_s, tiny=args.tiny)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="here: pack the default model in two parts, tokenize prompts")
    prep.add_argument("--prompts", default="sharegpt,humaneval,mtbench",
                      help="prompt sets (default: all of ShareGPT's 2000-record pool, HumanEval, MT-Bench)")
    prep.add_argument("--heldout", type=int, default=64)
    prep.add_argument("--max-prompt-tokens", type=int, default=384)
    prep.add_argument("--max-part-mb", type=float, default=48.0)
    prep.add_argument("--seed", type=int, default=0)
    prep.add_argument("--threads", type=int, default=1)
    for name, helptext in (("stage", "device call 1: stage part 1, smoke-test the pipeline on a tiny model"),
                           ("run", "device call 2: rebuild the model, generate, smoke, train, evaluate")):
        r = sub.add_parser(name, help=helptext)
        r.add_argument("--out", default=None, help="results folder (default $OUT)")
        r.add_argument("--work", default=None, help="checkpoint folder (default /tmp/hispec-ee/run)")
        r.add_argument("--tiny", action="store_true", help="a tiny random model instead of the default model")
        r.add_argument("--device", default="auto")
        r.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"),
                       help="base weights while generating and training (evaluation is float32)")
        r.add_argument("--budget-s", type=float, default=480, help="wall seconds for the whole run (default 480)")
        r.add_argument("--reserve-s", type=float, default=75, help="seconds kept for evaluation and saving")
        r.add_argument("--steps", type=int, default=3000, help="upper bound; the time left decides (default 3000)")
        r.add_argument("--smoke-steps", type=int, default=5)
        r.add_argument("--rank", type=int, default=16)
        r.add_argument("--batch-size", type=int, default=16)
        r.add_argument("--seq-len", type=int, default=512)
        r.add_argument("--lr", type=float, default=3e-4)
        r.add_argument("--rotation", type=int, default=4, help="rotational curriculum over exits 1..L-1")
        r.add_argument("--layer-dropout", type=float, default=0.1)
        r.add_argument("--exit-kd", type=float, default=0.5)
        r.add_argument("--final-ce", type=float, default=0.1)
        r.add_argument("--kl", type=float, default=1.0)
        r.add_argument("--ee-scale", type=float, default=1.0)
        r.add_argument("--max-new-tokens", type=int, default=256)
        r.add_argument("--gen-batch", type=int, default=256)
        r.add_argument("--sampled", type=int, default=1, choices=(0, 1), help="add one sampled continuation per prompt")
        r.add_argument("--free-run", type=int, default=16, help="held-out prompts also generated free-running")
        r.add_argument("--max-prompts", type=int, default=0, help="use only the first N training prompts (0 = all)")
        r.add_argument("--eval-seqs", type=int, default=0, help="use only the first N held-out prompts (0 = all)")
        r.add_argument("--seed", type=int, default=0)
        r.add_argument("--threads", type=int, default=1, help="torch threads on a CPU (tiny runs)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return {"prepare": cmd_prepare, "stage": cmd_stage, "run": cmd_run}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
