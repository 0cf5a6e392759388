"""Evaluating exit heads on held-out prompts: top-1 agreement of each exit with the full model
before (raw exit) and after training, the subset's coverage, agreement between pairs of exits, and
the settings it suggests."""

from __future__ import annotations

import torch

from hispec.engine.config import recommendation, recorded_lengths
from hispec.model.heads import ExitHead
from hispec.training.heads.data import TeacherData, segments


@torch.inference_mode()
def evaluate(ee, heads: dict[int, ExitHead], data: TeacherData, chunk: int = 512) -> tuple[dict, list]:
    """Top-1 agreement with the full model's greedy token, per exit, raw and trained, plus the
    agreement between every pair of trained exits and the vocabulary subset's coverage.
    Also returns the per-sequence predictions (estimate.Sequence) of the trained exits."""
    from hispec.training.heads.estimate import Sequence

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
    data = data.masked(scored, data.num_prompts)
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


def suggest(evaluation: dict, seqs: list, num_layers: int, layers: list[int], costs) -> dict | None:
    """The estimated best hispec/layerskip settings among `layers` with these pass costs (a
    CostModel; see estimate)."""
    from hispec.training.heads.estimate import best_settings

    layers = sorted(layers)
    if not layers:
        return None
    agreement = {k: v["trained"] for k, v in evaluation["pairs"].items()}
    return best_settings(seqs, num_layers, layers, agreement, costs)


def default_layers_from(estimate: dict | None) -> dict | None:
    h = (estimate or {}).get("hispec")
    if not h:
        return None
    ls = (estimate or {}).get("layerskip") or {}
    return recommendation(h["draft"], h["verify"], tuple(h["lengths"]), ls.get("exit"), ls.get("drafts"))


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
        k, t = recorded_lengths(h)
        lines.append(f"estimated best hispec: draft {h['draft']}, verify {h['verify']}, {k} drafts per round, "
                     f"the full model at {t} tentative: {h['speedup']:.2f}x autoregressive")
    if est.get("layerskip"):
        ls = est["layerskip"]
        lines.append(f"estimated best layerskip: exit {ls['exit']}, {ls.get('drafts') or recorded_lengths(ls)[0]} "
                     f"drafts per round: "
                     f"{ls['speedup']:.2f}x autoregressive")
    if est:
        lines.append("(estimates replay held-out predictions with pass costs measured on this machine; "
                     "measure with 'python -m hispec bench --sweep layers')")
    return "\n".join(lines)
