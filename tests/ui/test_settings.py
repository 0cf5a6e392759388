"""The page's settings as one value (ui.settings), and handlers wired by name (ui.panels.wiring)."""

import inspect

import gradio as gr
import pytest

from ui import labels
from ui.panels.wiring import by_name
from ui.settings import PageSettings


class _Box:  # a stand-in for a component: hashable, compared by identity
    def __init__(self, name):
        self.name = name


def test_the_settings_value_becomes_the_requests_fields():
    raw = PageSettings("hi", "tiny", "LayerSkip (single exit)", 3, 5, 2, 4, 16, True, policy=labels.FIXED,
                       levels="lookup,full@q4").request(baseline=2)
    assert raw["method"] == "layerskip" and raw["policy"] == "fixed" and raw["max_new_tokens"] == 16
    assert raw["levels"] is None, "the Levels box belongs to HiSpec"
    assert raw["baseline"] == 2


def test_a_handler_wired_by_name_gets_the_settings_whole_and_sends_every_output_by_name():
    boxes = {name: _Box(name) for name in (*PageSettings.names(), "takes")}
    out = {name: _Box(name) for name in ("status", "tokens", "last_run")}
    seen = {}

    def handler(settings, takes, request=None):
        seen.update(settings=settings, takes=takes)
        yield {}  # nothing changed yet
        yield {"status": "Done"}

    fn, inputs, outputs = by_name(handler, boxes, out)
    # Gradio sends the inputs positionally, in the order wired (an API's order)
    values = [{"prompt": "hi", "max_new": 9, "takes": 3}.get(name, getattr(PageSettings(), name, None))
              for name in boxes]
    sent = list(fn(*values))
    assert seen["settings"] == PageSettings(prompt="hi", max_new=9) and seen["takes"] == 3
    assert inputs == list(boxes.values()) and outputs == list(out.values())
    assert list(inspect.signature(fn).parameters)[:3] == ["prompt", "model", "method"]
    # the request, which Gradio passes in its place after the inputs, reaches the handler (a Stop finds the run)
    def asks(settings, takes, request=None):
        return {"status": request}

    assert by_name(asks, boxes, out)[0](*values, "the request")[out["status"]] == "the request"
    # every output is named in every answer (an empty dict is one value to Gradio): skipped unless given
    assert all(set(s) == set(out.values()) for s in sent)
    assert sent[1][out["status"]] == "Done" and isinstance(sent[1][out["tokens"]], type(gr.skip()))

    def wrong(settings, takes):
        return {"typo": 1}

    with pytest.raises(KeyError, match="typo"):
        by_name(wrong, boxes, out)[0](*values)


def test_a_handler_that_takes_no_settings_gets_a_settings_field_by_its_own_name():
    boxes = {"model": _Box("model"), "preset_choice": _Box("preset_choice")}
    out = {"status": _Box("status")}

    def preset(preset_choice, model):
        return {"status": f"{preset_choice} on {model}"}

    fn, _, _ = by_name(preset, boxes, out)
    assert fn("tiny", "Teaching") == {out["status"]: "Teaching on tiny"}


def test_a_presets_status_is_sentences_each_with_its_capital():
    from types import SimpleNamespace

    from ui import controls

    fastest = SimpleNamespace(draft_layer=2, verify_layer=4, draft_len=1, verify_threshold=1)
    status = controls.preset_values(controls.TEACHING, fastest)["status"]
    assert "Preset: Teaching (drafts pile up). The same layers" in status, status
