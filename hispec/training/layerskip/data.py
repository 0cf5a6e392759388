"""Training data for early-exit tuning: prompts, the original model's greedy continuations, held-out text.

Everything is prepared offline into one small tensor file (``torch.save`` of plain containers):

    {"meta": {...},
     "train":   {"prompt": [ids...], "continuation": [ids...]},
     "heldout": {"prompt": [ids...], "continuation": [ids...]},
     "heldout_text": [ids...]}          # held-out prompts as raw text (no chat template)

Continuations may be empty (prompts tokenized here, generated elsewhere, e.g. on the GPU machine:
``generate_continuations`` fills them in).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch

from hispec.errors import ConfigError

Progress = Callable[[str], None]


def tokenize_prompts(prompts, encode_chat, encode_raw, heldout: int, max_prompt_tokens: int,
                     seed: int = 0) -> dict:
    """Split prompts into train / held-out and tokenize them (chat template for the model input).

    Prompts longer than `max_prompt_tokens` are dropped, not cut, so every chat prompt keeps its end.
    """
    if heldout < 1:
        raise ConfigError("at least one held-out prompt is needed for the evaluation (--heldout >= 1)")
    chat, raw = [], []
    for p in prompts:
        ids = encode_chat(p.text) if p.chat else encode_raw(p.text)
        if 0 < len(ids) <= max_prompt_tokens:
            chat.append(ids)
            raw.append(encode_raw(p.text)[:max_prompt_tokens])
    order = list(range(len(chat)))
    random.Random(seed).shuffle(order)
    if len(order) <= heldout:
        raise ConfigError(f"only {len(order)} prompts fit in {max_prompt_tokens} tokens, not enough for "
                          f"{heldout} held-out prompts plus training: use more prompts or a larger limit")
    held, train = order[:heldout], order[heldout:]
    as_t = lambda ids: torch.tensor(ids, dtype=torch.long)
    return {
        "meta": {"prompts": len(order), "heldout": heldout, "max_prompt_tokens": max_prompt_tokens, "seed": seed},
        "train": {"prompt": [as_t(chat[i]) for i in train], "continuation": [as_t([]) for _ in train]},
        "heldout": {"prompt": [as_t(chat[i]) for i in held], "continuation": [as_t([]) for _ in held]},
        "heldout_text": [as_t(raw[i]) for i in held],
    }


@torch.no_grad()
def greedy_continuations(model, prompts: list[torch.Tensor], max_new_tokens: int, eos_ids: set[int],
                         pad_id: int, batch_size: int = 16, progress: Progress | None = None) -> list[torch.Tensor]:
    """The model's greedy continuation of each prompt (batched, left-padded; cut after the first EOS)."""
    device = next(model.parameters()).device
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out: list[torch.Tensor | None] = [None] * len(prompts)
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            n = len(prompts[i])
            ids[row, width - n:] = prompts[i]
            mask[row, width - n:] = 1
        gen = model.generate(ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=sorted(eos_ids) or None, pad_token_id=pad_id)
        new = gen[:, width:].cpu()
        for row, i in enumerate(idx):
            seq = new[row].tolist()
            for k, t in enumerate(seq):
                if t in eos_ids:
                    seq = seq[:k + 1]
                    break
            out[i] = torch.tensor(seq, dtype=torch.long)
        if progress:
            progress(f"generated {min(start + batch_size, len(order))}/{len(order)} continuations")
    return out  # type: ignore[return-value]


def generate_continuations(data: dict, model, max_new_tokens: int, eos_ids: set[int], pad_id: int,
                           batch_size: int = 16, progress: Progress | None = None) -> dict:
    """Fill data's train and held-out continuations with the (untouched) model's greedy output."""
    for split in ("train", "heldout"):
        data[split]["continuation"] = greedy_continuations(model, data[split]["prompt"], max_new_tokens, eos_ids,
                                                           pad_id, batch_size, progress)
    data["meta"]["max_new_tokens"] = max_new_tokens
    data["meta"]["continuation_tokens"] = sum(len(c) for c in data["train"]["continuation"])
    return data


def save_data(data: dict, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(data, tmp)
    tmp.replace(path)
    return path


def load_data(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"training data file {path} does not exist; prepare it first (train-ee --prompts ...)")
    data = torch.load(path, weights_only=True)
    if not isinstance(data, dict) or not {"train", "heldout", "heldout_text"} <= set(data):
        raise ConfigError(f"{path} is not an early-exit training data file")
    return data


def pack(data: dict, seq_len: int) -> torch.Tensor:
    """Train sequences (prompt + continuation) concatenated and cut into [n, seq_len] chunks."""
    if seq_len < 2:
        raise ConfigError("--seq-len must be at least 2")
    parts = [torch.cat([p, c]) for p, c in zip(data["train"]["prompt"], data["train"]["continuation"])]
    stream = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    n = len(stream) // seq_len
    if n < 1:
        raise ConfigError(f"the training data holds {len(stream)} tokens, fewer than one chunk of --seq-len "
                          f"{seq_len}: prepare more prompts or lower --seq-len")
    return stream[: n * seq_len].view(n, seq_len).clone()
