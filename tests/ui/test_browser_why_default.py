"""'Why this speed' on the embedded default model's default run, in headless Chromium: lookup -> the 4-bit
model -> the exact model, chosen round by round. Every plan that ran gets an estimate and a break-even (the
policy's own formula on the costs the run kept for each lane), and the run's estimate sits within the
measured range or the page says by how much it differs, in numbers.

Same set-up as test_browser.py (Debian's chromium, playwright; skipped without them)."""

from __future__ import annotations

import os
import re

import pytest
from test_browser import CHROMIUM, WAIT_MS, browser, wait_for_status  # noqa: F401

from hispec.evaluation.pairs import MIN_PAIRS
from ui.labels import DEFAULT_POLICY_LABEL

pytestmark = [pytest.mark.browser, pytest.mark.real_model]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def default_app():
    from test_app_integration import serve_tiny_app

    from hispec.model.loading import load_model
    from hispec.runs.runner import warm_up

    lm = load_model("default", device="cpu")
    with serve_tiny_app(lm) as (url, _):
        warm_up(lm)  # its costs timed as it is served (one thread), as the app's registry does before serving
        yield url


def test_every_plan_of_the_default_run_is_estimated_with_its_break_even(browser, default_app):  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS * 8)  # the real model on one thread, with a timed pair
    page.goto(default_app, wait_until="domcontentloaded")
    page.wait_for_selector("#hs-tokens")
    page.get_by_label("Prompt", exact=True).fill(
        "Repeat this list twice: red apple, green pear, yellow banana, red apple, green pear, yellow banana.")
    page.get_by_label(DEFAULT_POLICY_LABEL).check()
    box = page.locator("#hs-baseline input[type=number]")
    # enough pairs for the page to show the range it judges the estimate against (with fewer it shows the
    # median alone, "not enough to tell", and this test could not read that range)
    box.fill(str(MIN_PAIRS))
    box.press("Enter")
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "Done")
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').includes('against plain decoding')")
    rows = page.locator("#hs-why-plans tr").all()[1:]
    cells = [[c.inner_text().strip() for c in row.locator("td").all()] for row in rows]
    ran = [c for c in cells if int(c[2]) > 0 and not c[0].startswith("plain step")]
    assert any("4-bit" in c[0] for c in ran), cells  # the default list ran its 4-bit model
    for c in ran:  # plan, rounds, tokens, share, acceptance, measured, cost model, estimate, expected, break-even
        assert re.match(r"\d+\.\d\d×", c[7]), c  # an estimate, not '–'
        assert c[9] != "–" and ("%" in c[9] or c[9].startswith("never")), c  # a break-even, named by its pair
    table = page.inner_text("#hs-why-table")
    estimate = re.search(r"this run, estimated from its plans[^\n]*?(\d+\.\d\d)×", table)
    measured = re.search(r"this run, measured against plain decoding[^\n]*?(\d+\.\d\d)×(?: \((\d+\.\d\d)–(\d+\.\d\d)×\))?",
                         table)
    why = page.inner_text("#hs-why")
    assert measured, table
    if page.locator("#hs-plain-flag").count():  # the cost model's plain step is off: no estimate of the run
        assert estimate is None and "too busy to estimate" in table, table
    else:
        assert estimate, table
        low, high = (float(measured[2]), float(measured[3])) if measured[2] else (float(measured[1]),) * 2
        if not low <= float(estimate[1]) <= high:  # outside the range: the gap is said in numbers
            assert re.search(r"the estimate is \d+% (above|below) the measured ratio", why), why
    # the sliders vary the default run's own 4-bit plan (issue 56: the default had no slider curve at all)
    label = page.inner_text("#hs-a-vt")
    assert "4-bit" in label, label  # named by the plan's own pair into the full model
    at_sliders = re.compile(r"4-bit[^\n]*, at the sliders[^\n]*?(\d+\.\d\d)×")
    before = at_sliders.search(page.inner_text("#hs-why-table"))
    assert before, page.inner_text("#hs-why-table")
    assert page.locator("#hs-why-plot").is_visible(), "the plan's curve is drawn"
    for value in ("0.2", "0.99"):  # move the acceptance into the full model: the estimate moves with it
        number = page.locator("#hs-a-vt input[type=number]")
        number.fill(value)
        number.press("Enter")
        page.wait_for_function("(old) => { const t = document.querySelector('#hs-why-table'); "
                               "return t && !t.innerText.includes(old); }", arg=before[0])
        after = at_sliders.search(page.inner_text("#hs-why-table"))
        assert after and after[0] != before[0], (before[0], after and after[0])
        before = after
    shots = os.environ.get("HISPEC_SHOTS")
    if shots:
        page.locator("#hs-why").screenshot(path=os.path.join(shots, "why_default_run.png"))
    context.close()
