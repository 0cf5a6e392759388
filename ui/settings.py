"""The page's settings as one value.

`PageSettings` holds what the settings column and the prompt say, as the page labels them; it is passed
whole from the page to the panels' handlers (ui.panels.wiring.by_name), and `request()` gives serving's
GenerateRequest fields (labels mapped to the engine's names).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ui import labels


@dataclass(frozen=True)
class PageSettings:
    """The values of the page's generation controls, as the page labels them."""

    prompt: str = ""
    model: str | None = None
    method: str = "HiSpec"
    draft_layer: int | None = None
    verify_layer: int | None = None
    draft_len: int | None = None
    verify_threshold: int | None = None
    max_new: int = 64
    chat: bool = True
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = -1
    policy: str = labels.DEFAULT_POLICY_LABEL
    baseline: int = 0
    levels: str = ""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    def request(self, **changed) -> dict:
        """GenerateRequest's raw fields (serving checks them); `changed`: fields set otherwise (e.g.
        levels=..., policy=... by their engine names)."""
        method = labels.method_name(self.method)
        raw = {"prompt": self.prompt, "model": self.model, "method": method, "policy": labels.policy_name(self.policy),
               "draft_layer": self.draft_layer, "verify_layer": self.verify_layer, "draft_len": self.draft_len,
               "verify_threshold": self.verify_threshold, "max_new_tokens": self.max_new, "chat": bool(self.chat),
               "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "seed": self.seed,
               "baseline": self.baseline,
               # the Levels box belongs to HiSpec: the other methods have lists of their own
               "levels": (labels.levels_name(self.levels) or None) if method == "hispec" else None}
        return raw | changed
