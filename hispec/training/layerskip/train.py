"""LayerSkip-style early-exit training of a Llama-family model as LoRA adapters.

The recipe (LayerSkip, arXiv 2404.16710), on low-rank adapters of the decoder projections:
- early-exit loss: the hidden state after layer e goes through the model's own final norm + LM
  head and is trained to predict the next token, at every exit (or a chosen set), weighted more
  for deeper layers; a rotational curriculum may train a rotating subset of the exits per step;
- layer dropout: layer l is skipped (per sequence) with probability p_max * (2^(l/(L-1)) - 1),
  rising with depth;
- self-distillation: KL from the ORIGINAL model's next-token distribution (the frozen base with
  the adapters switched off) to the tuned model's final layer, and optionally to every exit,
  so the tuned model stays close to the original.

Training writes ``checkpoint.pt`` (adapters, optimizer, step, RNG state) every ``save_every``
steps, resumes from it, and finishes with ``adapter.safetensors`` + ``manifest.json`` (see hispec/model/lora.py).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as grad_checkpoint

from hispec.errors import ConfigError
from hispec.model import lora
from hispec.training.layerskip.data import pack
from hispec.training.layerskip.forward import ensure_sdpa, head_logits, run_with_exits

CHECKPOINT_FILE = "checkpoint.pt"
LOG_FILE = "train_log.jsonl"
# settings that must match between a checkpoint and a resumed run
STRUCTURAL = ("rank", "alpha", "targets", "lora_layers", "seed", "seq_len", "batch_size")


@dataclass
class TrainConfig:
    steps: int = 100
    rank: int = 8
    alpha: float | None = None          # default: 2 * rank
    targets: tuple[str, ...] = lora.ALL_TARGETS
    lora_layers: tuple[int, ...] | None = None   # None: every decoder layer
    exits: tuple[int, ...] | None = None         # None: every layer 1..L-1
    rotation: int = 0                   # >1: each step trains every rotation-th exit, rotating
    ee_scale: float = 1.0               # weight of the early-exit loss against the final-layer loss
    exit_weighting: str = "depth"       # depth (weight e) or uniform
    exit_kd: float = 0.5                # exit loss = (1 - kd) * CE(next token) + kd * KL(original final || exit)
    final_ce: float = 0.1               # weight of next-token CE at the final layer
    kl: float = 1.0                     # weight of KL(original final || tuned final)
    layer_dropout: float = 0.1          # p_max of the deepest layer
    lr: float = 2e-4
    warmup: float = 0.05                # fraction of steps with a linear warm-up; cosine to 10% after
    weight_decay: float = 0.0
    batch_size: int = 4
    seq_len: int = 256
    grad_clip: float = 1.0
    seed: int = 0
    save_every: int = 50
    log_every: int = 10
    max_seconds: float | None = None    # stop (and save) once this much wall time has passed
    checkpoint_heads: bool | None = None  # recompute exit logits in backward (None: on CUDA)

    def validate(self, num_layers: int) -> None:
        checks = [
            (self.steps >= 1, "--steps must be >= 1"),
            (self.rank >= 1, "--rank must be >= 1"),
            (self.batch_size >= 1, "--batch-size must be >= 1"),
            (self.seq_len >= 2, "--seq-len must be >= 2"),
            (0 <= self.layer_dropout < 1, "--layer-dropout must be in [0, 1)"),
            (0 <= self.exit_kd <= 1, "--exit-kd must be in [0, 1]"),
            (self.lr > 0, "--lr must be > 0"),
            (0 <= self.warmup < 1, "--warmup must be a fraction in [0, 1)"),
            (self.rotation >= 0, "--rotation must be >= 0"),
            (self.exit_weighting in ("depth", "uniform"), "--exit-weighting must be depth or uniform"),
            (min(self.ee_scale, self.final_ce, self.kl) >= 0, "loss weights must be >= 0"),
            (self.save_every >= 1 and self.log_every >= 1, "--save-every and --log-every must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        for e in self.exits or ():
            if not 0 < e < num_layers:
                raise ConfigError(f"exit {e} is impossible: this model has {num_layers} layers, exits are 1..{num_layers - 1}")
        for i in self.lora_layers or ():
            if not 0 <= i < num_layers:
                raise ConfigError(f"LoRA layer {i} does not exist: layers are 0..{num_layers - 1}")

    def resolved_exits(self, num_layers: int) -> list[int]:
        return sorted(set(self.exits)) if self.exits else list(range(1, num_layers))

    def as_dict(self) -> dict:
        d = asdict(self)
        d["alpha"] = self.alpha if self.alpha is not None else 2.0 * self.rank
        d["targets"] = list(self.targets)
        d["lora_layers"] = list(self.lora_layers) if self.lora_layers is not None else None
        d["exits"] = list(self.exits) if self.exits is not None else None
        return d


def dropout_rates(num_layers: int, p_max: float) -> torch.Tensor:
    """LayerSkip's exponential curriculum over depth: 0 at layer 0, p_max at the last layer."""
    if num_layers == 1:
        return torch.tensor([p_max])
    l = torch.arange(num_layers, dtype=torch.float64)
    return (p_max * (torch.pow(2.0, l / (num_layers - 1)) - 1.0)).float()


def exit_weights(exits: list[int], how: str) -> dict[int, float]:
    raw = {e: float(e) if how == "depth" else 1.0 for e in exits}
    total = sum(raw.values()) or 1.0
    return {e: w / total for e, w in raw.items()}


def active_exits(exits: list[int], rotation: int, step: int) -> list[int]:
    """Rotational curriculum: with rotation R > 1, step t trains exits[i] for i = t mod R (mod R)."""
    if rotation <= 1:
        return exits
    return [e for i, e in enumerate(exits) if i % rotation == step % rotation]


def _loss_terms(model, hidden, labels, teacher_logp, teacher_top, w_ce: float, w_kl: float):
    """w_ce * CE(next token) + w_kl * KL(original || this exit), plus detached figures."""
    logits = head_logits(model, hidden).float()
    logp = F.log_softmax(logits, dim=-1).flatten(0, 1)
    ce = F.nll_loss(logp, labels.flatten())
    kl = F.kl_div(logp, teacher_logp, log_target=True, reduction="batchmean")
    agree = (logits.detach().argmax(-1) == teacher_top).float().mean()
    return w_ce * ce + w_kl * kl, ce.detach(), kl.detach(), agree


def step_loss(model, ids: torch.Tensor, cfg: TrainConfig, exits_now: list[int], weights: dict[int, float],
              keep: torch.Tensor | None, checkpoint_heads: bool) -> tuple[torch.Tensor, dict]:
    """The LayerSkip loss of one batch of token ids [B, T]; returns (loss, figures).

    figures: the loss, final-layer CE and KL, and per active exit its CE, KL and top-1 agreement with
    the ORIGINAL model's final prediction on this batch.
    """
    labels = ids[:, 1:]
    with torch.no_grad(), lora.adapters_disabled(model):
        _, t_hidden = run_with_exits(model, ids, set())
        t_logits = head_logits(model, t_hidden[:, :-1]).float()
        teacher_top = t_logits.argmax(-1)
        teacher_logp = F.log_softmax(t_logits, dim=-1).flatten(0, 1)
        del t_logits, t_hidden
    saved, hidden = run_with_exits(model, ids, set(exits_now), keep)
    loss, final_ce, final_kl, final_agree = _loss_terms(model, hidden[:, :-1], labels, teacher_logp, teacher_top,
                                                        cfg.final_ce, cfg.kl)
    figures: dict = {"final_ce": float(final_ce), "final_kl": float(final_kl),
                     "final_agree_original": float(final_agree)}
    if exits_now:
        norm = sum(weights[e] for e in exits_now)
        ee_loss = torch.zeros((), device=loss.device)
        for e in exits_now:
            fn = lambda h: _loss_terms(model, h[:, :-1], labels, teacher_logp, teacher_top,
                                       1.0 - cfg.exit_kd, cfg.exit_kd)
            if checkpoint_heads:
                term, ce, kl, agree = grad_checkpoint(fn, saved[e], use_reentrant=False)
            else:
                term, ce, kl, agree = fn(saved[e])
            ee_loss = ee_loss + (weights[e] / norm) * term
            figures[f"exit{e}"] = {"ce": float(ce), "kl": float(kl), "agree_original": float(agree)}
        loss = loss + cfg.ee_scale * ee_loss
    figures["loss"] = float(loss.detach())
    return loss, figures


# ----------------------------------------------------------------------------------------------
# the training loop


def lr_at(step: int, cfg: TrainConfig) -> float:
    warm = int(cfg.warmup * cfg.steps)
    if step < warm:
        return cfg.lr * (step + 1) / warm
    progress = (step - warm) / max(1, cfg.steps - warm)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass
class TrainResult:
    steps_done: int
    tokens_seen: int
    seconds: float
    stopped_early: bool
    history: list = field(default_factory=list)


def _save_checkpoint(path: Path, model, optimizer, gen: torch.Generator, step: int, cfg: TrainConfig,
                     base: dict, history: list) -> None:
    state = {"step": step, "adapter": lora.adapter_state(model), "optimizer": optimizer.state_dict(),
             "rng": gen.get_state(), "torch_rng": torch.get_rng_state(), "config": cfg.as_dict(),
             "base": base, "history": history}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load_checkpoint(path: Path, cfg: TrainConfig, base: dict) -> dict:
    state = torch.load(path, weights_only=True)
    old = state["config"]
    new = cfg.as_dict()
    for key in STRUCTURAL:
        if old.get(key) != new.get(key):
            raise ConfigError(f"cannot resume from {path}: {key} was {old.get(key)!r} there and is {new.get(key)!r} "
                              "now; use the same setting or a new --out folder")
    if state["base"].get("fingerprint") != base.get("fingerprint"):
        raise ConfigError(f"cannot resume from {path}: it was trained on another base model "
                          f"({state['base'].get('name')}, fingerprint {state['base'].get('fingerprint')})")
    return state


def prepare_model(model, cfg: TrainConfig) -> dict[str, lora.LoRALinear]:
    """Freeze the base, attach fresh adapters (seeded) and make the layer loop usable."""
    ensure_sdpa(model)
    model.eval()  # no dropout modules: the only randomness is layer dropout, drawn from our generator
    adapters = lora.find_adapters(model)
    if adapters:
        return adapters
    alpha = cfg.alpha if cfg.alpha is not None else 2.0 * cfg.rank
    return lora.attach_lora(model, cfg.rank, alpha, tuple(cfg.targets),
                            list(cfg.lora_layers) if cfg.lora_layers is not None else None, seed=cfg.seed)


def train(model, data: dict, cfg: TrainConfig, out_dir: str | Path, base: dict, resume: bool = False,
          progress: bool = True, log: Callable[[str], None] | None = None, stop_at: int | None = None) -> TrainResult:
    """Train adapters on `model` (attached here if absent). Checkpoints into out_dir.

    stop_at: end this run after that step (checkpointed), as if interrupted; --resume goes on."""
    from tqdm.auto import tqdm

    num_layers = model.config.num_hidden_layers
    cfg.validate(num_layers)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path = out / CHECKPOINT_FILE
    device = next(model.parameters()).device
    prepare_model(model, cfg)
    params = lora.lora_parameters(model)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    chunks = pack(data, cfg.seq_len)
    exits = cfg.resolved_exits(num_layers)
    weights = exit_weights(exits, cfg.exit_weighting)
    rates = dropout_rates(num_layers, cfg.layer_dropout)
    heads_ckpt = cfg.checkpoint_heads if cfg.checkpoint_heads is not None else device.type == "cuda"
    start, history = 0, []
    if resume:
        if not ckpt_path.is_file():
            raise ConfigError(f"--resume: no checkpoint at {ckpt_path}")
        state = _load_checkpoint(ckpt_path, cfg, base)
        lora.load_adapter_state(model, state["adapter"])
        optimizer.load_state_dict(state["optimizer"])
        gen.set_state(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        start, history = int(state["step"]), list(state["history"])
        if log:
            log(f"resumed from {ckpt_path} at step {start}")
    if start >= cfg.steps:
        return TrainResult(start, start * cfg.batch_size * cfg.seq_len, 0.0, False, history)
    t0 = time.perf_counter()
    stopped = False
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc="train-ee", disable=not progress,
               dynamic_ncols=True)
    step = start
    log_file = open(out / LOG_FILE, "a" if resume else "w", encoding="utf-8")
    try:
        for step in bar:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, cfg)
            rows = torch.randint(len(chunks), (cfg.batch_size,), generator=gen)
            keep = torch.rand(num_layers, cfg.batch_size, generator=gen) >= rates[:, None]
            ids = chunks[rows].to(device)
            now = active_exits(exits, cfg.rotation, step)
            loss, figures = step_loss(model, ids, cfg, now, weights, keep if cfg.layer_dropout > 0 else None,
                                      heads_ckpt)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"the loss became {float(loss)} at step {step}; lower --lr")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip)
            optimizer.step()
            agree = [v["agree_original"] for k, v in figures.items() if k.startswith("exit")]
            bar.set_postfix(loss=f"{figures['loss']:.3f}", kl=f"{figures['final_kl']:.3f}",
                            exit_agree=f"{sum(agree) / len(agree):.2f}" if agree else "-")
            if step % cfg.log_every == 0 or step + 1 == cfg.steps:
                record = {"step": step + 1, "lr": lr_at(step, cfg), "seconds": round(time.perf_counter() - t0, 2),
                          **figures}
                history.append(record)
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
            done = step + 1
            over_time = cfg.max_seconds is not None and time.perf_counter() - t0 > cfg.max_seconds
            over_time = over_time or (stop_at is not None and done >= stop_at)
            if done % cfg.save_every == 0 or done == cfg.steps or over_time:
                _save_checkpoint(ckpt_path, model, optimizer, gen, done, cfg, base, history)
            if over_time and done < cfg.steps:
                stopped = True
                if log:
                    log(f"stopped after {done} of {cfg.steps} steps (time budget or stop_at); checkpoint saved, "
                        "--resume continues")
                break
    finally:
        bar.close()
        log_file.close()
    done = step + 1
    return TrainResult(done, (done - start) * cfg.batch_size * cfg.seq_len, time.perf_counter() - t0, stopped,
                       history)
