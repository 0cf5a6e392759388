"""Training exit heads by self-distillation: every head learns, on the same batches, to minimise
KL(teacher || exit) over the head's vocabulary (the teacher renormalised to the subset). Target
weights never change."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from hispec.model.heads import ExitHead
from hispec.training.heads.data import TeacherData, padded, progress_bar, segments


@dataclass
class TrainSettings:
    steps: int = 2000
    batch_size: int = 256
    lr: float = 4e-3
    warmup: int = 50
    weight_decay: float = 0.0
    seed: int = 0
    attention_lr: float = 1e-3  # attention heads: their attention block (it starts from the model's weights)


def train(heads: dict[int, ExitHead], data: TeacherData, lm_head_weight: torch.Tensor, settings: TrainSettings,
          show_progress: bool = False, loss_mask: torch.Tensor | None = None) -> list[dict]:
    """Train every head on the same batches (KL to the teacher over each head's vocabulary).
    Returns a short loss history. Attention heads train on whole sequences (see _train_sequences)."""
    if any(head.stateful for head in heads.values()):
        return _train_sequences(heads, data, lm_head_weight, settings, show_progress, loss_mask)
    gen = torch.Generator().manual_seed(settings.seed)
    n = len(data)
    device = lm_head_weight.device
    vocab = next(iter(heads.values())).vocab_ids
    teacher_weight = (lm_head_weight.detach()[vocab].contiguous() if vocab is not None
                      else lm_head_weight.detach()).float()
    head_weight = teacher_weight  # heads share the LM head slice; gradients flow to the heads only
    optims = {}
    for layer, head in heads.items():
        head.to(device).train().requires_grad_(True)
        optims[layer] = torch.optim.AdamW(head.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)

    def lr_at(step: int) -> float:
        if step < settings.warmup:
            return settings.lr * (step + 1) / settings.warmup
        t = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
        return settings.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    history, running = [], {layer: 0.0 for layer in heads}
    perm, cursor = torch.randperm(n, generator=gen), 0
    bar = progress_bar(settings.steps, "training exit heads", show_progress)
    for step in range(settings.steps):
        if cursor + settings.batch_size > n:
            perm, cursor = torch.randperm(n, generator=gen), 0
        idx = perm[cursor:cursor + settings.batch_size]
        cursor += settings.batch_size
        with torch.no_grad():
            teacher = F.log_softmax(data.final[idx].to(device).float() @ teacher_weight.T, dim=-1)
        for layer, head in heads.items():
            for group in optims[layer].param_groups:
                group["lr"] = lr_at(step)
            student = F.log_softmax(head.features(data.hidden[layer][idx].to(device)) @ head_weight.T, dim=-1)
            loss = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
            optims[layer].zero_grad(set_to_none=True)
            loss.backward()
            optims[layer].step()
            value = float(loss.detach())
            running[layer] = 0.98 * running[layer] + 0.02 * value if step else value
        bar.update(1)
        if step % 50 == 0 or step == settings.steps - 1:
            bar.set_postfix({f"L{k}": f"{v:.2f}" for k, v in running.items()}, refresh=False)
            history.append({"step": step, **{str(k): round(v, 4) for k, v in running.items()}})
    bar.close()
    for head in heads.values():
        head.eval().requires_grad_(False)
    return history


def _train_sequences(heads: dict[int, ExitHead], data: TeacherData, lm_head_weight: torch.Tensor,
                     settings: TrainSettings, show_progress: bool, loss_mask: torch.Tensor | None) -> list[dict]:
    """Attention heads: each step takes whole sequences (about `batch_size` positions in all),
    runs the heads' attention causally over them, and minimises KL(teacher || exit) at every
    position where `loss_mask` (default: all) is True."""
    rng = random.Random(settings.seed)
    device = lm_head_weight.device
    vocab = next(iter(heads.values())).vocab_ids
    weight = (lm_head_weight.detach()[vocab].contiguous() if vocab is not None else lm_head_weight.detach()).float()
    spans = segments(data)
    optims = {}
    for layer, head in heads.items():
        head.to(device).train().requires_grad_(True)
        attention = list(head.attention.parameters())
        others = [p for p in head.parameters() if all(p is not q for q in attention)]
        optims[layer] = torch.optim.AdamW([{"params": others, "lr": settings.lr, "base": settings.lr},
                                           {"params": attention, "lr": settings.attention_lr,
                                            "base": settings.attention_lr}], weight_decay=settings.weight_decay)

    def scale(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / settings.warmup
        t = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    history, running, order = [], {layer: 0.0 for layer in heads}, []
    bar = progress_bar(settings.steps, "training exit heads", show_progress)
    for step in range(settings.steps):
        batch, size = [], 0
        while size < settings.batch_size:
            if not order:
                order = list(range(len(spans)))
                rng.shuffle(order)
            a, b = spans[order.pop()]
            batch.append((a, b))
            size += b - a
        final, mask = padded(data, batch, None)
        if loss_mask is not None:
            for row, (a, b) in enumerate(batch):
                mask[row, : b - a] &= loss_mask[a:b]
        with torch.no_grad():
            teacher = F.log_softmax(final[mask].to(device) @ weight.T, dim=-1)
        for layer, head in heads.items():
            for group in optims[layer].param_groups:
                group["lr"] = group["base"] * scale(step)
            hidden, _ = padded(data, batch, layer)
            states = head.attend(hidden.to(device))[mask.to(device)]
            student = F.log_softmax(head.features(states) @ weight.T, dim=-1)
            loss = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
            optims[layer].zero_grad(set_to_none=True)
            loss.backward()
            optims[layer].step()
            value = float(loss.detach())
            running[layer] = 0.98 * running[layer] + 0.02 * value if step else value
        bar.update(1)
        if step % 50 == 0 or step == settings.steps - 1:
            bar.set_postfix({f"L{k}": f"{v:.2f}" for k, v in running.items()}, refresh=False)
            history.append({"step": step, **{str(k): round(v, 4) for k, v in running.items()}})
    bar.close()
    for head in heads.values():
        head.eval().requires_grad_(False)
    return history


def round_to(heads: dict[int, ExitHead], dtype: torch.dtype) -> None:
    """Round the heads' weights through the dtype they will be saved in (what users will load)."""
    with torch.no_grad():
        for head in heads.values():
            for p in head.parameters():
                p.copy_(p.to(dtype).float())
