"""Two visitors at once on the embedded default model, in headless Chromium (issue 60): their generations hold
the model together and their passes share calls (serving.turns' seats, model.shared's board). Each page shows
its own answer, equal to what the prompt gets alone, and says what sharing did ("shared with other visitors").

Same set-up as test_browser.py (Debian's chromium, playwright; skipped without them)."""

from __future__ import annotations

import pytest
from helpers import wait_until
from test_browser import CHROMIUM, WAIT_MS, browser  # noqa: F401

from hispec.engine.config import preset
from hispec.runs.runner import run_loaded

pytestmark = [pytest.mark.browser, pytest.mark.real_model]
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

PROMPTS = ("Name three colours of the rainbow.", "Write one sentence about the sea.")
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def default_app():
    from test_app_integration import serve_tiny_app

    from hispec.model.loading import load_model
    from hispec.runs.runner import warm_up

    lm = load_model("default", device="cpu")
    servers = []
    with serve_tiny_app(lm, servers=servers) as (url, _):
        warm_up(lm)
        yield url, lm
        # the pages' follow-up requests (a run's pass costs, its exits' beliefs) end before the server does: a
        # thread still inside torch as the interpreter exits aborts the process (exit code 134)
        wait_until(lambda: servers[0].jobs.of() == [], timeout=120)


def _page(browser, url):  # noqa: F811
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS * 8)
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("#hs-tokens")
    return context, page


def _set_number(page, elem_id: str, value: int) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def test_two_visitors_at_once_share_passes_and_each_gets_its_solo_answer(browser, default_app):  # noqa: F811
    url, lm = default_app
    solo = [run_loaded(lm, lm.encode(p), preset("autoregressive", max_new_tokens=NEW_TOKENS)).text for p in PROMPTS]
    pages = [_page(browser, url) for _ in PROMPTS]
    for (_, page), prompt in zip(pages, PROMPTS):
        page.get_by_label("Prompt", exact=True).fill(prompt)
        _set_number(page, "hs-max-new", NEW_TOKENS)
        _set_number(page, "hs-baseline", 0)  # no timing pairs: the two generations are the whole load
    # both clicks at once: Playwright's sync pages are driven from one thread, so the second click follows the
    # first by milliseconds, far less than a 40-token generation takes on this model
    for _, page in pages:
        page.get_by_role("button", name="Generate", exact=True).click()
    for _, page in pages:
        page.wait_for_function("() => (document.querySelector('#hs-status')?.innerText || '').includes('Done')")
    finals = [page.locator("#hs-final textarea").input_value() for _, page in pages]
    stats = [page.inner_text("#hs-stats") for _, page in pages]
    for (context, _), final, expected in zip(pages, finals, solo):
        context.close()
        assert final.strip() == expected.strip(), (final, expected)
    # both ran together from their first passes: each page says its calls carried the other's passes too
    assert all("shared with other visitors" in s and "calls carried other visitors' passes" in s for s in stats), stats
