"""Take the pages' screenshots of the running app in headless Chromium, and keep what they show.

    python app.py &                # the default model, http://127.0.0.1:7860
    python scripts/docs/screenshots.py [--url URL] [--out assets] [--json assets/walkthrough.json]
    python scripts/docs/screenshots.py --default-only --out assets    # the README's picture only
    python scripts/docs/screenshots.py --lessons-only --out assets    # a lesson: race, lanes, positions

Needs Debian's chromium and the playwright package (scripts/setup.sh --dev). It clicks as a student
would: the teaching preset and three pairs of runs against plain decoding, one prompt, the token
whose position saw the most happen, the next round, the depth view, "Why this speed", a what-if run
at 90% acceptance (three takes), then an adaptive run on a prompt to copy. Every image is written
under --out; the text each view showed (status, stats, the story, the round, the Why tables, the
what-if result, the machine) goes to --json, which is what the README's walkthrough quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import time
from pathlib import Path

PROMPT = "Explain in two sentences why the sky is blue."
COPY_PROMPT = ("Copy this sentence word for word: Speculative decoding lets a cheap drafter propose tokens that "
               "the expensive target model then verifies in one batched pass.")
LESSON = "The default on an explanation: the 4-bit model drafts most tokens"  # assets/lessons/2-default-sky
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
# The token whose story shows the longest chain: a draft rejected, a verifier's token rejected, the fix.
LONGEST_CHAIN = """() => {
    let best = null, most = 0;
    for (const b of document.querySelectorAll('#hs-explain-all .hs-explain')) {
        const chain = b.querySelector('.hs-chain');
        const n = chain ? chain.children.length : 0;
        if (n > most) { most = n; best = b.getAttribute('data-s'); }
    }
    return best; }"""


def machine() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
        name = next(ln.split(":", 1)[1].strip() for ln in info.splitlines() if ln.startswith("model name"))
        return f"{name}{' (AVX-512)' if 'avx512f' in info else ' (no AVX-512)'}, {os.cpu_count()} cores"
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def set_number(page, elem_id: str, value) -> None:
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def wait_for_text(page, selector: str, text: str) -> None:
    page.wait_for_function("([s, t]) => (document.querySelector(s)?.innerText || '').includes(t)", arg=[selector, text])


def teaching_run(page, out: Path, seen: dict) -> None:
    page.locator("#hs-preset").get_by_label("Teaching (drafts pile up)").check()
    wait_for_text(page, "#hs-status", "Teaching")
    set_number(page, "hs-baseline", 3)
    page.get_by_label("Prompt", exact=True).fill(PROMPT)
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_text(page, "#hs-why", "against plain decoding")
    wait_for_text(page, "#hs-stats", "speed vs plain decoding, measured")
    page.locator("#hs-explain-all .hs-explain").first.wait_for(state="attached")
    time.sleep(2)  # the charts' last redraw
    page.screenshot(path=str(out / "screenshot.png"))  # the top of the page, as a visitor sees it
    seen["status"], seen["stats"] = page.inner_text("#hs-status"), page.inner_text("#hs-stats")
    serial = page.evaluate(LONGEST_CHAIN) or page.locator("#hs-tokens .hs-verify-rejected").first.get_attribute("data-s")
    page.locator(f"#hs-tokens .hs-tok[data-s='{serial}']").click()
    time.sleep(1)
    seen["story"] = page.locator("#hs-explain-all .hs-explain:visible").inner_text()
    page.locator("#hs-explain-all").screenshot(path=str(out / "screenshot_story.png"))
    page.locator("#hs-step-next").click()
    wait_for_text(page, "#hs-step-view", "Round 2 of")
    seen["round_2"] = page.inner_text("#hs-step-view")
    page.locator("#hs-step-box").screenshot(path=str(out / "screenshot_step.png"))
    page.locator("#hs-beliefs-box").get_by_text("What each exit believes").click()
    page.locator("#hs-beliefs-grid").wait_for()
    page.locator("#hs-beliefs-box").screenshot(path=str(out / "screenshot_beliefs.png"))
    page.locator("#hs-why-plot .js-plotly-plot").wait_for()
    time.sleep(1)
    seen["why_plans"], seen["why_table"] = page.inner_text("#hs-why-plans"), page.inner_text("#hs-why-table")
    page.locator("#hs-why-box").screenshot(path=str(out / "screenshot_why.png"))


def what_if(page, out: Path, seen: dict, acceptance: float) -> None:
    for slider in ("hs-a-dv", "hs-a-vt"):
        set_number(page, slider, acceptance)
    wait_for_text(page, "#hs-why", f"{acceptance:.0%} → full")
    set_number(page, "hs-what-if-takes", 3)
    page.locator("#hs-what-if-btn").click()
    wait_for_text(page, "#hs-what-if-status", "takes done")
    wait_for_text(page, "#hs-why-table", "what-if run at the sliders")
    time.sleep(2)
    seen["what_if_status"], seen["what_if_stats"] = page.inner_text("#hs-what-if-status"), page.inner_text(
        "#hs-what-if-stats")
    seen["why_table_with_what_if"] = page.inner_text("#hs-why-table")
    page.locator("#hs-why-box").screenshot(path=str(out / "screenshot_whatif.png"))


def default_run(page, out: Path, seen: dict) -> None:
    """The page as it opens, run as it is (the default: lookup -> the 4-bit model -> the exact model, the
    adaptive policy, its pairs against plain decoding): the README's one picture, screenshot_default.png."""
    page.get_by_label("Prompt", exact=True).fill(PROMPT)
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_text(page, "#hs-status", "Done")
    wait_for_text(page, "#hs-stats", "speed vs plain decoding, measured")  # after the pairs
    time.sleep(2)  # the charts' last redraw
    page.screenshot(path=str(out / "screenshot_default.png"))
    seen["default_status"], seen["default_stats"] = page.inner_text("#hs-status"), page.inner_text("#hs-stats")


def adaptive_run(page, out: Path, seen: dict) -> None:
    """The adaptive policy on a prompt that repeats its input: lookup copies show in purple."""
    page.locator("#hs-method").get_by_label("HiSpec", exact=True).check()
    page.locator("#hs-policy").get_by_label("Adaptive (auto)").check()
    set_number(page, "hs-baseline", 3)
    page.get_by_label("Prompt", exact=True).fill(COPY_PROMPT)
    page.get_by_role("button", name="Generate", exact=True).click()
    wait_for_text(page, "#hs-status", "Generat")  # this run's own status, not the last run's "Done"
    wait_for_text(page, "#hs-status", "Done")  # its last update, after the pairs
    wait_for_text(page, "#hs-why", "against plain decoding")
    time.sleep(2)
    scrolled = page.evaluate("window.scrollY")  # boxes are in the viewport, the clip in the page
    top = page.locator("#hs-status").bounding_box()
    bottom = page.locator("#hs-stats").bounding_box()
    page.screenshot(path=str(out / "screenshot_auto.png"), full_page=True,
                    clip={"x": 0, "y": scrolled + top["y"] - 10, "width": 1400,
                          "height": bottom["y"] + bottom["height"] - top["y"] + 20})
    seen["auto_stats"], seen["auto_plans"] = page.inner_text("#hs-stats"), page.inner_text("#hs-why-plans")
    seen["auto_why_table"] = page.inner_text("#hs-why-table")
    page.locator("#hs-why-plans").screenshot(path=str(out / "screenshot_plans.png"))


def lesson_run(page, out: Path, seen: dict) -> None:
    """A lesson replayed (no model time): the lesson's row and its tokens, the race against plain decoding, its
    passes by level on the run's clock, and acceptance by position in the block, from the shipped recording of the
    default run on an explanation."""
    page.locator("#hs-lesson input").click()
    page.get_by_role("option", name=LESSON).click()
    page.get_by_role("button", name="Replay the lesson").click()
    wait_for_text(page, "#hs-status", "Lesson replayed")
    wait_for_text(page, "#hs-why", "A recorded run, replayed")
    page.wait_for_selector("#hs-race-plot .js-plotly-plot svg.main-svg")
    page.wait_for_selector("#hs-lanes-plot .js-plotly-plot svg.main-svg")
    page.wait_for_selector("#hs-position-plot .js-plotly-plot svg.main-svg")
    time.sleep(2)  # the charts' last redraw
    scrolled = page.evaluate("window.scrollY")
    top = page.locator("#hs-lesson-row").bounding_box()
    bottom = page.locator("#hs-tokens").bounding_box()
    page.screenshot(path=str(out / "screenshot_lesson.png"), full_page=True,
                    clip={"x": 0, "y": scrolled + top["y"] - 10, "width": 1400,
                          "height": bottom["y"] + bottom["height"] - top["y"] + 20})
    page.locator("#hs-race-plot").screenshot(path=str(out / "screenshot_race.png"))
    # the lanes' chart with its caption under it (the shot above scrolled the page: boxes are in the viewport)
    scrolled = page.evaluate("window.scrollY")
    lanes, note = page.locator("#hs-lanes-plot").bounding_box(), page.locator("#hs-lanes-note").bounding_box()
    page.screenshot(path=str(out / "screenshot_lanes.png"), full_page=True,
                    clip={"x": lanes["x"], "y": scrolled + lanes["y"], "width": lanes["width"],
                          "height": note["y"] + note["height"] - lanes["y"] + 10})
    page.locator("#hs-position-plot").screenshot(path=str(out / "screenshot_positions.png"))
    seen["lesson_status"], seen["lesson_note"] = page.inner_text("#hs-status"), page.inner_text("#hs-position-note")
    seen["lesson_lanes_note"] = page.inner_text("#hs-lanes-note")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:7860/", help="the running app (default: %(default)s)")
    parser.add_argument("--out", default="assets", type=Path, help="folder for the PNGs (default: %(default)s)")
    parser.add_argument("--json", default=None, type=Path, help="write what each view showed here")
    parser.add_argument("--what-if", type=float, default=0.9, help="acceptance of the what-if run (default: 0.9)")
    parser.add_argument("--default-only", action="store_true",
                        help="only the README's picture: the page's default run (screenshot_default.png)")
    parser.add_argument("--lessons-only", action="store_true",
                        help="only a lesson replayed: screenshot_lesson.png, _race.png, _lanes.png and "
                             "_positions.png")
    args = parser.parse_args()
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium on PATH: install Debian's chromium (scripts/setup.sh --dev does)")
    expect.set_options(timeout=600_000)
    args.out.mkdir(parents=True, exist_ok=True)
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from hispec.evaluation.record import code_version

    seen = {"command": "python scripts/docs/screenshots.py " + " ".join(os.sys.argv[1:]), "code": code_version(),
            "machine": machine(),
            "prompt": PROMPT, "copy_prompt": COPY_PROMPT}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(600_000)
        page.goto(args.url, wait_until="domcontentloaded")
        page.wait_for_selector("#hs-tokens")
        if args.default_only:
            default_run(page, args.out, seen)
        elif args.lessons_only:
            lesson_run(page, args.out, seen)
        else:
            teaching_run(page, args.out, seen)
            what_if(page, args.out, seen, args.what_if)
            adaptive_run(page, args.out, seen)
        browser.close()
    if args.json:
        args.json.write_text(json.dumps(seen, indent=1, ensure_ascii=False) + "\n")
    print(f"screenshots written to {args.out}/" + (f", what they showed to {args.json}" if args.json else ""))


if __name__ == "__main__":
    main()
