"""Token selection: greedy, or sampling that stays lossless through every verification stage.

Speculative sampling (Leviathan et al., Chen et al.) at each stage: a pending token x, drawn
from a proposal distribution r, is accepted with probability min(1, p(x) / r(x)), where p is the
judging stage's distribution; on rejection the stage samples from the normalised residual
max(0, p - r). Tokens leaving a stage are then distributed exactly as p. In HiSpec the verifier
judges drafts (r = q_draft, p = p_verify) and the target judges tentative tokens
(r = p_verify, p = p_target), so the output is distributed exactly as sampling from the target.
Both sides of every comparison use the same warped (temperature, top-k, top-p) distributions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p, row by row (float32, on the CPU)."""
    logits = logits.float().cpu() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if params.top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= params.top_p  # keeps the token crossing top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
    return logits.softmax(-1)


@dataclass(frozen=True)
class PointMass:
    """The proposal of a deterministic proposer (the lookup level): all mass on one token.
    Accepting x with probability min(1, p(x) / 1) and resampling from normalised max(0, p - 1[x])
    (p without x) leaves the output distributed exactly as p."""

    token_id: int

    def over(self, like: torch.Tensor) -> torch.Tensor:
        """As a distribution over the vocabulary of `like` (one row of probabilities)."""
        q = torch.zeros_like(like)
        q[self.token_id] = 1.0
        return q


# What a pending token was drawn from: a distribution (a row of probabilities), a point mass
# (lookup), or None (greedy: no distribution is kept).
Proposal = torch.Tensor | PointMass | None


@dataclass(frozen=True)
class Verdict:
    """A level's judgement of the pending tokens from some position on."""

    accepted: int  # how many of them it accepts, in order (up to its first rejection)
    token: int | None  # its own next token: the correction at the rejection, or the bonus; None: no row for one
    dist: torch.Tensor | None  # the distribution `token` was drawn from (sampling; None when greedy)
    dists: tuple  # the level's distribution per row (sampling; None per row when greedy)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The distribution to resample from after a rejection: normalised max(0, p - q)."""
    r = (p - q).clamp(min=0)
    total = r.sum()
    return r / total if total > 0 else p


class Selector:
    """Chooses tokens for one generation: argmax when greedy, else seeded sampling."""

    def __init__(self, params: SamplingParams, seed: int | None = None):
        self.params = params
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def _draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def propose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """A token from one row of logits, with the distribution it was drawn from."""
        if self.params.greedy:
            return int(logits.argmax(-1)), None
        probs = warp(logits, self.params)
        return self._draw(probs), probs

    def judge(self, tokens: list[int], proposals: list[Proposal], logits: torch.Tensor,
              preds: list[int] | None = None) -> Verdict:
        """Judge pending tokens, each drawn from its proposal (a distribution, a PointMass, or None
        when greedy), against a stage's logits (one row per token, plus one more row when a bonus
        token is possible). Greedy: `preds`, the rows' argmax already on the host, saves the transfer."""
        if self.params.greedy:
            preds = logits.argmax(-1).tolist() if preds is None else preds
            n_ok = 0
            while n_ok < len(tokens) and tokens[n_ok] == preds[n_ok]:
                n_ok += 1
            return Verdict(n_ok, preds[n_ok] if n_ok < len(preds) else None, None, (None,) * len(preds))
        probs = warp(logits, self.params)
        rows = tuple(probs)
        for i, (x, q) in enumerate(zip(tokens, proposals)):
            if isinstance(q, PointMass):
                q = q.over(probs[i])
            u = float(torch.rand((), generator=self.generator))
            if u * float(q[x]) >= float(probs[i, x]):  # reject with probability 1 - min(1, p/q)
                return Verdict(i, self._draw(residual(probs[i], q)), probs[i], rows)
        if len(probs) > len(tokens):
            return Verdict(len(tokens), self._draw(probs[len(tokens)]), probs[len(tokens)], rows)
        return Verdict(len(tokens), None, None, rows)
