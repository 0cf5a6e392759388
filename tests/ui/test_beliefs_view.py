"""The layer x token grid of what each exit believes (ui/beliefs_view.py)."""

import html
import re

from helpers import EVIL, ee_of, hf_greedy, tiny_model

from hispec.explain.beliefs import exit_beliefs
from ui.beliefs_view import beliefs_html
from ui.render import COLORS


def _beliefs():
    rows = [{"layer": 2, "kind": "raw", "label": "exit 2 · raw"},
            {"layer": 2, "kind": "trained", "label": "exit 2 · trained", "head": "norm + full linear"},
            {"layer": 4, "kind": "full", "label": "full model (4 layers)"}]
    tokens = []
    for i, text in enumerate(EVIL[:3]):
        cells = [{"top": [[7, "<script>alert(1)</script>", 0.41], [9, " a", 0.12]], "match": False, "p": 0.01},
                 {"top": [[10 + i, text, 0.6], [9, " a", 0.2]], "match": True, "p": 0.6},
                 {"top": [[10 + i, text, 0.9]], "match": True, "p": 0.9}]
        tokens.append({"index": i, "token_id": 10 + i, "text": text, "cells": cells,
                       "certain_at": 2, "certain_row": 1, "certain_label": "exit 2 · trained"})
    return {"num_layers": 4, "top": 2, "layers": rows, "tokens": tokens}


def test_one_row_per_exit_plus_the_certainty_row():
    out = beliefs_html(_beliefs())
    assert out.startswith('<div class="hs-beliefs" id="hs-beliefs-grid">')
    body = out.split("<tbody>")[1]
    assert body.count("<tr") == 3 + 1
    assert "depth of certainty" in body.split("<tr")[-1]
    for label in ("exit 2 · raw", "exit 2 · trained", "full model (4 layers)"):
        assert label in out
    assert out.count(f"background:{COLORS['accepted']}") == 6
    assert out.count(f"background:{COLORS['target-rejected']}") == 3
    assert "hs-beliefs-caption" in out


def test_model_text_is_escaped():
    out = beliefs_html(_beliefs())
    assert "<script" not in out and "<img" not in out and "\x1b" not in out
    assert "&lt;script&gt;" in out
    assert html.escape(EVIL[1], quote=True) in out  # the column header, as text


def test_titles_list_the_candidates_with_probabilities():
    out = beliefs_html(_beliefs())
    titles = [html.unescape(t) for t in re.findall(r'<td class="hs-beliefs-cell[^"]*"[^>]*title="([^"]*)"', out)]
    assert len(titles) == 9
    assert titles[0] == "exit 2 · raw: '<script>alert(1)</script>' 41% · ' a' 12% · kept token: 1.0%"


def test_an_empty_generation_says_so():
    out = beliefs_html({"layers": [], "tokens": []})
    assert "Generate some text first" in out and "<table" not in out


def test_a_real_generation_draws():
    model = tiny_model("llama", layers=4, seed=1)
    prompt = [5, 6, 7]
    tokens = hf_greedy(model, prompt, 5)
    beliefs = exit_beliefs(ee_of(model), prompt, tokens)
    out = beliefs_html(beliefs)
    assert out.split("<tbody>")[1].count("<tr") == len(beliefs["layers"]) + 1
    assert out.count('class="hs-beliefs-token"') == len(tokens)
