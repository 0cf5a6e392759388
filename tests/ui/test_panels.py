"""The page in panels (ui/panels, issue 56): app.build is the list of panels, each wiring its own events by the
page's component names, and the page's public events keep their names, inputs, queue flags and concurrency."""

from __future__ import annotations

import pytest
from helpers import tiny_server

from hispec.serving.edge import STOP_EVENT
from ui.panels.wiring import bind, components, named
from ui.settings import PageSettings


@pytest.fixture(scope="module")
def server():
    return tiny_server()


def test_the_page_is_its_panels_each_wiring_itself(server):
    import app

    panels = app.panels(server)
    assert [type(p).__name__ for p in panels] == ["BenchTab", "Generate", "Lesson", "Why", "WhatIf", "Compare", "Steps",
                                                  "Model"]
    assert all(callable(getattr(p, "wire", None)) for p in panels)
    generate = panels[1]
    assert [type(p).__name__ for p in generate.follow] == ["Why", "Steps"], "the views that follow a run"


def test_the_public_events_keep_their_names_inputs_and_flags(server):
    """What clients call: /generate, /compare, /load_model, /benchmark and the Stop (outside the queue: never
    refused, nor waiting behind the jobs it stops); everything else is hidden."""
    import app

    demo = app.build(server, ["tiny"])
    public = {fn.api_name: fn for fn in demo.fns.values() if fn.api_visibility == "public"}
    assert set(public) == {"generate", "compare", "load_model", "benchmark", STOP_EVENT}
    assert not public[STOP_EVENT].queue and not public[STOP_EVENT].inputs
    for name in ("generate", "compare", "load_model", "benchmark"):
        assert public[name].queue and public[name].concurrency_limit is None, name  # serving queues them
    # /compare's positional order: the settings, the policy, then baselines, repeats, levels
    order = [n for n in PageSettings.names() if n not in ("baseline", "levels")] + ["baselines", "repeats", "levels"]
    labels = [b.elem_id or b.label for b in public["compare"].inputs]
    assert len(labels) == len(order) == 17 and labels[0] == "hs-prompt" and labels[-1] == "hs-levels", labels
    assert [b.label for b in public["benchmark"].inputs] == ["Model", "Benchmark set", "Items from the set", "Methods",
                                                             "Token budget per item"]


def test_a_handler_is_bound_by_the_pages_names():
    from types import SimpleNamespace

    page = SimpleNamespace(prompt="P", status="S", plots=["A", "B"])

    def handler(prompt):
        return {"status": prompt}

    fn, inputs, outputs = bind(handler, page, ("prompt",), ("status",))
    assert inputs == ["P"] and outputs == ["S"] and fn("hi") == {"S": "hi"}
    assert named(page, "status", "prompt") == {"status": "S", "prompt": "P"}
    assert components(page, "status", "plots") == ["S", "A", "B"], "a list of components gives them all"
    with pytest.raises(AttributeError):
        named(page, "no_such_component")
