"""Published (acceptance, speedup) points of LayerSkip-trained checkpoints, with their sources.

The figures live in assets/published_points.json, each with the sentence or table row it was read
from. Papers report token acceptance as accepted drafts / drafted tokens, where the drafts after a
block's first mismatch count as rejected; the speed model's axis is the per-token acceptance `a`
(a geometric run). `per_token` converts one into the other for blocks of k drafts (a point's `drafts`):
under independent acceptance a block of k accepts a + a² + … + a^k drafts on average.
"""

from __future__ import annotations

import json
from pathlib import Path


def accepted_share(a: float, k: int) -> float:
    """Accepted / drafted for blocks of k drafts at per-token acceptance a."""
    return sum(a**j for j in range(1, k + 1)) / k


def per_token(share: float, k: int) -> float:
    """The per-token acceptance a whose blocks of k drafts accept `share` of their drafts."""
    if not 0 <= share <= 1 or k < 1:
        raise ValueError(f"share must be in [0, 1] and blocks of k >= 1 drafts (got {share}, {k})")
    lo, hi = 0.0, 1.0
    for _ in range(50):  # accepted_share rises with a: bisection
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if accepted_share(mid, k) < share else (lo, mid)
    return (lo + hi) / 2


def load(path: str | Path) -> list[dict]:
    """The plottable points: each with `x` (per-token acceptance), `y` (published speedup), a label
    and its source. Points that lack an acceptance, a speedup or a draft length are left out."""
    data = json.loads(Path(path).read_text())
    points = []
    for p in data.get("points", []):
        if p.get("acceptance") is None or p.get("speedup") is None or not p.get("drafts"):
            continue
        points.append({"x": per_token(p["acceptance"], int(p["drafts"])), "y": float(p["speedup"]),
                       "label": p["label"], "acceptance": p["acceptance"], "drafts": int(p["drafts"]),
                       "hardware": p.get("hardware", "?"), "source": p["source"], "url": p.get("url", "")})
    return points
