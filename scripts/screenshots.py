"""Take the README's screenshots of the running app in headless Chromium.

    python app.py &                # the default model, http://127.0.0.1:7860
    python scripts/screenshots.py [--url URL] [--out assets]

Needs Debian's chromium and the playwright package (scripts/setup.sh --dev). It clicks as a
visitor would: the teaching preset, one prompt, a token, the next round, the depth view, "Why this
speed", a what-if run at 90% acceptance, then an adaptive run on a prompt to copy; every
image is written under --out.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

PROMPT = "Explain in two sentences why the sky is blue."
COPY_PROMPT = ("Copy this sentence word for word: Speculative decoding lets a cheap drafter propose tokens that "
               "the expensive target model then verifies in one batched pass.")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:7860/", help="the running app (default: %(default)s)")
    parser.add_argument("--out", default="assets", type=Path, help="folder for the PNGs (default: %(default)s)")
    parser.add_argument("--what-if", type=float, default=0.9, help="acceptance of the what-if run (default: 0.9)")
    args = parser.parse_args()
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium")
    if chromium is None:
        raise SystemExit("no chromium on PATH: install Debian's chromium (scripts/setup.sh --dev does)")
    expect.set_options(timeout=300_000)
    args.out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(300_000)
        page.goto(args.url, wait_until="domcontentloaded")
        page.wait_for_selector("#hs-tokens")
        page.locator("#hs-preset").get_by_label("Teaching (drafts pile up)").check()
        expect(page.locator("#hs-status")).to_contain_text("Teaching")
        page.get_by_label("Prompt", exact=True).fill(PROMPT)
        page.get_by_role("button", name="Generate", exact=True).click()
        expect(page.locator("#hs-status")).to_contain_text("Done")
        expect(page.locator("#hs-explain-all .hs-explain").first).to_be_attached()
        time.sleep(2)  # the charts' last redraw
        page.screenshot(path=str(args.out / "screenshot.png"))  # the top of the page, as a visitor sees it
        page.locator("#hs-tokens .hs-verify-rejected").first.click()
        time.sleep(1)
        page.locator("#hs-explain-all").screenshot(path=str(args.out / "screenshot_story.png"))
        page.locator("#hs-step-next").click()
        expect(page.locator("#hs-step-view")).to_contain_text("Round 2 of")
        page.locator("#hs-step-box").screenshot(path=str(args.out / "screenshot_step.png"))
        page.locator("#hs-beliefs-box").get_by_text("What each exit believes").click()
        expect(page.locator("#hs-beliefs-grid")).to_be_visible()
        page.locator("#hs-beliefs-box").screenshot(path=str(args.out / "screenshot_beliefs.png"))
        page.locator("#hs-why-plot .js-plotly-plot").wait_for()
        time.sleep(1)
        page.locator("#hs-why-box").screenshot(path=str(args.out / "screenshot_why.png"))
        for slider in ("#hs-a-dv", "#hs-a-vt"):
            box = page.locator(f"{slider} input[type=number]")
            box.fill(str(args.what_if))
            box.press("Enter")
        page.locator("#hs-what-if-btn").click()
        expect(page.locator("#hs-what-if-status")).to_contain_text("Done")
        time.sleep(2)
        page.locator("#hs-what-if-box").screenshot(path=str(args.out / "screenshot_whatif.png"))
        # The adaptive policy on a prompt that repeats its input: lookup copies show in purple.
        page.locator("#hs-method").get_by_label("HiSpec", exact=True).check()
        page.locator("#hs-policy").get_by_label("Adaptive (auto)").check()
        page.get_by_label("Prompt", exact=True).fill(COPY_PROMPT)
        page.get_by_role("button", name="Generate", exact=True).click()
        expect(page.locator("#hs-status")).to_contain_text("Done")
        expect(page.locator("#hs-stats")).to_contain_text("adaptive plans")
        expect(page.locator("#hs-explain-all .hs-explain").first).to_be_attached()
        time.sleep(2)
        scrolled = page.evaluate("window.scrollY")  # boxes are in the viewport, the clip in the page
        top = page.locator("#hs-status").bounding_box()
        bottom = page.locator("#hs-stats").bounding_box()
        page.screenshot(path=str(args.out / "screenshot_auto.png"), full_page=True,
                        clip={"x": 0, "y": scrolled + top["y"] - 10, "width": 1400,
                              "height": bottom["y"] + bottom["height"] - top["y"] + 20})
        browser.close()
    print(f"screenshots written to {args.out}/")


if __name__ == "__main__":
    main()
