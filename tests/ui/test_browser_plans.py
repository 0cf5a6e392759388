"""The Why panel's plan picker, the What-if's own plan table and the passes by level, in headless Chromium on the
embedded default model (issue 58): what tests/ui/test_why_pick.py, test_what_if_plans.py and test_lanes.py check
on their values, seen on the page as a student sees it.

- The default run (lookup → the 4-bit model → the exact model, the adaptive policy, one timing pair) shows its
  passes by level: one lane per level of its list, named by its layers, and plain decoding's lane last.
- A What-if at 90/90 on that run drafts with the 4-bit model: its own plan table, labelled SYNTHETIC, has rows
  whose drafts are the 4-bit model's (not lookup's copies of the chat template, issue 58's complaint).
- The plan picker: on a fixed run of the default list (where lookup has no copy, the 4-bit model drafts, so two
  plans always run; the adaptive policy's plans depend on the costs it timed), picking the other plan moves the
  sliders, their names, the estimate and its curve to it.

One app start for the module and two short runs (32 tokens at most). Same set-up as test_browser.py (Debian's
chromium, playwright; skipped without them). HISPEC_SHOTS=DIR keeps the views' screenshots there."""

from __future__ import annotations

import json
import os
import re

import pytest
from test_browser import CHROMIUM, WAIT_MS, browser, wait_for_status  # noqa: F401
from test_browser_why_default import default_app  # noqa: F401 (the default model served, its costs timed)

from ui.labels import DEFAULT_POLICY_LABEL, FIXED

pytestmark = [pytest.mark.browser, pytest.mark.real_model]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

PROMPT = "Repeat this list twice: red apple, green pear, yellow banana, red apple, green pear, yellow banana."
MAX_NEW = 32
PLAIN_LANE = "plain decoding (measured pace)"
AT_SLIDERS = re.compile(r"^(.*?), at the sliders\t(.*?)\t(\d+\.\d\d)×", re.M)  # plan (round), acceptance, estimate


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def shot(page, selector: str, name: str) -> None:
    shots = os.environ.get("HISPEC_SHOTS")
    if shots:
        page.locator(selector).screenshot(path=os.path.join(shots, name))


def generate(browser, url: str, policy: str):  # noqa: F811
    """A page after one run of the default list on PROMPT (MAX_NEW tokens, one timing pair) under `policy`,
    with the Why panel drawn for it."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS * 8)  # the real model on one thread, with a timed pair
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#hs-tokens")
    page.get_by_label("Prompt", exact=True).fill(PROMPT)
    page.locator("#hs-policy").get_by_label(policy).check()
    set_number(page, "hs-baseline", 1)  # one pair: plain decoding's lane and the estimates' plain step
    set_number(page, "hs-max-new", MAX_NEW)
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "Done")
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').includes('against plain decoding')")
    try:  # the picker lists the run's plans other than plain steps: shown with the Why panel's redraw
        page.wait_for_selector("#hs-why-plan", state="visible", timeout=WAIT_MS * 2)
    except sync_api.TimeoutError:
        # say what the run did instead of a bare timeout (a run of plain steps only has no plan to pick)
        said = (f"no plan picker after a {policy} run; its plans: {plan_rows(page, 'hs-why-plans')}; "
                f"its stats: {page.inner_text('#hs-stats')!r}")
        context.close()
        pytest.fail(said)
    return context, page


@pytest.fixture(scope="module")
def default_run(browser, default_app):  # noqa: F811
    context, page = generate(browser, default_app, DEFAULT_POLICY_LABEL)
    yield page
    context.close()


@pytest.fixture(scope="module")
def fixed_run(browser, default_app):  # noqa: F811
    context, page = generate(browser, default_app, FIXED)
    yield page
    context.close()


def plan_rows(page, table: str) -> list[list[str]]:
    """A plan table's rows (plan, rounds, tokens, share, acceptance, ...), as the page shows them."""
    return [[c.inner_text().strip() for c in row.locator("td").all()] for row in page.locator(f"#{table} tr").all()[1:]]


def test_the_default_runs_passes_by_level_one_lane_per_level_and_plain_decoding_last(default_run):
    page = default_run
    plot = page.locator("#hs-lanes-plot")
    page.wait_for_selector("#hs-lanes-plot .js-plotly-plot svg.main-svg")
    assert plot.is_visible()
    # the lanes as a person reads them: the y axis's labels, top to bottom
    ticks = [t.text_content() for t in plot.locator(".yaxislayer-above .ytick text").all()][::-1]
    assert len(ticks) == 4 and ticks[-1] == PLAIN_LANE, ticks  # lookup, the 4-bit model, the full model; plain
    assert ticks[0] == "lookup (no layers)", ticks
    assert ticks[1].startswith("4-bit") and ticks[1].endswith("(layers 0–30)"), ticks  # the whole 4-bit model
    assert ticks[2] == "full model (layers 0–30)", ticks
    # blocks in the lanes: the passes each level ran, and plain decoding's steps at its measured pace
    traces = page.evaluate("() => document.querySelector('#hs-lanes-plot .js-plotly-plot').data"
                           ".map(t => [t.type, t.name, (t.x || []).length])")
    blocks = {name: n for kind, name, n in traces if kind == "bar"}
    assert blocks.get(ticks[1], 0) > 0 and blocks.get(ticks[2], 0) > 0, traces  # the 4-bit model's passes drawn
    assert blocks.get(PLAIN_LANE, 0) > 1, traces  # its prefill, then a step per token
    assert "one lane per level" in page.inner_text("#hs-lanes-note")
    shot(page, "#hs-lanes-plot", "lanes_default_run.png")


def test_a_90_90_what_if_of_the_default_run_drafts_with_the_4bit_model(default_run):
    page = default_run
    select = page.locator("#hs-why-plan input")
    picked = select.input_value()
    assert "4-bit" in picked, picked  # the plan the sliders vary (and the what-if runs) has the 4-bit model
    # the plan in which the 4-bit model drafts, if the run started on another (lookup's copies judged by it); the
    # list holds the plan table's plans (test_picking_another_plan_...)
    plans = [r[0] for r in plan_rows(page, "hs-why-plans")]
    drafts = next((plan for plan in plans if plan.startswith("4-bit")), picked)
    if drafts != picked:
        select.click()
        page.get_by_role("option", name=drafts, exact=True).click()
        page.wait_for_function("() => !(document.querySelector('#hs-what-if-levels')?.innerText || '')"
                               ".includes('lookup')")
    for slider in ("hs-a-dv", "hs-a-vt"):
        set_number(page, slider, 0.9)
    page.wait_for_function("() => [...document.querySelectorAll('#hs-a-dv input[type=number], #hs-a-vt "
                           "input[type=number]')].every(box => box.value === '0.9')")
    page.wait_for_function("() => /, at the sliders\\t[^\\n]*90%/.test(document.querySelector('#hs-why-table')"
                           "?.innerText || '')")
    set_number(page, "hs-what-if-takes", 1)
    page.locator("#hs-what-if-btn").click()
    page.wait_for_function(
        "() => (document.querySelector('#hs-what-if-status')?.innerText || '').includes('1 of 1 takes done')")
    page.wait_for_selector("#hs-what-if-plans-table")
    head = page.inner_text("#hs-what-if-plans-head")
    assert "SYNTHETIC" in head and "90% / 90%" in head, head
    rows = plan_rows(page, "hs-what-if-plans-table")
    # the synthetic run's plans in which the 4-bit model drafted (the first level of the plan, below the full
    # model) committed tokens: the sliders' 90% were drawn on the 4-bit model's drafts
    assert any(r[0].startswith("4-bit") and int(r[2]) > 0 for r in rows), rows
    if drafts.startswith("4-bit"):  # the plan replayed has no lookup: none of its tokens are lookup's copies
        assert not any(r[0].startswith("lookup") for r in rows), rows
    shot(page, "#hs-what-if-box", "what_if_default_run.png")


def test_picking_another_plan_moves_the_sliders_and_the_estimate(fixed_run):
    page = fixed_run
    plans = [r for r in plan_rows(page, "hs-why-plans") if not r[0].startswith("plain step")]
    assert len(plans) == 2, plans  # lookup → the 4-bit model → full, and the 4-bit model → full where no copy
    select = page.locator("#hs-why-plan input")
    first = select.input_value()
    most = max(plans, key=lambda r: int(r[2]))[0]
    assert first == most, (first, plans)  # the list starts on the plan that committed the most tokens
    before = AT_SLIDERS.search(page.inner_text("#hs-why-table"))
    assert before and before[1].startswith(first), page.inner_text("#hs-why-table")
    labels = (page.inner_text("#hs-a-dv"), page.inner_text("#hs-a-vt"))
    what_if = page.inner_text("#hs-what-if-levels")
    curves = page.evaluate("() => document.querySelector('#hs-why-plot .js-plotly-plot').data.map(t => t.name)")
    other = next(r[0] for r in plans if r[0] != first)
    select.click()
    options = [o.strip().lstrip("✓").strip() for o in page.get_by_role("option").all_inner_texts()]
    assert sorted(options) == sorted(r[0] for r in plans), options  # the plans by their table words
    page.get_by_role("option", name=other, exact=True).click()
    page.wait_for_function("(old) => (document.querySelector('#hs-why-table')?.innerText || '').split('\\n')"
                           ".every(line => !line.startsWith(old))", arg=f"{first} (")
    after = AT_SLIDERS.search(page.inner_text("#hs-why-table"))
    assert after and after[1].startswith(other), page.inner_text("#hs-why-table")  # the row names the plan picked
    assert (after[2], after[3]) != (before[2], before[3]), (before[0], after[0])  # its acceptance and estimate
    assert f"{other}: its own pair" in page.inner_text("#hs-a-dv"), page.inner_text("#hs-a-dv")  # the sliders
    assert (page.inner_text("#hs-a-dv"), page.inner_text("#hs-a-vt")) != labels
    note = page.inner_text("#hs-what-if-levels")  # the what-if runs the plan picked: lookup copies or not
    assert note != what_if and ("lookup" in note) == ("lookup" in other), (what_if, note)
    page.wait_for_function("(old) => JSON.stringify(document.querySelector('#hs-why-plot .js-plotly-plot').data"
                           ".map(t => t.name)) !== old", arg=json.dumps(curves))
    shot(page, "#hs-why-box", "why_plan_picked.png")


def test_two_visitors_at_once_each_see_the_machine_they_shared(browser, default_app):  # noqa: F811
    """Issue 60, item 6: two visitors' default runs at once (two browser sessions) share the model's calls; the
    page of one that did says so: "your speed / the machine's" in its stats, its shared passes crossed in the
    lanes, and a sentence in "Why this speed"."""
    pages = []
    for prompt in ("Name three colours and say one thing about each.", "Count from one to twelve in words."):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS * 8)
        page.goto(default_app, wait_until="domcontentloaded")
        page.wait_for_selector("#hs-tokens")
        page.get_by_label("Prompt", exact=True).fill(prompt)
        set_number(page, "hs-baseline", 0)  # no timing pairs
        # long enough that the second run starts while the first runs, however late a busy host delivers its click
        set_number(page, "hs-max-new", 160)
        pages.append((context, page))
    try:
        for _, page in pages:
            page.get_by_role("button", name="Generate", exact=True).click()
        for _, page in pages:
            wait_for_status(page, "Done")
        stats = [page.inner_text("#hs-stats") for _, page in pages]
        # the run that saw the other write meanwhile and share its calls says so (the first always overlaps the
        # second's start; whether the second ends before the first is the host's timing)
        both = [s for s in stats if "your speed / the machine's" in s and "shared with other visitors" in s]
        assert both, stats
        page = next(p for (_, p), s in zip(pages, stats) if s == both[0])
        page.wait_for_selector("#hs-why-sharing")
        assert page.inner_text("#hs-why-sharing").startswith("This run shared the machine")
        page.wait_for_selector("#hs-lanes-plot .js-plotly-plot svg.main-svg")
        names = page.evaluate("() => document.querySelector('#hs-lanes-plot .js-plotly-plot').data.map(t => t.name)")
        assert "shared with other visitors' passes" in names, names
        assert "Crossed blocks" in page.inner_text("#hs-lanes-note")
        shot(page, "#hs-stats", "sharing_stats.png")
        shot(page, "#hs-lanes-plot", "sharing_lanes.png")
        shot(page, "#hs-why-sharing", "sharing_why.png")
    finally:
        for context, _ in pages:
            context.close()
