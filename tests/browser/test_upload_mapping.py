"""The upload page's one click: when no reader fits a file, the 422 proposes a mapping filled from
what the file holds and the page offers it as a button that sends the file again through it; the
answer's warnings are shown under the stored episodes; the episode page says its counts are words
(text, no token ids). Real server, headless Chromium."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

from tests.browser.browser_util import wait_ready

pytestmark = pytest.mark.browser


def test_proposed_mapping_in_one_click(page, tmp_path):
    # The speaker and the text under keys of their own: no message shape the reader knows.
    rows = [
        {
            "utterances": [
                {"speaker_name": "me", "utterance": "what is the weather in Paris today?"},
                {"speaker_name": "bot", "utterance": "it is twenty degrees and sunny."},
                {"speaker_name": "me", "utterance": "thanks"},
            ],
            "eval": {"passed": 1.0},
        }
    ]
    f = tmp_path / "dialogue.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    page.goto("/")
    page.set_input_files("#file", str(f))
    page.click("#upload-btn")
    proposed = page.locator(".proposed-mapping")
    expect(proposed).to_contain_text(
        '{"messages":"utterances","role":"speaker_name","content":"utterance","reward":"eval.passed"}'
    )
    expect(page.locator(".file-error").first).to_contain_text("utterances[].speaker_name: text")
    proposed.locator(".use-mapping").click()
    ok = page.locator(".file-ok")
    expect(ok).to_contain_text("Stored 1 episode")
    expect(ok.locator(".upload-warning")).to_contain_text("role `me` is not in the role table (2 messages)")
    ok.locator("a.episode-link").first.click()
    wait_ready(page)
    expect(page.locator("#ep-meta")).to_contain_text("reward 1")
    # Text split by the offline tokenizer: the page says its counts are words.
    expect(page.locator("#ep-meta")).to_contain_text(" words (")
    expect(page.locator("#word-tokens")).to_be_visible()
    assert not page.probe.errors
