"""Lesson mode in headless Chromium (issue 58): a shipped recorded run of the default model replayed on the page,
with every view after it (the steps, what each exit believed, "Why this speed" with its sliders), while the
served model's layers are never run: two visitors watch at once. Same set-up as test_browser.py."""

from __future__ import annotations

import pytest
from test_browser import CHROMIUM, WAIT_MS, browser, wait_for_status  # noqa: F401

from hispec.runs.lessons import load_lessons

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")


@pytest.fixture(scope="module")
def counted_app():
    """The tiny app, with a count of every layer pass its model runs."""
    from test_app_integration import serve_tiny_app

    with serve_tiny_app() as (url, lm):
        calls = {"passes": 0}
        run_layers = lm.ee.run_layers

        def counted(*args, **kwargs):
            calls["passes"] += 1
            return run_layers(*args, **kwargs)

        lm.ee.run_layers = counted
        try:
            yield url, calls
        finally:
            lm.ee.run_layers = run_layers


def test_two_visitors_watch_a_lesson_at_once_and_the_model_never_runs(browser, counted_app):  # noqa: F811
    url, calls = counted_app
    lessons = load_lessons()
    assert lessons, "the shipped lessons (assets/lessons)"
    pages = []
    for _ in range(2):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("#hs-lesson-btn")
        pages.append((context, page))
    before = calls["passes"]
    for _, page in pages:  # both at once: a replay holds no model turn
        page.get_by_role("button", name="Replay the lesson").click()
    for _, page in pages:
        wait_for_status(page, "Lesson replayed")
        assert page.locator("#hs-tokens .hs-tok").count() > 10
        assert page.input_value("#hs-prompt textarea") == lessons[0].prompt
        page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '')"
                               ".includes('A recorded run, replayed')")
        page.locator("#hs-beliefs-box").get_by_text("What each exit believes").click()
        grid = page.locator("#hs-beliefs-grid")
        grid.wait_for()
        assert "4-bit" in grid.inner_text(), "the recorded beliefs, the run's 4-bit level's row among them"
        assert "4-bit" in page.inner_text("#hs-a-vt"), "the sliders vary the lesson's own 4-bit plan"
        assert "measured" in page.inner_text("#hs-stats")
        # the race against plain decoding (the lesson's own pairs) and acceptance by position, one line per pair
        page.wait_for_selector("#hs-race-plot .js-plotly-plot svg.main-svg")
        assert "plain decoding (measured)" in page.inner_text("#hs-race-plot")
        page.wait_for_selector("#hs-position-plot .js-plotly-plot svg.main-svg")
        lines = page.locator("#hs-position-plot .scatterlayer .trace").count()
        assert lines == len(lessons[0].record.pairs), (lines, [p.words for p in lessons[0].record.pairs])
    assert calls["passes"] == before, "a lesson spends no model time"
    for context, _ in pages:
        context.close()
