"""A row that cannot run on this episode keeps the last good view and says why."""

from __future__ import annotations

import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot, upload, wait_ready

pytestmark = pytest.mark.browser


def test_inapplicable_row_is_unticked_and_explained(page, server):
    # The hand-built row has no logprobs, so the optimal token baseline cannot run on it.
    slug = upload(server, "row-errors", [data.handbuilt()])["episodes"][0]["slug"]
    page.goto(f"/e/{slug}?scheme=outcome,token_gae&lam=0")
    wait_ready(page)
    before = page.evaluate("window.__strip.pixelAt(1, 1)")
    page.click("#controls details summary")
    page.check('input[name="scheme"][value="optimal_token_baseline"]')
    page.wait_for_selector("#error:not([hidden])")
    message = page.text_content("#error")
    assert "optimal_token_baseline" in message and "logprobs" in message
    wait_ready(page)
    # The view is the last good one: same rows, same colours, the box unticked, the URL unchanged.
    assert not page.is_checked('input[name="scheme"][value="optimal_token_baseline"]')
    assert "scheme=outcome,token_gae&" in page.url
    assert page.evaluate("window.__strip.pixelAt(1, 1)") == before
    shot(page, "episode-row-error")
    # A good change afterwards clears the message.
    page.check('input[name="scheme"][value="turn_gae"]')
    page.wait_for_selector("#error[hidden]", state="attached")
    wait_ready(page)
    assert "scheme=outcome,token_gae,turn_gae&" in page.url
