"""The what-if's own plan table (issue 58, item 5): the synthetic run's record told plan by plan, in the real
run's table type (explain.why.plan_table), so a student sees which plans it ran: a 90/90 what-if of lookup → the
4-bit model → the full model drafts with the 4-bit model."""

from __future__ import annotations

import html
import re

import pytest
from helpers import sketch_record, tiny_server

from hispec.model.early_exit import EarlyExitModel
from ui.generate_view import WHAT_IF_VIEWS
from ui.panels.what_if import WhatIf
from ui.panels.why import Why
from ui.settings import PageSettings

q4 = pytest.importorskip("hispec.model.formats.q4")
if q4.q4_kernel.unavailable_reason():
    pytest.skip(f"no 4-bit kernel here: {q4.q4_kernel.unavailable_reason()}", allow_module_level=True)


@pytest.fixture(scope="module")
def server():
    server = tiny_server()
    lm = server.registry.get("tiny")
    lm.ee.add_format("q4", lambda: EarlyExitModel(q4.q4_copy(lm.model)))
    return server


def rows_of(table: str) -> list[list[str]]:
    return [[html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", tr)] for tr in table.split("<tr>")[2:]]


def test_a_90_90_what_if_shows_the_plans_its_synthetic_run_used(server):
    """The default's list (lookup → the 4-bit model → the full model) at 90/90: its table names the 4-bit model's
    plans, labelled synthetic, each row the synthetic record's own (rounds, tokens)."""
    run = sketch_record(("lookup", "full@q4"), "fixed", (3, 1))
    panel = WhatIf(server, Why(server))
    settings = PageSettings("hello hello", "tiny", "HiSpec", 2, 4, 2, 4, 16, True)
    outs = list(panel.what_if(settings, run, 0.9, 0.9, 1))
    assert set(outs[-1]) <= set(WHAT_IF_VIEWS)
    assert outs[0]["what_if_plans"] == "", "a what-if starting empties the last one's table"
    table = outs[-1]["what_if_plans"]
    assert "SYNTHETIC" in table and "take 1" in table and "90% / 90%" in table
    assert "id='hs-what-if-plans-table'" in table and "id='hs-why-plans'" not in table, "its own ids on the page"
    rows = rows_of(table)
    assert rows and any("4-bit full model" in r[0] for r in rows), rows  # it drafted with the 4-bit model
    # every token the synthetic run's rounds committed is in one of its plans' rows (the first: the prompt's)
    assert sum(int(r[2]) for r in rows) == 16 - 1, rows
    assert all(r[4] != "–" for r in rows if "4-bit" in r[0]), "its drawn acceptance is shown per plan"


def test_a_failed_what_if_leaves_no_table(server):
    panel = WhatIf(server, Why(server))
    outs = list(panel.what_if(PageSettings("hello", "tiny", "HiSpec", 2, 4, 2, 4, 16, True), None, 0.9, 0.9, 1))
    assert "Generate once" in outs[-1]["what_if_status"] and not outs[-1].get("what_if_plans")
