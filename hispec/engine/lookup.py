"""The lookup level: proposes, at no layer cost, the continuation that followed the most recent
earlier occurrence of the sequence's last n tokens (prompt and output so far), n tried from long
to short (prompt lookup / n-gram drafting).

The index covers committed positions only: what is committed never changes, so rollbacks never
touch it. For each n, ``_last[n]`` maps an n-gram to the end of its latest occurrence; a query
at the end of the current sequence therefore finds an occurrence that ends strictly earlier.
"""

from __future__ import annotations


class LookupIndex:
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"lookup n-gram sizes need 1 <= min <= max (got {min_ngram}, {max_ngram})")
        self.sizes = tuple(range(max_ngram, min_ngram - 1, -1))
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._indexed = 0  # positions [0, _indexed) have their n-grams ending before them indexed

    def extend(self, tokens: list, committed: int) -> None:
        """Index the n-grams that end at positions up to `committed` - 1 (each ending at p is
        followed by tokens[p], which is committed)."""
        for p in range(max(self._indexed, 1), committed):
            for n in self.sizes:
                if p >= n:
                    self._last[n][tuple(tokens[p - n : p])] = p
        self._indexed = max(self._indexed, committed)

    def propose(self, tokens: list, limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens continuing `tokens`, and the n-gram size that matched (0: none)."""
        end = len(tokens)
        if limit < 1:
            return [], 0
        for n in self.sizes:
            if end < n:
                continue
            p = self._last[n].get(tuple(tokens[end - n :]))
            if p is not None and p < end:
                return list(tokens[p : min(p + limit, end)]), n
        return [], 0
