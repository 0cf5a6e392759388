"""Teacher data for exit heads: what the full model says, at every exit, on its own continuations.

The full model writes greedy continuations of a set of prompts (batched, so cheap); one more pass
over prompt + continuation keeps, for every generated position, the raw hidden state at each
candidate exit layer and the final layer's (normed) hidden state, from which the teacher's
next-token distribution is recomputed with the LM head when needed. No full-vocabulary logits are
stored. Also: the vocabulary subset (the K tokens the model emits most often) and the held-out split.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch

from hispec.errors import ConfigError

Progress = Callable[[str], None]


@dataclass
class TeacherData:
    """Per generated position: exit-layer hidden states, the final hidden state, the next token."""

    layers: list[int]
    hidden: dict[int, torch.Tensor]  # layer -> (N, H), float16
    final: torch.Tensor  # (N, H) final-layer hidden state after the final norm, float16
    tokens: torch.Tensor  # (N,) the next token the full model wrote (-1 at prompt positions)
    seq: torch.Tensor  # (N,) which prompt each position belongs to
    num_prompts: int
    meta: dict = field(default_factory=dict)
    generated: torch.Tensor | None = None  # (N,) True where the full model wrote the next token

    def __post_init__(self):
        if self.generated is None:
            self.generated = self.tokens >= 0

    def __len__(self) -> int:
        return len(self.tokens)

    def masked(self, keep: torch.Tensor, num_prompts: int) -> TeacherData:
        """The positions where `keep` is True, counted as `num_prompts` prompts."""
        return TeacherData(self.layers, {k: v[keep] for k, v in self.hidden.items()}, self.final[keep],
                           self.tokens[keep], self.seq[keep], num_prompts, self.meta, self.generated[keep])

    def select(self, prompts: set[int], generated_only: bool = False) -> TeacherData:
        """The positions of these prompts (only those the full model wrote, if asked)."""
        keep = torch.isin(self.seq, torch.tensor(sorted(prompts), dtype=self.seq.dtype))
        return self.masked(keep & self.generated if generated_only else keep, len(prompts))

    def save(self, path) -> None:
        torch.save({"layers": self.layers, "hidden": self.hidden, "final": self.final, "tokens": self.tokens,
                    "seq": self.seq, "num_prompts": self.num_prompts, "meta": self.meta,
                    "generated": self.generated}, str(path))

    @classmethod
    def concat(cls, *parts: TeacherData) -> TeacherData:
        """Every part's positions, in order (each part's prompts numbered after the previous
        ones'). One copy of the result, however many parts: the data can be gigabytes."""
        first = parts[0]
        for part in parts[1:]:
            if part.layers != first.layers:
                raise ConfigError(f"teacher data for layers {first.layers} and {part.layers} cannot be combined")
        seqs, offset = [], 0
        for part in parts:
            seqs.append(part.seq + offset)
            # Past every number in use: a selection keeps its prompts' original numbers.
            offset += max(part.num_prompts, int(part.seq.max()) + 1 if len(part.seq) else 0)
        return cls(first.layers, {k: torch.cat([p.hidden[k] for p in parts]) for k in first.layers},
                   torch.cat([p.final for p in parts]), torch.cat([p.tokens for p in parts]), torch.cat(seqs),
                   sum(p.num_prompts for p in parts), first.meta, torch.cat([p.generated for p in parts]))

    @classmethod
    def load(cls, path) -> TeacherData:
        d = torch.load(str(path), weights_only=True)
        return cls(d["layers"], d["hidden"], d["final"], d["tokens"], d["seq"], d["num_prompts"], d["meta"],
                   d.get("generated"))


def progress_bar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, dynamic_ncols=True, leave=True)


@torch.inference_mode()
def collect(model, prompts: list[list[int]], layers: Iterable[int], max_new_tokens: int = 128,
            eos_ids: Iterable[int] = (), batch_size: int = 16, show_progress: bool = False,
            prompt_positions: bool = False, ee=None) -> TeacherData:
    """Greedy continuations of `prompts` (token ids) by the full model, and the hidden states
    at `layers` and at the final layer for every generated position (and, with
    `prompt_positions`, for every prompt position: free extra training data, where the teacher
    is the full model's prediction on the prompt text, and the context attention heads see).
    With `ee` (an EarlyExitModel whose lean path can run this model), the continuations come from
    batched decoding on the lean path (hispec/training/heads/teacher.py, about 3x faster on CPU than
    transformers' batched generate); otherwise from `model.generate`."""
    from hispec.model.lean import LeanPath
    from hispec.training.heads.teacher import greedy

    lean = (ee.lean or LeanPath(ee)) if ee is not None and ee.stock_reason is None else None
    layers = sorted({int(x) for x in layers})
    eos = sorted({int(x) for x in eos_ids})
    device = next(model.parameters()).device
    pad = eos[0] if eos else 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together
    hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    finals, tokens, seqs = [], [], []
    bar = progress_bar(len(prompts), "teacher generations", show_progress)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        width = max(len(prompts[i]) for i in batch)
        if lean is not None:
            generated = greedy(ee, [prompts[i] for i in batch], max_new_tokens, eos, pad, lean=lean)
        else:
            ids = torch.tensor([[pad] * (width - len(prompts[i])) + list(prompts[i]) for i in batch], device=device)
            mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i]) for i in batch],
                                device=device)
            out = model.generate(ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                                 eos_token_id=eos or None, pad_token_id=pad)
            generated = []
            for row in out[:, width:].tolist():
                cut = next((k + 1 for k, t in enumerate(row) if t in eos), len(row))
                generated.append(row[:cut])
        # One pass over prompt + continuation, right-padded: causal attention keeps pads out.
        seqs_ids = [list(prompts[i]) + g for i, g in zip(batch, generated)]
        total = max(len(s) for s in seqs_ids)
        ids = torch.tensor([s + [pad] * (total - len(s)) for s in seqs_ids], device=device)
        mask = torch.tensor([[1] * len(s) + [0] * (total - len(s)) for s in seqs_ids], device=device)
        states = model.model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        hs = states.hidden_states  # L + 1 tensors; the last one after the final norm
        for row, (i, g) in enumerate(zip(batch, generated)):
            if not g:
                continue
            p = len(prompts[i])
            first = 0 if prompt_positions else p - 1  # attention heads need whole sequences
            pos = slice(first, p - 1 + len(g))  # position p-1+k predicts generated token k
            for layer in layers:
                hidden[layer].append(hs[layer][row, pos].to("cpu", torch.float16))
            finals.append(hs[-1][row, pos].to("cpu", torch.float16))
            tokens.append(torch.tensor([-1] * (p - 1 - first) + g))
            seqs.append(torch.full((p - 1 - first + len(g),), i))
        bar.update(len(batch))
    bar.close()
    if not tokens:
        raise ConfigError("the model generated no tokens for these prompts; give more prompts or a larger budget")
    return TeacherData(layers, {k: torch.cat(v) for k, v in hidden.items()}, torch.cat(finals), torch.cat(tokens),
                       torch.cat(seqs), len(prompts), {"max_new_tokens": max_new_tokens,
                                                        "prompt_positions": prompt_positions})


@torch.inference_mode()
def collect_forced(ee, sequences: list[list[int]], layers: Iterable[int], show_progress: bool = False) -> TeacherData:
    """Teacher-forced data: one pass of the engine's own layer path over each given token sequence
    (text the model did not write, e.g. ShareGPT replies), no generation, so it is cheap. Every
    position is kept, with the full model's own next-token prediction there as the teacher; none
    is scored (generated=False)."""
    layers = sorted({int(x) for x in layers})
    bounds = [0, *layers, ee.num_layers]
    hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    finals, seqs = [], []
    bar = progress_bar(len(sequences), "teacher-forced text", show_progress)
    for i, ids in enumerate(sequences):
        bar.update(1)
        if not ids:
            continue
        cache = ee.new_cache(len(ids))
        h = ee.embed(ids)
        for a, b in zip(bounds[:-1], bounds[1:]):
            h = ee.run_layers(h, a, b, cache)
            if b in hidden:
                hidden[b].append(h[0].to("cpu", torch.float16))
        finals.append(ee.final_head.norm(h)[0].to("cpu", torch.float16))
        seqs.append(torch.full((len(ids),), i))
    bar.close()
    if not finals:
        raise ConfigError("no teacher-forced text to collect")
    n = sum(len(f) for f in finals)
    return TeacherData(layers, {k: torch.cat(v) for k, v in hidden.items()}, torch.cat(finals),
                       torch.full((n,), -1), torch.cat(seqs), len(sequences), {"forced": True},
                       torch.zeros(n, dtype=torch.bool))


@torch.inference_mode()
def add_layers(ee, data: TeacherData, inputs: dict[int, list[int]], layers: Iterable[int],
               show_progress: bool = False) -> TeacherData:
    """The same positions with hidden states at more exit layers, without generating again: one
    teacher-forced pass of the engine's layer path over each sequence. `inputs[seq]` holds the
    token ids the sequence's positions were computed from (its last positions are the ones kept).
    The final states and teacher tokens are those already in `data`."""
    new = sorted({int(x) for x in layers} - set(data.layers))
    if not new:
        return data
    ee.check_layers(*new)
    bounds = [0, *new]
    parts: dict[int, list[torch.Tensor]] = {layer: [] for layer in new}
    spans = segments(data)
    bar = progress_bar(len(spans), f"adding layers {','.join(map(str, new))}", show_progress)
    for a, b in spans:
        ids = inputs[int(data.seq[a])]
        if len(ids) < b - a:
            raise ConfigError(f"teacher data sequence {int(data.seq[a])} has {b - a} positions but only {len(ids)} "
                              "input tokens were given")
        cache = ee.new_cache(len(ids))
        h = ee.embed(ids)
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            h = ee.run_layers(h, lo, hi, cache)
            parts[hi].append(h[0, len(ids) - (b - a):].to("cpu", torch.float16))
        bar.update(1)
    bar.close()
    hidden = {**data.hidden, **{layer: torch.cat(parts[layer]) for layer in new}}
    return TeacherData(sorted(hidden), hidden, data.final, data.tokens, data.seq, data.num_prompts, data.meta,
                       data.generated)


def generation_inputs(data: TeacherData, prompts: list[list[int]]) -> dict[int, list[int]]:
    """Per sequence of `collect` data: its prompt and the continuation the full model wrote (the
    last generated token is predicted, never read)."""
    out = {}
    for a, b in segments(data):
        written = data.tokens[a:b][data.generated[a:b]].tolist()
        out[int(data.seq[a])] = list(prompts[int(data.seq[a])]) + written[:-1]
    return out


def frequent_tokens(tokens: torch.Tensor, k: int, vocab_size: int, always: Iterable[int] = ()) -> torch.Tensor:
    """The k most frequent token ids (ties: lower id first), `always` included, sorted ascending.
    When fewer than k distinct tokens were seen, the lowest unseen ids fill the rest."""
    if not 0 < k <= vocab_size:
        raise ConfigError(f"vocabulary subset size {k} must be between 1 and the vocabulary size {vocab_size}")
    counts = Counter(tokens.tolist())
    chosen = [t for t in always if 0 <= t < vocab_size][:k]
    for token, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(chosen) >= k:
            break
        if token not in chosen:
            chosen.append(token)
    seen = set(chosen)
    filler = (t for t in range(vocab_size) if t not in seen)
    while len(chosen) < k:
        chosen.append(next(filler))
    return torch.tensor(sorted(chosen), dtype=torch.long)


def segments(data: TeacherData) -> list[tuple[int, int]]:
    """(start, end) of each prompt's run of positions (collect writes them in order)."""
    _, counts = torch.unique_consecutive(data.seq, return_counts=True)
    ends = torch.cumsum(counts, 0).tolist()
    return list(zip([0] + ends[:-1], ends))


def padded(data: TeacherData, spans: list[tuple[int, int]], layer: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T, H) float32 states of these spans (layer None: the final ones), and the mask."""
    T = max(b - a for a, b in spans)
    source = data.final if layer is None else data.hidden[layer]
    out = torch.zeros(len(spans), T, source.shape[-1])
    mask = torch.zeros(len(spans), T, dtype=torch.bool)
    for row, (a, b) in enumerate(spans):
        out[row, : b - a] = source[a:b].float()
        mask[row, : b - a] = True
    return out, mask


def split_prompts(n: int, holdout: float, seed: int) -> tuple[set[int], set[int]]:
    """Indices of (training, held-out) prompts: a seeded split, at least one of each."""
    if n < 2:
        raise ConfigError("train-exits needs at least 2 prompts (some are held out for evaluation)")
    if not 0 < holdout < 1:
        raise ConfigError(f"--holdout must be a fraction between 0 and 1 (got {holdout})")
    idx = list(range(n))
    random.Random(seed).shuffle(idx)
    k = min(n - 1, max(1, round(n * holdout)))
    return set(idx[k:]), set(idx[:k])
