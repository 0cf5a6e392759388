"""The page's settings as one value, and handlers wired by name.

`PageSettings` holds what the settings column and the prompt say, as the page labels them; it is passed
whole from the page to the handlers, and `request()` gives serving's GenerateRequest fields (labels
mapped to the engine's names). `by_name(fn, inputs, outputs)` wires a handler whose inputs arrive as
keyword arguments named like the page's components (wired in the order given: an API's
positional order) and whose results are dicts by output name (a name
left out leaves its component as it is): no tuple counted by hand.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, fields

import gradio as gr

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


def by_name(fn, inputs: dict, outputs: dict):
    """(handler, inputs, outputs) for Gradio: `fn` gets `settings` (a PageSettings, when it takes one and any
    of its fields is among `inputs`) and every other input by its name, and `request`; what it returns or yields is a
    dict by output name, sent on as a dict by component."""
    parameters = inspect.signature(fn).parameters
    takes_request = "request" in parameters
    # the settings travel whole to a handler that takes them; another gets each by its own name
    settings_names = set(PageSettings.names()) if "settings" in parameters else set()

    names = list(inputs)

    def arguments(values: tuple, request) -> dict:
        if len(values) > len(names):  # Gradio puts the request in its place in the signature, after the inputs
            values, request = values[:len(names)], values[len(names)]
        named = dict(zip(names, values))
        given = {n: named.pop(n) for n in list(named) if n in settings_names}
        if given:
            named["settings"] = PageSettings(**given)
        return named | ({"request": request} if takes_request else {})

    def sent(result):  # every output named (Gradio reads an empty dict as one value): skipped unless given
        result = result or {}
        unknown = set(result) - set(outputs)
        if unknown:
            raise KeyError(f"{getattr(fn, '__name__', fn)} returned outputs it is not wired to: {sorted(unknown)}")
        return {component: result.get(name, gr.skip()) for name, component in outputs.items()}

    if inspect.isgeneratorfunction(fn):
        def handler(*values, request: gr.Request = None):
            for result in fn(**arguments(values, request)):
                yield sent(result)
    else:
        def handler(*values, request: gr.Request = None):
            return sent(fn(**arguments(values, request)))
    # the inputs in the order given (an API's positional order), by name, then the request Gradio fills in
    handler.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
        + [inspect.Parameter("request", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None, annotation=gr.Request)])
    handler.__name__ = getattr(fn, "__name__", "handler")
    return handler, list(inputs.values()), list(outputs.values())
