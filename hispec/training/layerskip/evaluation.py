"""Evaluation of an early-exit tuned model against the original, on held-out data.

For a model carrying LoRA adapters, "tuned" runs with the adapters and "original" with them
switched off, on the same held-out sequences (held-out prompt + the original's greedy
continuation). Reported:

- exit agreement: at each exit e, the share of continuation positions where the argmax of the
  exit head (final norm + LM head on layer e's hidden state) equals the argmax of the same
  model's final layer; for the tuned and for the original model;
- fidelity: the share of continuation positions where the tuned model's greedy token equals the
  original's (teacher-forced on the original's continuation), and perplexities of both models on
  held-out text (the held-out prompts as raw text) and on the held-out continuations;
- optionally, free-running greedy generations of both models on a few held-out prompts: how many
  leading tokens are identical.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from hispec.model import lora
from hispec.training.layerskip.forward import ensure_sdpa, head_logits, run_with_exits

Progress = Callable[[str], None]


@torch.no_grad()
def _pass(model, ids: torch.Tensor, positions: slice, exits: list[int]):
    saved, hidden = run_with_exits(model, ids[None], set(exits))
    final = head_logits(model, hidden[:, positions]).float()[0]
    tops = {e: head_logits(model, saved[e][:, positions]).float()[0].argmax(-1) for e in exits}
    return final, tops


@torch.no_grad()
def _nll(model, ids: torch.Tensor) -> tuple[float, int]:
    if len(ids) < 2:
        return 0.0, 0
    _, hidden = run_with_exits(model, ids[None], set())
    logits = head_logits(model, hidden[:, :-1]).float()[0]
    return float(F.cross_entropy(logits, ids[1:], reduction="sum")), len(ids) - 1


@torch.no_grad()
def evaluate(model, data: dict, exits: list[int] | None = None, max_seqs: int | None = None,
             free_run: int = 0, free_run_tokens: int = 64, eos_ids: set[int] | None = None,
             progress: Progress | None = None) -> dict:
    """Figures of the tuned model (adapters on) and the original (adapters off); see the module doc."""
    ensure_sdpa(model)
    model.eval()
    device = next(model.parameters()).device
    num_layers = model.config.num_hidden_layers
    exits = sorted(set(exits)) if exits else list(range(1, num_layers))
    prompts = data["heldout"]["prompt"][:max_seqs]
    conts = data["heldout"]["continuation"][:max_seqs]
    has_adapters = bool(lora.find_adapters(model))
    agree = {"tuned": {e: 0 for e in exits}, "original": {e: 0 for e in exits}}
    same_greedy = same_token = positions_total = 0
    nll = {"tuned": [0.0, 0], "original": [0.0, 0]}
    for n, (p, c) in enumerate(zip(prompts, conts)):
        if len(c) == 0:
            continue
        ids = torch.cat([p, c]).to(device)
        span = slice(len(p) - 1, len(ids) - 1)  # positions that predict the continuation
        final_t, tops_t = _pass(model, ids, span, exits)
        with lora.adapters_disabled(model):
            final_o, tops_o = _pass(model, ids, span, exits)
        top_t, top_o = final_t.argmax(-1), final_o.argmax(-1)
        for e in exits:
            agree["tuned"][e] += int((tops_t[e] == top_t).sum())
            agree["original"][e] += int((tops_o[e] == top_o).sum())
        same_greedy += int((top_t == top_o).sum())
        same_token += int((top_t == c.to(device)).sum())
        positions_total += len(c)
        for which, final in (("tuned", final_t), ("original", final_o)):
            nll[which][0] += float(F.cross_entropy(final, c.to(device), reduction="sum"))
            nll[which][1] += len(c)
        if progress:
            progress(f"evaluated {n + 1}/{len(prompts)} held-out sequences")
    if positions_total == 0:
        raise ValueError("the held-out data holds no continuations: generate them first")
    text_nll = {"tuned": [0.0, 0], "original": [0.0, 0]}
    for ids in data["heldout_text"][:max_seqs]:
        ids = ids.to(device)
        a, k = _nll(model, ids)
        text_nll["tuned"][0] += a
        text_nll["tuned"][1] += k
        with lora.adapters_disabled(model):
            a, k = _nll(model, ids)
        text_nll["original"][0] += a
        text_nll["original"][1] += k
    ppl = lambda s: math.exp(s[0] / s[1]) if s[1] else float("nan")
    report = {
        "positions": positions_total,
        "sequences": len(prompts),
        "has_adapters": has_adapters,
        "exit_agreement": {
            "tuned": {str(e): agree["tuned"][e] / positions_total for e in exits},
            "original": {str(e): agree["original"][e] / positions_total for e in exits},
        },
        "fidelity": {
            "greedy_token_match": same_greedy / positions_total,
            "continuation_token_match": same_token / positions_total,
            "ppl_heldout_text": {"tuned": ppl(text_nll["tuned"]), "original": ppl(text_nll["original"])},
            "ppl_heldout_continuations": {"tuned": ppl(nll["tuned"]), "original": ppl(nll["original"])},
        },
    }
    f = report["fidelity"]
    f["ppl_change_heldout_text"] = f["ppl_heldout_text"]["tuned"] / f["ppl_heldout_text"]["original"] - 1
    if free_run > 0:
        report["free_run"] = _free_run(model, prompts[:free_run], free_run_tokens, eos_ids or set())
    return report


@torch.no_grad()
def _free_run(model, prompts, max_new_tokens: int, eos_ids: set[int]) -> dict:
    """Greedy generations of both models; identical leading tokens per prompt."""
    from hispec.training.layerskip.data import greedy_continuations

    pad = min(eos_ids) if eos_ids else 0
    batch = len(prompts)  # one batch (left-padded), the same for both models
    tuned = greedy_continuations(model, prompts, max_new_tokens, eos_ids, pad, batch_size=batch)
    with lora.adapters_disabled(model):
        original = greedy_continuations(model, prompts, max_new_tokens, eos_ids, pad, batch_size=batch)
    prefix, identical = [], 0
    for t, o in zip(tuned, original):
        k = 0
        while k < min(len(t), len(o)) and t[k] == o[k]:
            k += 1
        prefix.append(k)
        identical += int(t.tolist() == o.tolist())
    return {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "identical_prefix_tokens": prefix,
            "identical_outputs": identical}


def summary_lines(report: dict, highlight: tuple[int, ...] = ()) -> list[str]:
    """A short human-readable table of a report."""
    a = report["exit_agreement"]
    lines = [f"exit agreement with the final layer ({report['positions']} held-out positions):",
             f"  {'exit':>5} {'original':>9} {'tuned':>7}"]
    for e in a["tuned"]:
        mark = "  <-" if int(e) in highlight else ""
        lines.append(f"  {e:>5} {a['original'][e]:>9.1%} {a['tuned'][e]:>7.1%}{mark}")
    f = report["fidelity"]
    lines.append(f"fidelity: greedy token = original's at {f['greedy_token_match']:.1%} of positions; "
                 f"perplexity on held-out text {f['ppl_heldout_text']['original']:.2f} -> "
                 f"{f['ppl_heldout_text']['tuned']:.2f} ({f['ppl_change_heldout_text']:+.1%}); on held-out "
                 f"continuations {f['ppl_heldout_continuations']['original']:.3f} -> "
                 f"{f['ppl_heldout_continuations']['tuned']:.3f}")
    if "free_run" in report:
        fr = report["free_run"]
        lines.append(f"free-running greedy: {fr['identical_outputs']}/{fr['prompts']} outputs identical; "
                     f"identical leading tokens {fr['identical_prefix_tokens']}")
    return lines
