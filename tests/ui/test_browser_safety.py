"""Model output with HTML, Markdown and escape sequences renders inert in a real browser."""

import shutil

import pytest
from helpers import EOS, EVIL, char_tokenizer, tiny_model
from test_app_integration import GREEDY, serve_tiny_app  # noqa: F401 - GREEDY documents the API order

from hispec.model.early_exit import EarlyExitModel
from hispec.model.loading import LoadedModel
from hispec.text import printable

pytestmark = pytest.mark.browser


class EvilTokenizer:
    """The character tokenizer, except that every token decodes to a hostile string."""

    def __init__(self):
        self.inner = char_tokenizer()
        self.chat_template = self.inner.chat_template
        self.eos_token_id = EOS

    def apply_chat_template(self, *a, **k):
        return self.inner.apply_chat_template(*a, **k)

    def encode(self, *a, **k):
        return self.inner.encode(*a, **k)

    def decode(self, ids, skip_special_tokens=False):
        return "".join(EVIL[i % len(EVIL)] for i in ids)


@pytest.fixture(scope="module")
def page_url():
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed")
    pytest.importorskip("playwright")
    model = tiny_model("llama", layers=8)
    model.generation_config.eos_token_id = EOS
    lm = LoadedModel("tiny", model, EvilTokenizer(), EarlyExitModel(model), "cpu", "float32", 0.0, "evil")
    with serve_tiny_app(lm=lm) as (url, _):
        yield url


def test_hostile_model_text_is_shown_as_text(page_url, tmp_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"),
                                    args=["--headless", "--no-sandbox", "--disable-gpu",
                                          "--disable-background-networking", "--no-first-run"])
        page = browser.new_page()
        dialogs = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(page_url, wait_until="domcontentloaded")
        page.wait_for_selector("#hs-tokens", timeout=60000)
        page.get_by_label("Prompt", exact=True).fill('<script>window.__pwned=9</script><img src=x onerror="window.__pwned=8">')
        page.get_by_role("button", name="Generate").click()
        page.wait_for_function("document.querySelector('#hs-status').innerText.includes('Done')", timeout=60000)
        page.wait_for_timeout(500)
        assert page.evaluate("window.__pwned") is None, "a script from model output or the prompt ran"
        assert dialogs == []
        tokens = page.locator("#hs-tokens")
        assert tokens.locator("script, img, a, b, strong, iframe").count() == 0, "markup was injected"
        text = tokens.inner_text()
        assert "<script>window.__pwned=1</script>" in text or '<img src=x onerror="window.__pwned=2">' in text
        assert "\x1b" not in text
        # the views after the run show the same text: a round's steps, every exit's beliefs, a token's story
        page.wait_for_function("(document.querySelector('#hs-step-view')?.innerText || '').includes('Round 1 of')",
                               timeout=60000)
        page.wait_for_selector("#hs-explain-all .hs-explain", state="attached", timeout=60000)
        page.locator("#hs-beliefs-box").get_by_text("What each exit believes").click()
        page.wait_for_selector("#hs-beliefs-grid", timeout=60000)
        page.locator("#hs-tokens .hs-tok").first.click()
        page.wait_for_selector("#hs-explain-all .hs-explain:visible", timeout=60000)
        page.wait_for_timeout(500)
        assert page.evaluate("window.__pwned") is None, "a script from model output ran in a view after the run"
        assert dialogs == []
        for view in ("#hs-step-view", "#hs-beliefs", "#hs-explain-all"):
            assert page.locator(f"{view} script, {view} img, {view} iframe, {view} a").count() == 0, view
            # which hostile string a view shows depends on the round's plan (a plain round writes one
            # token); whichever it is, it shows as its own text, control characters made visible
            shown = page.locator(view).inner_text()
            assert any(printable(e) in shown for e in EVIL) or view == "#hs-explain-all", (view, shown)
        assert "<script>window.__pwned=" in page.locator("#hs-explain-all .hs-explain:visible").inner_text()
        page.screenshot(path=str(tmp_path / "inert.png"), full_page=True)
        browser.close()
