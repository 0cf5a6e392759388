"""A peer's timing, recorded with the keys our methods' records have (bench.run_one)."""

from __future__ import annotations

from hispec.runs.metrics import decode_rate


def timed_record(token_ids: list[int], t0: float, first: float | None, end: float) -> dict:
    """A peer's record keys, timed like ours: wall time, tokens/s, time to first token, decode-only speed."""
    wall = end - t0
    ttft = first - t0 if first is not None else None
    return {"token_ids": token_ids, "wall_s": wall, "tokens_per_s": len(token_ids) / wall if wall > 0 else 0.0,
            "ttft_s": ttft, "decode_tokens_per_s": decode_rate(len(token_ids), wall, ttft)}
