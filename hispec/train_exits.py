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
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
import torch.nn.functional as F

from .errors import ConfigError
from .exit_heads import ExitHead, make_heads, model_identity

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

    def _mask(self, keep: torch.Tensor, num_prompts: int) -> TeacherData:
        return TeacherData(self.layers, {k: v[keep] for k, v in self.hidden.items()}, self.final[keep],
                           self.tokens[keep], self.seq[keep], num_prompts, self.meta, self.generated[keep])

    def select(self, prompts: set[int], generated_only: bool = False) -> TeacherData:
        """The positions of these prompts (only those the full model wrote, if asked)."""
        keep = torch.isin(self.seq, torch.tensor(sorted(prompts), dtype=self.seq.dtype))
        return self._mask(keep & self.generated if generated_only else keep, len(prompts))

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


def _bar(total: int, desc: str, enabled: bool):
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
    batched decoding on the lean path (hispec/batch_greedy.py, about 3x faster on CPU than
    transformers' batched generate); otherwise from `model.generate`."""
    from .batch_greedy import greedy
    from .lean import LeanPath

    lean = (ee.lean or LeanPath(ee)) if ee is not None and ee.stock_reason is None else None
    layers = sorted({int(x) for x in layers})
    eos = sorted({int(x) for x in eos_ids})
    device = next(model.parameters()).device
    pad = eos[0] if eos else 0
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together
    hidden: dict[int, list[torch.Tensor]] = {layer: [] for layer in layers}
    finals, tokens, seqs = [], [], []
    bar = _bar(len(prompts), "teacher generations", show_progress)
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
    bar = _bar(len(sequences), "teacher-forced text", show_progress)
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
    bar = _bar(len(spans), f"adding layers {','.join(map(str, new))}", show_progress)
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
    bar = _bar(settings.steps, "training exit heads", show_progress)
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


def segments(data: TeacherData) -> list[tuple[int, int]]:
    """(start, end) of each prompt's run of positions (collect writes them in order)."""
    _, counts = torch.unique_consecutive(data.seq, return_counts=True)
    ends = torch.cumsum(counts, 0).tolist()
    return list(zip([0] + ends[:-1], ends))


def _padded(data: TeacherData, spans: list[tuple[int, int]], layer: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (B, T, H) float32 states of these spans (layer None: the final ones), and the mask."""
    T = max(b - a for a, b in spans)
    source = data.final if layer is None else data.hidden[layer]
    out = torch.zeros(len(spans), T, source.shape[-1])
    mask = torch.zeros(len(spans), T, dtype=torch.bool)
    for row, (a, b) in enumerate(spans):
        out[row, : b - a] = source[a:b].float()
        mask[row, : b - a] = True
    return out, mask


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
    bar = _bar(settings.steps, "training exit heads", show_progress)
    for step in range(settings.steps):
        batch, size = [], 0
        while size < settings.batch_size:
            if not order:
                order = list(range(len(spans)))
                rng.shuffle(order)
            a, b = spans[order.pop()]
            batch.append((a, b))
            size += b - a
        final, mask = _padded(data, batch, None)
        if loss_mask is not None:
            for row, (a, b) in enumerate(batch):
                mask[row, : b - a] &= loss_mask[a:b]
        with torch.no_grad():
            teacher = F.log_softmax(final[mask].to(device) @ weight.T, dim=-1)
        for layer, head in heads.items():
            for group in optims[layer].param_groups:
                group["lr"] = group["base"] * scale(step)
            hidden, _ = _padded(data, batch, layer)
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


@torch.inference_mode()
def evaluate(ee, heads: dict[int, ExitHead], data: TeacherData, chunk: int = 512) -> tuple[dict, list]:
    """Top-1 agreement with the full model's greedy token, per exit, raw and trained, plus the
    agreement between every pair of trained exits and the vocabulary subset's coverage.
    Also returns the per-sequence predictions (exit_estimate.Sequence) of the trained exits."""
    from .exit_estimate import Sequence

    raw_pred: dict[int, list[torch.Tensor]] = {layer: [] for layer in heads}
    pred: dict[int, list[torch.Tensor]] = {layer: [] for layer in heads}
    targets = []
    final_head = ee.final_head
    lm_head = final_head.lm_head
    dtype, device = lm_head.weight.dtype, lm_head.weight.device
    # Chunks of positions; whole sequences where a head attends over the earlier positions.
    spans = (segments(data) if any(h.stateful for h in heads.values())
             else [(a, min(a + chunk, len(data))) for a in range(0, len(data), chunk)])
    for a, b in spans:
        sl = slice(a, b)
        targets.append(lm_head(data.final[sl].to(device, dtype)).argmax(-1).cpu())
        for layer, head in heads.items():
            h = data.hidden[layer][sl].to(device, dtype)
            raw_pred[layer].append(lm_head(final_head.norm(h)).argmax(-1).cpu())
            pred[layer].append(head(head.attend(h[None])[0]).argmax(-1).cpu())
    # Scored where the full model wrote the next token (prompt positions are context only).
    scored = data.generated
    target = torch.cat(targets)[scored]
    raw = {k: torch.cat(v)[scored] for k, v in raw_pred.items()}
    trained = {k: torch.cat(v)[scored] for k, v in pred.items()}
    data = data._mask(scored, data.num_prompts)
    vocab = next(iter(heads.values())).vocab_ids
    coverage = None
    if vocab is not None:
        coverage = round(float(torch.isin(target, vocab.cpu()).float().mean()), 4)
    per_layer = {str(layer): {"raw": _frac(raw[layer] == target), "trained": _frac(trained[layer] == target)}
                 for layer in sorted(heads)}
    layers = sorted(heads)
    pairs = {f"{d}-{v}": {"raw": _frac(raw[d] == raw[v]), "trained": _frac(trained[d] == trained[v])}
             for i, d in enumerate(layers) for v in layers[i + 1:]}
    seqs = []
    for s in torch.unique_consecutive(data.seq).tolist():
        rows = data.seq == s
        seqs.append(Sequence(target[rows].tolist(), {k: v[rows].tolist() for k, v in trained.items()}))
    summary = {"tokens": len(target), "prompts": len(set(data.seq.tolist())), "subset_coverage": coverage,
               "agreement": per_layer, "pairs": pairs}
    return summary, seqs


def _frac(mask: torch.Tensor) -> float:
    return round(float(mask.float().mean()), 4) if mask.numel() else 0.0


def suggest(evaluation: dict, seqs: list, num_layers: int, layers: list[int], subset_heads: bool,
            attention_heads: bool = False) -> dict | None:
    """The estimated best hispec/layerskip settings among `layers` (see exit_estimate)."""
    from .exit_estimate import best_settings

    layers = sorted(layers)
    if not layers:
        return None
    agreement = {k: v["trained"] for k, v in evaluation["pairs"].items()}
    return best_settings(seqs, num_layers, layers, agreement, subset_heads=subset_heads,
                         attention_heads=attention_heads)


def default_layers_from(estimate: dict | None) -> dict | None:
    h = (estimate or {}).get("hispec")
    if not h:
        return None
    out = {"draft": h["draft"], "verify": h["verify"], "draft_len": h["draft_len"],
           "verify_threshold": h["verify_threshold"]}
    ls = (estimate or {}).get("layerskip")
    if ls:
        out.update(layerskip_exit=ls["exit"], layerskip_draft_len=ls["draft_len"])
    return out


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
    from .exit_heads import HEAD_TYPES, SAVE_DTYPES

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
            extra = extra._mask(extra.generated, extra.num_prompts)
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


# ---- the command line: python -m hispec train-exits ------------------------------------------
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
    from .prompts import load_sets

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


def format_evaluation(manifest: dict) -> str:
    ev = manifest["evaluation"]
    lines = [f"held-out evaluation: {ev['tokens']} tokens from {ev['prompts']} prompts"
             + (f"; the vocabulary subset covers {ev['subset_coverage']:.1%} of the full model's tokens"
                if ev.get("subset_coverage") is not None else ""),
             f"{'exit':>6}{'raw':>9}{'trained':>10}   top-1 agreement with the full model"]
    for layer, a in ev["agreement"].items():
        lines.append(f"{layer:>6}{a['raw']:>9.1%}{a['trained']:>10.1%}")
    if ev["pairs"]:
        lines.append(f"{'pair':>6}{'raw':>9}{'trained':>10}   agreement between two exits")
        for key, a in ev["pairs"].items():
            lines.append(f"{key:>6}{a['raw']:>9.1%}{a['trained']:>10.1%}")
    est = ev.get("estimate") or {}
    if est.get("hispec"):
        h = est["hispec"]
        lines.append(f"estimated best hispec: draft {h['draft']}, verify {h['verify']}, draft_len {h['draft_len']}, "
                     f"verify_threshold {h['verify_threshold']}: {h['speedup']:.2f}x autoregressive")
    if est.get("layerskip"):
        ls = est["layerskip"]
        lines.append(f"estimated best layerskip: exit {ls['exit']}, draft_len {ls['draft_len']}: "
                     f"{ls['speedup']:.2f}x autoregressive")
    if est:
        lines.append("(estimates replay held-out predictions with step costs measured on a 2-core CPU; "
                     "measure with 'python -m hispec bench --sweep layers')")
    return "\n".join(lines)


def _forced_data(lm, args, layers: list[int], identity: dict, say: Progress) -> TeacherData:
    """Teacher-forced ShareGPT exchanges (--forced-text N), cached next to --data when given."""
    from pathlib import Path

    from .prompts import load_sharegpt_dialogues

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

    from .prompts import load_sharegpt_questions

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
    """python -m hispec train-exits (argparse namespace from hispec/cli.py)."""
    import sys
    from pathlib import Path

    from .exit_heads import candidate_folders, save_heads, user_exits_folder
    from .loading import load_model

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
