"""The page at GET / in a real browser: Playwright drives the system's Chromium (Debian's
`chromium`, installed by .ci/run; Playwright downloads no browser), types a prompt, clicks Send
and sees the streamed answer appear; then a prompt outside the vocabulary shows the server's
error on the page."""

from __future__ import annotations

import os

import httpx
import pytest
from test_openai_server import TINY_LM, TOKENIZER, Chars, Served, quick_build

from pax_eqx.serving.backends import LanguageModelBackend

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]  # fmt: skip

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM) and not os.environ.get("CI"),
    reason=f"no {CHROMIUM}: apt-get install chromium (.ci/run does; in CI the test runs)",
)


@pytest.fixture(scope="module")
def served():
    s = Served(LanguageModelBackend(quick_build(TINY_LM, 0), TOKENIZER, slots=8, chunk=8, max_waiting=128))
    yield s
    s.close()


def test_the_page_streams_an_answer_in_chromium(served):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page()
            page.goto(served.url + "/")
            expect(page.locator("#model")).to_have_text("tiny")
            page.fill("#prompt", "the cat")
            page.fill("#max_tokens", "12")
            page.fill("#temperature", "0")
            page.click("#send")
            expect(page.locator("#status")).to_have_text("finished: length", timeout=20_000)
            answer = page.locator("#output").inner_text()
            assert len(answer) > 0 and set(answer) <= set(Chars.ALPHABET)
            assert page.locator("#prompt-echo").inner_text() == "the cat"
            body = {"prompt": "the cat", "max_tokens": 12, "temperature": 0}
            assert answer == httpx.post(served.url + "/v1/completions", json=body).json()["choices"][0]["text"]

            page.fill("#prompt", "THE CAT")  # capitals are outside the vocabulary
            page.click("#send")
            expect(page.locator("#status")).to_contain_text("outside the vocabulary", timeout=20_000)
            assert "error" in page.locator("#status").get_attribute("class")
        finally:
            browser.close()
