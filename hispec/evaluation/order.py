"""One fair order of runs for every side-by-side measurement: bench, sweep, compare and the page's pairs.

Runs taken one after another are not independent on a shared machine: a run may find the caches warm
or cold from its predecessor, and the machine's load drifts. So the order of the runs of each pass (one
prompt, one repeat) follows a balanced Latin square (Williams' design):

    every method runs in every position equally often, and right after every other method equally often,
    over one cycle of passes (n passes for n methods when n is even, 2n when n is odd);
    a pass is followed by its mirror image (A B C, C B A, ...), so that a drift that is linear in time
    costs every method alike over any two passes in a row.

With two methods this is the alternation A B, B A. Where the passes stop short of a whole cycle the
balance is partial; `Balanced.describe` records the design and every pass's order in the artifact.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

DESIGN = "williams"


def williams(n: int) -> list[tuple[int, ...]]:
    """The rows of a Williams design for n treatments (indices), in the order they are used: each row
    followed by its mirror image. n rows for even n, 2n for odd n (n = 1: one row)."""
    if n < 1:
        raise ValueError("a design needs at least one treatment")
    first = [0] + [(j + 1) // 2 if j % 2 else n - j // 2 for j in range(1, n)]  # 0, 1, n-1, 2, n-2, ...
    square = [tuple((x + i) % n for x in first) for i in range(n)]
    if n % 2:  # odd n: the square and its mirror images together balance who follows whom
        square += [row[::-1] for row in square]
    cycle, left = [], list(dict.fromkeys(square))
    while left:
        row = left.pop(0)
        cycle.append(row)
        if row[::-1] in left:
            left.remove(row[::-1])
            cycle.append(row[::-1])
    return cycle


@dataclass(frozen=True)
class Balanced:
    """The order of `names` (any values: methods, grid points, configurations) pass by pass."""

    names: tuple

    def __init__(self, names: Sequence):
        object.__setattr__(self, "names", tuple(names))

    @property
    def cycle(self) -> list[tuple[int, ...]]:
        return williams(len(self.names)) if self.names else [()]

    def of(self, i: int) -> list:
        """The runs of pass i (0, 1, ...), in the order they go."""
        cycle = self.cycle
        return [self.names[k] for k in cycle[i % len(cycle)]]

    def describe(self, passes: list[list[str]]) -> dict:
        """What the artifact records: the design, its cycle's length, and the order every pass ran in
        (`passes`: the names as written, pass by pass)."""
        return {"design": DESIGN, "cycle": len(self.cycle), "seed": None,
                "how": "a balanced Latin square (Williams): over a cycle every method runs in every position and "
                       "right after every other method equally often; each pass is followed by its mirror image",
                "passes": passes}
