"""One sequence's hidden states and KV caches, split into stages at exit boundaries.

Boundaries are layer depths, e.g. ``(0, d, v, L)`` for HiSpec: stage 1 runs layers [0, d),
stage 2 [d, v), stage 3 [v, L). ``frontier[i]`` counts the positions whose hidden state at
``boundaries[i]`` exists; every layer of stage i holds exactly that many positions in its
KV cache. Frontiers never increase with depth (draft layers know the most tokens).

``run_to(i, end)`` brings boundary i up to position `end`, running each stage only on the
positions it has not seen, from the hidden states saved at the boundary below: no layer is
ever run twice for the same token. ``truncate(n)`` drops positions >= n everywhere.

An exit with a stateful (attention) head keeps its own KV cache, in ``head_cache`` at the
boundary's index. Its attention step runs lazily: positions that pass the boundary wait in
``_head_pending`` until that exit is asked for (``run_to`` with it as the target level), then
all waiting positions run the step in one batch, each exactly once, and ``run_to`` returns the
attended states (what the head reads). An exit that a generation never consults costs nothing
beyond its layers. ``head_work`` records each batch (exit layer, positions, seconds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hispec.model.early_exit import EarlyExitModel


@dataclass
class StagePass:
    """What one stage ran: layers [start, end) over the tokens with these serials."""

    stage: str
    start: int
    end: int
    positions: tuple[int, int]
    serials: tuple[int, ...]
    seconds: float
    precision: str | None = None  # the number format the layers ran in (None: the model's exact format)
    beside: tuple[int, int] = (0, 0)  # other visitors' passes and rows in the shared call that carried it


class StageStack:
    """`shared`: another stack of the same sequence (engine.lanes: the same weights in another number
    format); this one then reads that one's tokens and serials and reports into its passes and head
    work, and keeps its own caches, frontiers and hidden states."""

    def __init__(self, ee: EarlyExitModel, boundaries: tuple[int, ...], names: tuple[str, ...], capacity: int,
                 shared: StageStack | None = None, precision: str | None = None):
        if boundaries[0] != 0 or boundaries[-1] != ee.num_layers or len(names) != len(boundaries) - 1:
            raise ValueError(f"bad stage boundaries {boundaries}")
        self.ee, self.precision = ee, precision
        self.boundaries = boundaries
        self.names = names
        self.cache = ee.new_cache(capacity)
        # Attention exit heads by boundary index, and their KV caches (slot = boundary index).
        self._stateful = {i: head for i, b in enumerate(boundaries[1:-1], 1)
                          if getattr(head := ee.exit_heads.get(b), "stateful", False)}
        self.head_cache = ee.new_head_cache(len(boundaries), capacity)
        self._head_pending: dict[int, list[torch.Tensor]] = {i: [] for i in self._stateful}
        self.head_work: list[tuple[int, int, float]] = []  # drained by the decoder
        self.tokens: list[int] = []
        self.serials: list[int] = []  # a unique id per token ever placed, for work accounting
        self._next_serial = 0
        self.frontier = [0] * len(boundaries)
        # hidden[i]: saved hidden states at boundary i for positions [frontier[i+1], frontier[i])
        self._hidden: list[torch.Tensor | None] = [None] * len(boundaries)
        self.passes: list[StagePass] = []  # drained by the decoder into events
        if shared is not None:  # one sequence: tokens are placed and cut through `shared` only
            self.tokens, self.serials = shared.tokens, shared.serials
            self.passes, self.head_work = shared.passes, shared.head_work

    def append(self, token: int | torch.Tensor) -> int:
        """Place a token (an int, or a one-element device tensor until `resolve`); its serial."""
        self.tokens.append(token)
        self.serials.append(self._next_serial)
        self._next_serial += 1
        return self.serials[-1]

    def resolve(self, first: int, tokens: list[int]) -> None:
        """Replace device-tensor tokens from position `first` on by their host values."""
        self.tokens[first : first + len(tokens)] = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def run_to(self, level: int, end: int) -> torch.Tensor | None:
        """Compute hidden states at boundary `level` for positions up to `end` (exclusive).

        Returns the newly computed hidden states at that boundary, for positions from its
        previous frontier up to `end` (None if there was nothing to compute).
        """
        top = None
        for i in range(1, level + 1):
            lo = self.frontier[i]
            if lo >= end:
                continue
            hidden = self._take_input(i - 1, lo, end)
            t0 = time.perf_counter()
            hidden = self.ee.run_layers(hidden, self.boundaries[i - 1], self.boundaries[i], self.cache)
            self.passes.append(
                StagePass(self.names[i - 1], self.boundaries[i - 1], self.boundaries[i], (lo, end),
                          tuple(self.serials[lo:end]), time.perf_counter() - t0, self.precision,
                          self.ee.last_pass_beside())
            )
            self.frontier[i] = end
            if i < len(self.boundaries) - 1:
                saved = self._hidden[i]
                self._hidden[i] = hidden if saved is None else torch.cat([saved, hidden], dim=1)
            if i in self._stateful:  # the head's attention step waits until this exit is consulted
                self._head_pending[i].append(hidden)
            if i == level:
                top = self._attend(i)[:, -(end - lo):] if i in self._stateful else hidden
        return top

    def _attend(self, i: int) -> torch.Tensor:
        """Run the waiting positions of boundary i through its head's attention step (once each)."""
        chunks, self._head_pending[i] = self._head_pending[i], []
        waiting = chunks[0] if len(chunks) == 1 else torch.cat(chunks, dim=1)
        lo = self.head_cache.lengths[i]
        if lo + waiting.shape[1] != self.frontier[i]:
            raise RuntimeError(f"exit head cache at boundary {self.boundaries[i]} holds {lo} positions and "
                               f"{waiting.shape[1]} wait, expected {self.frontier[i]} in all")
        t0 = time.perf_counter()
        with torch.inference_mode():
            states = self._stateful[i].attend(waiting, self.head_cache, i)
        self.head_work.append((self.boundaries[i], waiting.shape[1], time.perf_counter() - t0))
        return states

    def _take_input(self, i: int, lo: int, end: int) -> torch.Tensor:
        """Hidden states at boundary i for positions [lo, end); they are consumed."""
        if i == 0:
            tokens = self.tokens[lo:end]
            if all(isinstance(t, int) for t in tokens):
                return self.ee.embed(tokens)
            # Drafts still on the device (see Decoder._draft_on_device): embed without a sync.
            device = self.ee.device
            ids = torch.cat([t.view(1) if isinstance(t, torch.Tensor) else torch.tensor([t], device=device)
                             for t in tokens])
            return self.ee.embed_tokens(ids[None])
        if self.frontier[i] < end:
            raise RuntimeError(f"boundary {self.boundaries[i]} holds {self.frontier[i]} positions, {end} needed")
        saved = self._hidden[i]
        first = self.frontier[i + 1]  # == lo: saved states start where the next stage stopped
        rest = saved[:, end - first :]
        self._hidden[i] = rest if rest.shape[1] else None
        return saved[:, lo - first : end - first]

    def truncate(self, length: int) -> None:
        """Forget every position >= length in tokens, hidden states and all KV caches."""
        del self.tokens[length:]
        del self.serials[length:]
        for i in range(1, len(self.boundaries)):
            if self.frontier[i] > length:
                self.frontier[i] = length
                for layer in range(self.boundaries[i - 1], self.boundaries[i]):
                    self.cache.crop(layer, length)
                self.head_cache.crop(i, length)
                if self._head_pending.get(i):
                    keep = length - self.head_cache.lengths[i]
                    waiting = torch.cat(self._head_pending[i], dim=1)
                    self._head_pending[i] = [waiting[:, :keep]] if keep > 0 else []
            saved = self._hidden[i] if i < len(self.boundaries) - 1 else None
            if saved is not None:
                keep = length - self.frontier[i + 1]
                self._hidden[i] = saved[:, :keep] if keep > 0 else None

    def seed_from(self, other: StageStack, n: int) -> bool:
        """Start this stack's caches from `other`'s keys and values of positions [0, n) (copied, not
        shared), as if it had run them; False (nothing done) when it has attention exit heads or has run
        anything. (A deviation for lanes in a cheaper format: a drafter's cache may hold anything, since
        the exact model decides every token, and this spares it a pass over the whole prompt.)"""
        if self._stateful or any(self.frontier) or min(other.frontier[1:]) < n:
            return False
        for layer in range(self.ee.num_layers):
            keys, values = other.cache.keys[layer], other.cache.values[layer]
            self.cache.update(keys[..., :n, :].clone(), values[..., :n, :].clone(), layer)
        self.frontier = [n] * len(self.boundaries)
        return True

    def copyable_from(self, other: StageStack) -> int:
        """How far this stack can start from `other`'s keys and values (catch_up_from): the positions `other`
        has run at every layer when this stack could take them, else this stack's own frontier."""
        f = self.frontier[1]
        if self._stateful or any(x != f for x in self.frontier[1:]) or any(n != f for n in self.cache.lengths):
            return f
        return max(f, min(other.frontier[1:]))

    def catch_up_from(self, other: StageStack, end: int) -> int:
        """Copy `other`'s keys and values of the positions this stack has not run, before `end - 1` (the newest
        position asked for is always run here: its hidden state is what a caller reads) and as far as `other`
        has run them; the positions copied. As seed_from, a deviation for lanes in a cheaper format: a lane left
        behind by plain steps or by copies the exact model checked alone takes the exact model's keys and values
        of those committed positions instead of running them all in its next pass (its drafts are proposals
        only; the exact model decides every token)."""
        f, upto = self.frontier[1], min(end - 1, self.copyable_from(other))
        if upto <= f:
            return 0
        for layer in range(self.ee.num_layers):  # update() writes them into this cache's own buffers
            self.cache.update(other.cache.keys[layer][..., f:upto, :], other.cache.values[layer][..., f:upto, :], layer)
        self.frontier = [upto] * len(self.boundaries)
        return upto - f

    def cache_lengths(self) -> list[int]:
        return list(self.cache.lengths)

    def head_cache_lengths(self) -> dict[int, int]:
        """Positions in each attention exit head's cache, by exit layer (attended so far)."""
        return {self.boundaries[i]: self.head_cache.lengths[i] for i in self._stateful}

    def head_waiting(self) -> dict[int, int]:
        """Positions waiting for each attention exit head's step, by exit layer."""
        return {self.boundaries[i]: sum(w.shape[1] for w in chunks) for i, chunks in self._head_pending.items()}
