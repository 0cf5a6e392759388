"""What every panel wires with: a handler bound to the page's components by name.

`by_name(fn, inputs, outputs)` wires a handler whose inputs arrive as keyword arguments named like the
page's components (wired in the order given: an API's positional order) and whose results are dicts by
output name (a name left out leaves its component as it is): no tuple counted by hand. `bind(fn, page,
inputs, outputs)` does it with the names of ui.page's attributes; `named` and `components` look them up.
"""

from __future__ import annotations

import inspect
from typing import Iterable

import gradio as gr

from ui.settings import PageSettings

SETTINGS = PageSettings.names()  # the page's components that make one PageSettings


def named(page, *names: str) -> dict:
    """The page's components by name (the names of ui.page's attributes)."""
    return {name: getattr(page, name) for name in names}


def components(page, *names: str) -> list:
    """The page's components by name, in order, for a handler that answers by position (a name holding a
    list of components, such as a tab's charts, gives them all)."""
    out = []
    for name in names:
        value = getattr(page, name)
        out.extend(value if isinstance(value, list) else [value])
    return out


def bind(fn, page, inputs: Iterable[str], outputs: Iterable[str]):
    """by_name() with the page's components named: (handler, inputs, outputs) for a Gradio event."""
    return by_name(fn, named(page, *inputs), named(page, *outputs))


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
