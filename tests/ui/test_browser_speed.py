"""The page's speed answers in headless Chromium: ratios measured against plain decoding that agree
from run to run, the estimate, a what-if run and the measured ratio in one table, an adaptive run
plan by plan, and the page's state following the visitor (Stop, errors, presets, a token's story).

Same set-up as test_browser.py (Debian's chromium, playwright; skipped without them)."""

from __future__ import annotations

import re

import pytest
from test_browser import CHROMIUM, WAIT_MS, browser, page, served, app_url, wait_for_status  # noqa: F401
from test_app_integration import slow_full_model, slowed_layers

from ui.labels import DEFAULT_POLICY_LABEL

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
expect = sync_api.expect
RATIO = re.compile(r"this run, measured against plain decoding[^\n]*?(\d+\.\d\d)× \((\d+\.\d\d)–(\d+\.\d\d)×\)")


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def generate(page, prompt: str, fixed: bool = True, pairs: int = 1, wait_for: str = "against plain decoding") -> None:
    page.get_by_label("Prompt", exact=True).fill(prompt)
    page.get_by_label("Fixed (the settings below)" if fixed else "Adaptive (auto)").check()
    set_number(page, "hs-baseline", pairs)
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "Done")
    page.wait_for_function("(t) => (document.querySelector('#hs-why')?.innerText || '').includes(t)", arg=wait_for)


COUNT_DONE = """() => {
    const status = document.querySelector('#hs-status');
    window.hsDone = 0;
    let was = (status.innerText || '').includes('Done');
    new MutationObserver(() => {
        const now = (status.innerText || '').includes('Done');
        if (now && !was) window.hsDone += 1;
        was = now;
    }).observe(status, {childList: true, subtree: true, characterData: true});
}"""


def slow_layers(lm, full_pass_s: float):
    """Every layer costs the same, as in a real model: a pass over layers [a, b) sleeps
    full_pass_s * (b - a) / L first. (slow_full_model sleeps once for any pass that reaches the last
    layer, whatever its length: a cost the engine's per-layer cost model cannot learn, so its plans,
    and the ratio, moved from run to run.)"""
    return slowed_layers(lm, lambda start, end: full_pass_s * max(0, end - start) / lm.ee.num_layers)


def default_run(page, lm) -> tuple[int, tuple[float, float, float]]:
    """The page's default run with three pairs on the slowed model: (Dones seen, (median, low, high))."""
    page.get_by_label("Prompt", exact=True).fill("Hey there")
    page.get_by_label(DEFAULT_POLICY_LABEL).check()  # the page's default run (issue 37: "the default")
    set_number(page, "hs-baseline", 3)
    page.evaluate("() => { window.hsDone = 0; }")
    # 0.2 s a full pass, 32 tokens a run (set by the test): at 0.12 s, one CI-like try (the other worker's
    # tests beside it) read medians 1.18, 0.98 and 1.02x, as the tiny model's own Python, which a loaded
    # host stretches, was a larger share of a pass; at 0.25 s and 16 tokens CI once read 0.94, 0.84 and
    # 1.03x, most likely as one adaptive round that drafted in vain is a sixteenth of a run. 32 tokens halve that
    # share (CI-like tries: 0.98, 0.98, 0.97 and 0.97, 0.98, 0.96, where 16 tokens read 0.96, 0.99, 1.03).
    with slow_layers(lm, 0.2):
        page.get_by_role("button", name="Generate", exact=True).click()
        # this run's own Done (the last run's is still on the page when the click is sent)
        page.wait_for_function("() => window.hsDone >= 1")
        page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '')"
                               ".includes('against plain decoding')")  # emptied by the click
    page.wait_for_timeout(1000)  # a late second "Done" would be counted here
    text = page.inner_text("#hs-why-table")
    match = RATIO.search(text)
    assert match, text
    return page.evaluate("() => window.hsDone"), tuple(float(x) for x in match.groups())


def test_three_identical_runs_under_load_agree_and_say_done_once(page, served):
    """The ratio is measured (pairs of runs against plain decoding), not a cost-model denominator: three
    identical runs of the page's default (its default policy, three pairs each), with another process
    keeping a core busy throughout, state medians that lie inside each other's ranges; the status says
    Done exactly once per run. The layers are made the expensive part, as in a real model (the tiny
    one's runs are a few ms of Python)."""
    from hispec.evaluation.host import busy_cores

    found, done = [], []
    set_number(page, "hs-max-new", 32)
    page.evaluate(COUNT_DONE)
    with busy_cores(1):
        # One run first, not counted: the cost model the policy plans with is refined by every pass of
        # every run (engine.planning.costs), so the first run after the slowdown starts plans with the costs of
        # the unslowed model; a server in use plans with costs already learned.
        default_run(page, served[1])
        for _ in range(3):
            n, ratio = default_run(page, served[1])
            done.append(n)
            found.append(ratio)
    assert done == [1, 1, 1], done
    print("three default runs (median, low, high):", found)
    for median, _, _ in found:
        assert all(low <= median <= high for _, low, high in found), found


def test_the_estimate_a_what_if_and_the_measured_ratio_sit_in_one_table(page):
    generate(page, "Hey there", pairs=1)
    # the what-if names the list it will run: the run's own (issue 49: it ran another hierarchy, unnamed)
    expect(page.locator("#hs-what-if-levels")).to_contain_text("What if runs the plan the sliders vary, on this run's "
                                                                "own levels: exit ")
    expect(page.locator("#hs-what-if-levels")).to_contain_text("fixed")
    for slider in ("hs-a-dv", "hs-a-vt"):
        set_number(page, slider, 0.9)
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').match(/90% exit \\d+ → full model/)")
    set_number(page, "hs-what-if-takes", 1)
    page.locator("#hs-what-if-btn").click()
    page.wait_for_function(
        "() => (document.querySelector('#hs-what-if-status')?.innerText || '').includes('1 of 1 takes done')")
    table = page.locator("#hs-why-table")
    expect(table).to_contain_text("what-if run at the sliders", timeout=WAIT_MS)
    text = table.inner_text()
    rows = [r for r in text.splitlines() if r.strip()]
    kinds = [r.rsplit("\t", 1)[-1] for r in rows[1:] if "\t" in r]
    assert "this run, measured against plain decoding" in text and "estimated from its plans" in text
    assert "at the sliders" in text and "measured, SYNTHETIC verdicts" in kinds and "estimate" in kinds, rows


def test_an_adaptive_run_is_explained_plan_by_plan_lookup_included(page):
    page.get_by_label("Use the chat template").uncheck()
    generate(page, "abcabcabcabcabcabcabcabcabcabc", fixed=False, pairs=1)
    plans = page.locator("#hs-why-plans")
    expect(plans).to_contain_text("lookup")
    stats = page.inner_text("#hs-stats")
    assert "adaptive plans (rounds)" in stats and "lookup → full model" in stats
    assert "->" not in stats + plans.inner_text()  # the page's names of plans, never the engine's
    assert "share of the time" in plans.inner_text() and "break-even acceptance" in plans.inner_text()
    # HiSpec's own adaptive list (lookup under two exits): the what-if runs the plan the sliders vary, named
    expect(page.locator("#hs-what-if-levels")).to_contain_text("What if runs the plan the sliders vary")
    expect(page.locator("#hs-what-if-levels")).to_contain_text("→ the full model, fixed (")


def test_stop_ends_on_how_many_tokens_were_kept(page, served):
    _, lm = served
    with slow_full_model(lm, 0.03):
        page.get_by_label("Prompt", exact=True).fill("Yo")
        set_number(page, "hs-baseline", 2)
        page.get_by_role("button", name="Generate", exact=True).click()
        page.wait_for_function("() => document.querySelectorAll('#hs-tokens .hs-tok').length > 3")
        # while it runs, Generate waits for it, and the views below say the run is coming (not "Generate once")
        expect(page.locator("#hs-generate")).to_be_disabled()
        assert "Generate once" not in page.inner_text("#hs-why") + page.inner_text("#hs-step-view")
        page.get_by_role("button", name="Stop", exact=True).click()
        wait_for_status(page, "Stopped after")
    assert re.search(r"Stopped after \d+ tokens?\.", page.inner_text("#hs-status"))
    # the run's last word stands alone: the Stop's "Stopping…" reply goes with the run's end (issue 49)
    page.wait_for_function("() => (document.querySelector('#hs-stop-note')?.innerText || '') === ''")
    page.wait_for_timeout(1500)  # nothing overwrites the status afterwards
    assert "Stopped after" in page.inner_text("#hs-status")
    expect(page.locator("#hs-generate")).to_be_enabled()
    # the pairs were asked for: the Why says the run was stopped before them, not "set pairs above 0"
    # (drawn after the run's end, once the model's pass costs are fetched in its turn: slow on a loaded CI host)
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').includes('stopped before its')",
                           timeout=WAIT_MS * 4)
    assert "above 0" not in page.inner_text("#hs-why")
    # a Stop after the end leaves the run's last word and says that nothing was running
    page.get_by_role("button", name="Stop", exact=True).click()
    page.wait_for_function("() => (document.querySelector('#hs-stop-note')?.innerText || '').includes('Nothing to stop')")
    assert "Stopped after" in page.inner_text("#hs-status")


def test_an_error_clears_the_panels_of_the_last_run(page):
    generate(page, "Hey there", pairs=1)
    page.get_by_role("button", name="Compare with baseline").click()
    page.wait_for_function("() => (document.querySelector('#hs-compare-status')?.innerText || '')"
                           ".includes('Comparison done')")
    expect(page.locator("#hs-compare")).to_contain_text("vs plain decoding")
    page.get_by_label("Prompt", exact=True).fill("")
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_status(page, "The prompt is empty")
    expect(page.locator("#hs-compare")).to_have_text("")
    page.wait_for_function("() => (document.querySelector('#hs-why')?.innerText || '').includes('Generate once')")
    expect(page.locator("#hs-step-view")).to_contain_text("Generate once")


def test_a_preset_turns_custom_once_a_setting_it_set_changes(page):
    preset = page.locator("#hs-preset")
    preset.get_by_label("Teaching (drafts pile up)").check()
    wait_for_status(page, "Teaching")
    set_number(page, "hs-draft-len", 3)
    expect(preset.get_by_label("Custom (your own settings)")).to_be_checked()
    preset.get_by_label("Teaching (drafts pile up)").check()
    expect(page.locator("#hs-draft-len input[type=number]")).to_have_value("2")


def test_the_story_of_a_token_replaced_twice(page):
    page.locator("#hs-preset").get_by_label("Teaching (drafts pile up)").check()
    wait_for_status(page, "Teaching")
    generate(page, "Hey there", pairs=0, wait_for="not measured")
    expect(page.locator("#hs-explain-all .hs-explain").first).to_be_attached()
    # a verifier's token that the full model then rejected: its position saw a draft, it, and the fix
    serial = page.evaluate("""() => {
        for (const b of document.querySelectorAll('#hs-explain-all .hs-explain')) {
            const chain = b.querySelector('.hs-chain');
            if (chain && chain.children.length >= 3 && b.innerText.includes('written by the intermediate verifier')
                && b.innerText.includes('rejected by the full model')) return b.getAttribute('data-s');
        }
        return null; }""")
    assert serial, "no position where the verifier's token was rejected in turn"
    page.locator(f"#hs-tokens .hs-tok[data-s='{serial}']").click()
    story = page.locator("#hs-explain-all .hs-explain:visible")
    expect(story).to_contain_text("Everything that happened at token")
    text = story.inner_text()
    assert "drafted by the draft exit" in text and "written by the full model" in text, text
    assert text.index("drafted by") < text.index("written by the intermediate verifier") < text.rindex(
        "written by the full model"), text


def test_on_a_narrow_screen_the_settings_come_before_the_results(browser, app_url):
    for width, narrow in ((390, True), (1280, False)):
        context = browser.new_context(viewport={"width": width, "height": 844})
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.goto(app_url, wait_until="domcontentloaded")
        page.wait_for_selector("#hs-tokens")
        generate_btn = page.locator("#hs-generate").bounding_box()
        settings = page.locator("#hs-settings-col").bounding_box()
        tokens = page.locator("#hs-tokens").bounding_box()
        if narrow:  # stacked: Generate, then the settings, then the results
            assert generate_btn["y"] < settings["y"] < tokens["y"], (generate_btn, settings, tokens)
        else:  # side by side: the results on the left, the settings on the right
            assert settings["x"] > tokens["x"] and abs(settings["y"] - tokens["y"]) < 400, (settings, tokens)
        context.close()
