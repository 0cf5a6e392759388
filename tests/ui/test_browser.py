"""The app's page in headless Chromium: generate, coloured tokens, charts, legend, an error.

Needs Debian's chromium and the playwright package (never `playwright install`: no network);
skipped cleanly without them. The app is the same tiny-model app as test_app_integration's.
"""

from __future__ import annotations

import re
import shutil

import pytest

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")

from test_app_integration import serve_tiny_app  # noqa: E402

from ui import labels  # noqa: E402

expect = sync_api.expect  # retries until the page shows it (updates arrive asynchronously)

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
WAIT_MS = 30_000
# the run's legend names its levels (the tiny model's exits), never "the intermediate verifier" (issue 58)
LEGEND_WORDS = ("drafted", "tentative", "rejected by exit", "rejected by full model", "full model's token")


@pytest.fixture(scope="module")
def served():
    with serve_tiny_app() as (url, lm):
        yield url, lm


@pytest.fixture(scope="module")
def app_url(served):
    return served[0]


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser, app_url):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    # not "networkidle": Gradio keeps connections open
    page.goto(app_url, wait_until="domcontentloaded")
    page.wait_for_selector("#hs-tokens")
    yield page
    context.close()


def wait_for_status(page, text: str) -> None:
    page.wait_for_function("(text) => (document.querySelector('#hs-status')?.innerText || '').includes(text)",
                           arg=text)


def test_generate_in_the_browser(page, tmp_path):
    page.get_by_label("Prompt", exact=True).fill("Hey")
    page.get_by_role("button", name="Generate", exact=True).click()
    page.wait_for_selector("#hs-tokens .hs-tok")
    wait_for_status(page, "Done")
    assert page.locator("#hs-tokens .hs-tok").count() > 10
    # coloured: the spans carry a state class that the stylesheet paints
    background = page.locator("#hs-tokens .hs-tok").first.evaluate("el => getComputedStyle(el).backgroundColor")
    assert background not in ("", "rgba(0, 0, 0, 0)", "transparent"), background
    # the acceptance chart was drawn by Plotly, with at least one line
    page.wait_for_selector("#hs-acc-plot .js-plotly-plot svg.main-svg")
    # "attached", not "visible": a line that stays flat (one constant rate) has an empty box
    page.wait_for_selector("#hs-acc-plot .scatterlayer .trace path.js-line", state="attached")
    page.wait_for_selector("#hs-work-plot .js-plotly-plot .barlayer .trace")
    legend = page.inner_text("#hs-legend")
    for word in LEGEND_WORDS:
        assert word in legend, (word, legend)
    assert "intermediate verifier" not in legend, legend
    assert "new tokens" in page.inner_text("#hs-stats")
    shot = tmp_path / "app.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.is_file() and shot.stat().st_size > 20_000


def test_empty_prompt_shows_the_error_in_the_status(page):
    page.get_by_label("Prompt", exact=True).fill("")
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "The prompt is empty")
    assert page.locator("#hs-status .hs-msg-error").count() == 1
    # and the page still generates afterwards
    page.get_by_label("Prompt", exact=True).fill("xyz")
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "Done")
    assert page.locator("#hs-tokens .hs-tok").count() > 10


def test_why_this_speed_follows_the_run_and_the_sliders(page, tmp_path):
    """After a fixed HiSpec run, "Why this speed" shows the run's measured speed against plain
    decoding next to the cost model's estimate and break-even; moving a slider changes the estimate."""
    page.get_by_label("Prompt", exact=True).fill("Hey there")
    page.get_by_label("Fixed (the settings below)").check()
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "Done")
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').includes('break-even')")
    why = page.inner_text("#hs-why")
    assert "this run, measured against plain decoding" in why and "estimated from its plans" in why, why
    assert "at the sliders" in why and "Acceptance, everywhere on this page" in why
    page.wait_for_selector("#hs-why-plot .js-plotly-plot svg.main-svg")
    # the table as drawn for the run (it is redrawn as the run's events settle: read it once it holds a row)
    page.wait_for_function("() => /\\d×/.test(document.querySelector('#hs-why-table')?.innerText || '')")
    before = page.inner_text("#hs-why-table")
    # the slider's number box: type an acceptance the tiny model's raw exits never reach
    box = page.locator("#hs-a-vt input[type=number]")
    box.fill("0.97")
    box.press("Enter")
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').match(/97% exit \\d+ → full model/)")
    # the estimate's table redrawn for the slider (waited for, not read mid-render; a table that never
    # changes fails here after the page's timeout)
    page.wait_for_function("(old) => { const t = document.querySelector('#hs-why-table')?.innerText || '';"
                           " return /\\d×/.test(t) && t !== old; }", arg=before)
    after = page.inner_text("#hs-why-table")
    assert after != before and "97%" in after, after
    shot = tmp_path / "why.png"
    page.locator("#hs-why-box").screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000


def test_an_error_leaves_nothing_of_the_last_run(page):
    page.get_by_label("Prompt", exact=True).fill("Hey")
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "Done")
    expect(page.locator("#hs-final textarea")).not_to_have_value("")
    assert page.locator("#hs-tokens .hs-tok").count() > 0
    page.get_by_label("Prompt", exact=True).fill("")
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "The prompt is empty")
    page.wait_for_function("() => document.querySelectorAll('#hs-tokens .hs-tok').length === 0")
    expect(page.locator("#hs-final textarea")).to_have_value("")
    expect(page.locator("#hs-stats")).not_to_contain_text("new tokens")
    # the explanation is cleared by the event that follows the run's end
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').includes('Generate once')")


def test_the_controls_follow_the_method_and_keep_d_below_v(page):
    verify = page.locator("#hs-verify-layer")
    verify.wait_for(state="visible")  # HiSpec is the default (the page may still be rendering)
    method = page.locator("#hs-method")
    method.get_by_label("Autoregressive").check()
    verify.wait_for(state="hidden")
    expect(page.locator("#hs-draft-layer")).to_be_hidden()
    method.get_by_label("LayerSkip (single exit)").check()
    page.locator("#hs-draft-layer").wait_for(state="visible")
    expect(verify).to_be_hidden()
    expect(page.locator("#hs-draft-layer")).to_contain_text("Exit layer E")
    # picking LayerSkip sets its own exit for this model, the benchmark's (L/4 = 2 of the tiny model's 8)
    expect(page.locator("#hs-draft-layer input[type=number]")).to_have_value("2")
    method.get_by_label("HiSpec", exact=True).check()
    verify.wait_for(state="visible")
    # a draft layer at or above the verifier pushes the verifier up
    v = int(page.input_value("#hs-verify-layer input[type=number]"))
    box = page.locator("#hs-draft-layer input[type=number]")
    box.fill(str(v))
    box.press("Enter")
    box.blur()
    page.wait_for_function("(v) => Number(document.querySelector('#hs-verify-layer input[type=number]').value) > v",
                           arg=v)


def test_a_list_in_the_levels_box_hides_the_exit_sliders_and_names_itself_on_the_strip(page):
    """The exits a list names are the ones that run: the d and v sliders step aside, the depth strip says
    the list; HiSpec's own list brings them back."""
    verify = page.locator("#hs-verify-layer")
    verify.wait_for(state="visible")  # the tiny model offers no 4-bit copy: HiSpec's own list to start
    box = page.locator("#hs-levels input")
    box.fill("lookup,2,5")
    box.press("Enter")
    verify.wait_for(state="hidden")
    expect(page.locator("#hs-draft-layer")).to_be_hidden()
    expect(page.locator("#hs-depth")).to_contain_text("Levels: lookup → exit 2 → exit 5 → full model")
    box.fill(next(iter(labels.LEVELS)))
    box.press("Enter")
    verify.wait_for(state="visible")
    expect(page.locator("#hs-depth")).to_contain_text("draft exit after layer")


def test_the_lengths_sliders_show_for_fixed_rounds_only(page):
    """Seen on the page: under the adaptive policy (the default), draft_len 1 and verify_threshold 1 were shown
    though the policy plans every round's lengths itself; they show once Fixed is picked."""
    lengths = page.locator("#hs-draft-len")
    expect(page.locator("#hs-policy").get_by_label("Adaptive (auto)")).to_be_checked()
    expect(lengths).to_be_hidden()
    expect(page.locator("#hs-verify-threshold")).to_be_hidden()
    page.locator("#hs-policy").get_by_label("Fixed (the settings below)").check()
    lengths.wait_for(state="visible")
    expect(page.locator("#hs-verify-threshold")).to_be_visible()
    page.locator("#hs-policy").get_by_label("Adaptive (auto)").check()
    lengths.wait_for(state="hidden")


def test_the_teaching_preset_lets_drafts_pile_up(page):
    """The paper's N_d 2, N_i 4 one click away from the fastest measured setting, both fixed HiSpec."""
    page.locator("#hs-preset").get_by_label("Teaching (drafts pile up)").check()
    wait_for_status(page, "Teaching")  # the status comes with the settings, in the same update
    expect(page.locator("#hs-draft-len input[type=number]")).to_have_value("2")
    expect(page.locator("#hs-verify-threshold input[type=number]")).to_have_value("4")
    expect(page.locator("#hs-policy").get_by_label("Fixed (the settings below)")).to_be_checked()
    expect(page.locator("#hs-method").get_by_label("HiSpec", exact=True)).to_be_checked()
    page.locator("#hs-preset").get_by_label("Fastest measured").check()
    wait_for_status(page, "Fastest measured")


def generate_fixed(page, prompt: str = "Hey there") -> None:
    """A fixed-rounds HiSpec run (the paper's lengths: drafts pile up), to its end and the views after it."""
    page.locator("#hs-preset").get_by_label("Teaching (drafts pile up)").check()
    wait_for_status(page, "Teaching")
    page.get_by_label("Prompt", exact=True).fill(prompt)
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "Done")
    # the two views that follow the run's end: the sliders take its acceptance, the rounds are replayed
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').includes('break-even')")
    page.wait_for_function("() => (document.querySelector('#hs-step-view')?.innerText || '').includes('Round')")


def test_step_forward_and_back_through_a_finished_run(page, tmp_path):
    generate_fixed(page)
    view = page.locator("#hs-step-view")
    expect(view).to_contain_text("Round 1 of ")  # the first decoding round, replayed from the events
    expect(view).to_contain_text("Draft at exit")
    expect(view).to_contain_text("KV cache length per layer")
    page.locator("#hs-step-next").click()
    expect(view).to_contain_text("Round 2 of ")
    page.locator("#hs-step-next").click()
    expect(view).to_contain_text("Round 3 of ")
    page.locator("#hs-step-prev").click()
    expect(view).to_contain_text("Round 2 of ")
    page.locator("#hs-step-prev").click()
    # each click steps from the round shown: a second click sent before the first one's round is on the
    # page steps from the same round (seen once on a busy host: it stayed at round 1)
    expect(view).to_contain_text("Round 1 of ")
    page.locator("#hs-step-prev").click()
    expect(view).to_contain_text("Prefill")  # round 0: the prompt's own pass
    page.locator("#hs-step-play").click()  # play steps on by itself, a round a second
    # Any round past the prefill: a slow poll may miss round 2 and first see round 3.
    expect(view).to_contain_text(re.compile(r"Round \d+ of "))
    page.locator("#hs-step-play").click()  # pause
    expect(page.locator("#hs-step-play")).to_contain_text("Play")

    def shown_round():
        return re.search(r"Round (\d+) of ", view.inner_text()).group(1)

    # A tick already on its way may still land after the pause; then the round must stay put for
    # two and a half ticks (playing, it would move on every second).
    seen = [shown_round()]
    for _ in range(4):
        page.wait_for_timeout(2500)
        seen.append(shown_round())
        if seen[-1] == seen[-2]:
            break
    assert seen[-1] == seen[-2], f"rounds shown every 2.5 s after Pause: {seen}"
    shot = tmp_path / "step.png"
    page.locator("#hs-step-box").screenshot(path=str(shot))
    assert shot.stat().st_size > 10_000


def test_click_a_token_to_read_its_story(page):
    generate_fixed(page)
    expect(page.locator("#hs-explain-all .hs-explain").first).to_be_attached()
    page.locator("#hs-tokens .hs-verify-rejected, #hs-tokens .hs-target-rejected").first.click()
    story = page.locator("#hs-explain-all .hs-explain:visible")
    expect(story).to_have_count(1)
    expect(story).to_contain_text("Proposed by")
    expect(story).to_contain_text("rejected by")
    expect(page.locator("#hs-explain-all .hs-explain-at:visible")).to_contain_text("Top candidates of each exit")
    expect(page.locator("#hs-explain-all .hs-explain-hint")).to_be_hidden()
    page.locator("#hs-tokens .hs-target-wrote").first.click()  # another token: its story replaces the first
    expect(page.locator("#hs-explain-all .hs-explain:visible")).to_contain_text("written by the full model itself")


def test_open_the_depth_view(page):
    generate_fixed(page)
    page.locator("#hs-beliefs-box").get_by_text("What each exit believes").click()
    grid = page.locator("#hs-beliefs-grid")
    expect(grid).to_be_visible()
    expect(grid).to_contain_text("full model (8 layers)")
    expect(grid).to_contain_text("depth of certainty")
    assert grid.locator("td[title]").count() > 10  # hover: each cell's top candidates


def test_a_what_if_run_is_labelled_synthetic(page):
    generate_fixed(page)
    for slider in ("#hs-a-dv", "#hs-a-vt"):
        box = page.locator(f"{slider} input[type=number]")
        box.fill("0.95")
        box.press("Enter")
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').match(/95% exit \\d+ → full model/)")
    takes = page.locator("#hs-what-if-takes input[type=number]")
    takes.fill("2")
    takes.press("Enter")
    page.locator("#hs-what-if-btn").click()
    page.wait_for_function(
        "() => (document.querySelector('#hs-what-if-status')?.innerText || '').includes('2 of 2 takes done')")
    expect(page.locator("#hs-what-if-stats")).to_contain_text("median of 2 of 2 takes")
    expect(page.locator("#hs-what-if-tokens")).to_contain_text("SYNTHETIC — timing only")
    expect(page.locator("#hs-what-if-tokens")).to_contain_text("not the model's output")
    expect(page.locator("#hs-what-if-stats")).to_contain_text("speed vs plain")
    for row in page.locator("#hs-what-if-table tr td:first-child").all_inner_texts():
        assert row.startswith("SYNTHETIC") or "real" in row, row
    expect(page.locator("#hs-what-if-plot .gtitle")).to_contain_text("SYNTHETIC", timeout=WAIT_MS)
    # the real run's views keep the real figures
    expect(page.locator("#hs-tokens")).not_to_contain_text("SYNTHETIC")
