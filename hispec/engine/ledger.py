"""The token ledger of one generation: what each placed token is, and the event of every change.

For every token on the stage stack (by serial) it keeps its text piece, the level that proposed it
and the level that last passed or wrote it (`holder`, what the policy and the priors key on), and
what it was drawn from (`proposal`, for lossless sampling). It commits the prefix the full model
accepted, finds why the generation ends (EOS, budget, a stop string), cuts rejected positions from
the stack and writes a TokenEvent for each change, in order, into `out` for the decoder to drain.
"""

from __future__ import annotations

from typing import Callable

from hispec.engine.events import Event, TokenEvent, TokenState
from hispec.engine.sampling import PointMass, Proposal
from hispec.text import Detokenizer

S = TokenState


class Ledger:
    def __init__(self, prompt_len: int, eos: frozenset[int], detok: Detokenizer, max_new_tokens: int,
                 stop_strings: tuple[str, ...], clock: Callable[[], float]):
        self.stack = None  # the generation's Lanes, once started
        self.prompt_len, self.eos, self.detok = prompt_len, eos, detok
        self._max_new, self._stop_strings, self._clock = max_new_tokens, stop_strings, clock
        self.committed = 0  # positions [0, committed) are final (prompt included)
        self.round = 0
        self.finish_reason: str | None = None
        self.out: list[Event] = []
        self.holder: dict[int, str] = {}  # serial -> the level that last proposed, wrote or passed it
        self.proposal: dict[int, Proposal] = {}  # serial -> what the token was drawn from (sampling)
        self._texts: dict[int, tuple[str, str]] = {}  # serial -> (text, origin)
        self._text = ""  # committed text, for stop strings

    def room(self) -> int:
        """New tokens the budget still allows beyond what the stack holds."""
        return self._max_new - (len(self.stack) - self.prompt_len)

    def place(self, token: int, state: TokenState, origin: str, dist=None) -> None:
        self.holder[self.stack.append(token)] = origin
        self.record(len(self.stack) - 1, state, origin, dist)

    def place_copies(self, tokens: list[int], holder: str) -> None:
        """The lookup level's proposal: a point mass on each copied token, held as `holder` ('lookup:N')."""
        for token in tokens:
            self.place(token, S.DRAFTED, "lookup", PointMass(token))
            self.holder[self.stack.serials[-1]] = holder

    def record(self, pos: int, state: TokenState, origin: str, dist=None) -> None:
        """Text and proposal of the token placed at `pos`, and its first event."""
        serial = self.stack.serials[pos]
        self._texts[serial] = (self.detok.piece(self.stack.tokens[:pos], self.stack.tokens[pos]), origin)
        if dist is not None:
            self.proposal[serial] = dist
        self.emit(pos, state, origin)

    def write(self, token: int, stage: str) -> None:
        """A token written by a verifier itself (the target's is committed at once)."""
        self.place(token, S.TARGET_WROTE, stage)
        self._check_finish(len(self.stack) - 1)

    def commit(self, pos: int, state: TokenState) -> bool:
        """Commit position `pos`; True when the generation ends there."""
        self.emit(pos, state, "target")
        return self._check_finish(pos)

    def _check_finish(self, pos: int) -> bool:
        self.committed = pos + 1
        token = self.stack.tokens[pos]
        self._text += self._texts[self.stack.serials[pos]][0]
        if token in self.eos:
            self.finish_reason = "eos"
        elif self.committed - self.prompt_len >= self._max_new:
            self.finish_reason = "max_new_tokens"
        elif any(s in self._text[-(len(s) + 64) :] for s in self._stop_strings):
            self.finish_reason = "stop_string"
        return self.finish_reason is not None

    def judged(self, first: int, verdict, judge: str) -> None:
        """An intermediate level's verdict on the tokens from `first` on: the agreed prefix becomes
        tentative (now drawn, in effect, from the judge's distribution), the first rejected token is
        replaced by the judge's own (also tentative), the rest are thrown away."""
        for pos in range(first, first + verdict.accepted):
            serial = self.stack.serials[pos]
            self.proposal[serial], self.holder[serial] = verdict.dists[pos - first], judge
            self.emit(pos, S.TENTATIVE, judge)
        if first + verdict.accepted < len(self.stack):
            self.reject_from(first + verdict.accepted, S.VERIFY_REJECTED, judge)
            self.place(verdict.token, S.VERIFY_WROTE, judge, verdict.dist)

    def reject_from(self, pos: int, state: TokenState, stage: str) -> None:
        if pos >= len(self.stack):
            return
        for p in range(pos, len(self.stack)):
            self.emit(p, state, stage)
        self.stack.truncate(pos)

    def emit(self, pos: int, state: TokenState, stage: str) -> None:
        serial = self.stack.serials[pos]
        text, origin = self._texts[serial]
        self.out.append(TokenEvent(state, serial, pos - self.prompt_len, self.stack.tokens[pos], text,
                                   origin, stage, self.round, self._clock()))
