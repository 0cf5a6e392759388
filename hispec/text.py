"""Token text: incremental detokenisation and safe rendering of model output."""

from __future__ import annotations

import re
from typing import Sequence

# C0/C1 control characters except tab and newline; rendered visibly, never interpreted.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """Model text with control characters (ANSI escapes included) made visible and inert."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def sentence(text: str) -> str:
    """A message as a reader meets it: its first letter in capitals ('unknown method' -> 'Unknown method');
    the engine's errors start in lower case to read inside other text, and every one reaches a person
    through this. A message that starts with a field's own name keeps it as typed ('max_new_tokens must be')."""
    first = text.split(" ", 1)[0]
    return text if "_" in first else text[:1].upper() + text[1:]


class Detokenizer:
    """Text of one token in its context, so that multi-token characters and leading spaces
    come out right; a tokenizer-less fallback shows ids (tiny test models)."""

    def __init__(self, tokenizer=None, window: int = 4):
        self.tokenizer = tokenizer
        self.window = window

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if self.tokenizer is None:
            return "".join(f"<{i}>" for i in ids)
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def piece(self, prefix: Sequence[int], token: int) -> str:
        context = list(prefix[-self.window :]) if self.tokenizer is not None else []
        before = self.decode(context)
        after = self.decode(context + [token])
        return after[len(before) :] if after.startswith(before) else self.decode([token])
