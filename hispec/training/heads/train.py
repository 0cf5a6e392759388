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
    """Train every head on the same batches (KL to the teacher over each head's vocabulary), one
    `kl_step` per head and step. Linear heads take batches of positions; attention heads take whole
    sequences (about `batch_size` positions in all), run their attention causally over them and learn
    at every position where `loss_mask` (default: all) is True. Returns a short loss history."""
    device = lm_head_weight.device
    vocab = next(iter(heads.values())).vocab_ids
    # The teacher's and the heads' shared LM head slice; gradients flow to the heads only.
    weight = (lm_head_weight.detach()[vocab].contiguous() if vocab is not None else lm_head_weight.detach()).float()
    optims = {layer: _optimizer(head.to(device).train().requires_grad_(True), settings)
              for layer, head in heads.items()}
    stateful = any(head.stateful for head in heads.values())
    batches = (_sequence_batches if stateful else _position_batches)(data, settings, device, loss_mask)
    history, running = [], {layer: 0.0 for layer in heads}
    bar = progress_bar(settings.steps, "training exit heads", show_progress)
    for step, (final, states_of) in zip(range(settings.steps), batches):
        with torch.no_grad():
            teacher = F.log_softmax(final.to(device).float() @ weight.T, dim=-1)
        scale = _schedule(step, settings)
        for layer, head in heads.items():
            value = kl_step(head, optims[layer], scale, states_of(layer, head), teacher, weight)
            running[layer] = 0.98 * running[layer] + 0.02 * value if step else value
        bar.update(1)
        if step % 50 == 0 or step == settings.steps - 1:
            bar.set_postfix({f"L{k}": f"{v:.2f}" for k, v in running.items()}, refresh=False)
            history.append({"step": step, **{str(k): round(v, 4) for k, v in running.items()}})
    bar.close()
    for head in heads.values():
        head.eval().requires_grad_(False)
    return history


def kl_step(head: ExitHead, optim: torch.optim.Optimizer, scale: float, states: torch.Tensor,
            teacher: torch.Tensor, weight: torch.Tensor) -> float:
    """One step of one head: minimise KL(teacher || exit) over the rows of `states` (the head's input
    at its exit, attended already for attention heads), each parameter group at its base rate times
    `scale`. `teacher`: the teacher's log-probabilities on the same rows. Returns the loss."""
    for group in optim.param_groups:
        group["lr"] = group["base"] * scale
    student = F.log_softmax(head.features(states) @ weight.T, dim=-1)
    loss = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
    optim.zero_grad(set_to_none=True)
    loss.backward()
    optim.step()
    return float(loss.detach())


def _optimizer(head: ExitHead, settings: TrainSettings) -> torch.optim.Optimizer:
    """AdamW; an attention head's attention block (started from the model's weights) has its own rate."""
    if not head.stateful:
        return torch.optim.AdamW([{"params": list(head.parameters()), "lr": settings.lr, "base": settings.lr}],
                                 weight_decay=settings.weight_decay)
    attention = list(head.attention.parameters())
    others = [p for p in head.parameters() if all(p is not q for q in attention)]
    return torch.optim.AdamW([{"params": others, "lr": settings.lr, "base": settings.lr},
                              {"params": attention, "lr": settings.attention_lr, "base": settings.attention_lr}],
                             weight_decay=settings.weight_decay)


def _schedule(step: int, settings: TrainSettings) -> float:
    """The learning rate's factor: a linear warm-up, then cosine decay to 0."""
    if step < settings.warmup:
        return (step + 1) / settings.warmup
    t = (step - settings.warmup) / max(1, settings.steps - settings.warmup)
    return 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def _position_batches(data: TeacherData, settings: TrainSettings, device, loss_mask: torch.Tensor | None):
    """Endless (final states, states of a layer) batches of `batch_size` positions, reshuffled (seeded)
    at every pass over the data; only positions where `loss_mask` is True when one is given."""
    gen = torch.Generator().manual_seed(settings.seed)
    rows = None if loss_mask is None else loss_mask.nonzero().flatten()
    n = len(data) if rows is None else len(rows)
    perm, cursor = torch.randperm(n, generator=gen), 0
    while True:
        if cursor + settings.batch_size > n:
            perm, cursor = torch.randperm(n, generator=gen), 0
        idx = perm[cursor:cursor + settings.batch_size]
        cursor += settings.batch_size
        if rows is not None:
            idx = rows[idx]
        yield data.final[idx], lambda layer, head, idx=idx: data.hidden[layer][idx].to(device)


def _sequence_batches(data: TeacherData, settings: TrainSettings, device, loss_mask: torch.Tensor | None):
    """Endless batches of whole sequences, about `batch_size` positions in all (seeded order): the
    final states where the loss applies, and per layer the attended states at the same positions."""
    rng = random.Random(settings.seed)
    spans, order = segments(data), []
    while True:
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

        def states_of(layer, head, batch=batch, mask=mask):
            hidden, _ = padded(data, batch, layer)
            return head.attend(hidden.to(device))[mask.to(device)]

        yield final[mask], states_of


def round_to(heads: dict[int, ExitHead], dtype: torch.dtype) -> None:
    """Round the heads' weights through the dtype they will be saved in (what users will load)."""
    with torch.no_grad():
        for head in heads.values():
            for p in head.parameters():
                p.copy_(p.to(dtype).float())
