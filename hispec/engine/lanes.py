"""One sequence's stage stacks, one per number format of the same weights (levels are (depth, precision)).

The exact lane is the model's own format: its stack's boundaries are the exact exits and the full depth,
and only it decides what is committed. Each cheaper format (``levels.PRECISIONS``) is a lane of its own:
a ``StageStack`` over that format's copy of the model, with its own KV caches, frontiers and hidden
states, over the same tokens. So a cheaper format writes its own keys and values and never touches the
exact lane's: the exact caches hold only what the exact model computed, position by position, which is
what plain exact decoding of the committed tokens holds (a test checks it).

Every lane starts from the tokens (boundary 0 is the embedding), so a lane that has not seen a token yet
runs it when one of its levels is next consulted: after the exact model writes a correction or a bonus
token, the cheaper lane catches up on it in its next pass, never running a position twice. Positions the
exact model has already run (the prompt, committed tokens a lane missed while plain steps ran) a cheaper lane
takes from the exact lane's keys and values instead (StageStack.seed_from, catch_up_from): copied into its
own cache, never the other way.
``truncate`` cuts every lane; ``run_to((lane, i), end)`` runs one lane up to its boundary i.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from hispec.engine.stack import StageStack

if TYPE_CHECKING:
    from hispec.model.early_exit import EarlyExitModel

Stop = tuple[str | None, int]  # (precision, boundary index in that lane's stack)


class Lanes:
    def __init__(self, ee: EarlyExitModel, lanes: dict[str | None, tuple[tuple[int, ...], tuple[str, ...]]],
                 models: dict[str | None, EarlyExitModel], capacity: int):
        """`lanes`: for each precision (None: exact), its stack's boundaries and stage names;
        `models`: each precision's model (None: `ee`)."""
        boundaries, names = lanes[None]
        self.exact = StageStack(ee, boundaries, names, capacity)
        self.stacks: dict[str | None, StageStack] = {None: self.exact}
        for precision, (bounds, stage_names) in lanes.items():
            if precision is not None:
                self.stacks[precision] = StageStack(models[precision], bounds, stage_names, capacity,
                                                    shared=self.exact, precision=precision)
        self.tokens, self.serials = self.exact.tokens, self.exact.serials
        self.passes, self.head_work = self.exact.passes, self.exact.head_work

    def __len__(self) -> int:
        return len(self.exact.tokens)

    def append(self, token: int | torch.Tensor) -> int:
        return self.exact.append(token)

    def resolve(self, first: int, tokens: list[int]) -> None:
        self.exact.resolve(first, tokens)

    def run_to(self, stop: Stop, end: int) -> torch.Tensor | None:
        precision, i = stop
        stack = self.stacks[precision]
        if precision is not None:  # a cheaper lane left behind takes the exact lane's keys and values first
            stack.catch_up_from(self.exact, end)
        return stack.run_to(i, end)

    def seed_cheap_lanes(self, n: int) -> list[str]:
        """After the prefill: each cheaper lane starts from the exact lane's keys and values of the
        prompt's n positions instead of running the prompt itself (StageStack.seed_from says why and
        when it cannot); the lanes seeded."""
        return [p for p, stack in self.stacks.items() if p is not None and stack.seed_from(self.exact, n)]

    def behind(self) -> dict[str, int]:
        """Positions of the sequence each cheaper lane would run in its next pass before what that pass is
        for (through its first stage): those it has not run and cannot take from the exact lane
        (StageStack.catch_up_from); the policy counts them (engine.planning.round.Round.catch_up)."""
        return {p: len(self.tokens) - stack.copyable_from(self.exact) for p, stack in self.stacks.items()
                if p is not None}

    def truncate(self, length: int) -> None:
        for stack in self.stacks.values():
            stack.truncate(length)

    def cache_lengths(self, precision: str | None = None) -> list[int]:
        """Positions held per layer in one lane's KV cache (the exact lane's by default)."""
        return self.stacks[precision].cache_lengths()

    def head_cache_lengths(self) -> dict[int, int]:
        return self.exact.head_cache_lengths()

    def release(self) -> None:
        for stack in self.stacks.values():
            stack.cache.release()


def lane_layout(levels) -> tuple[dict[str | None, tuple[tuple[int, ...], tuple[str, ...]]], dict[int, Stop]]:
    """From a list of levels (engine.levels.Level, lookup included): each lane's boundaries and stage names,
    and the stop (lane, boundary index) of every level that runs layers (by its index in the list)."""
    lanes: dict[str | None, list] = {}
    for level in levels:
        if level.kind != "lookup":
            lanes.setdefault(level.precision, []).append(level)
    if None not in lanes:
        raise ValueError("a level list ends with the exact full model")
    layout, stops = {}, {}
    for precision, members in lanes.items():
        bounds = (0, *(lv.layer for lv in members))
        if bounds[-1] != levels[-1].layer:  # a cheaper lane that stops at an exit still needs its full depth
            bounds = (*bounds, levels[-1].layer)
            members = [*members, None]
        layout[precision] = (bounds, tuple(lv.name if lv is not None else "unused" for lv in members))
    for j, level in enumerate(levels):
        if level.kind != "lookup":
            bounds = layout[level.precision][0]
            stops[j] = (level.precision, bounds.index(level.layer))
    return layout, stops
