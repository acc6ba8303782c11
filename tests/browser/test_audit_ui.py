"""The audit in the pages: the batch page lists the findings; a finding opens its first episode with
the cursor on its first token, the uploaded − reference row drawn and the named tokens marked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.browser.browser_util import shot, upload, wait_ready

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "audit"
POS, WHITE, ERROR_RED = [33, 102, 172], [255, 255, 255], [215, 25, 28]


@pytest.fixture(scope="module")
def perturbed(server) -> dict:
    """verl GRPO's own advantages with one policy token of episode 3 (position 5) moved by +0.5:
    nothing matches, and the audit names exactly that token."""
    eps = [json.loads(line) for line in (CORPUS / "clean_grpo.jsonl").read_text().splitlines()]
    assert eps[3]["kinds"][5] == "policy"
    eps[3]["advantages"][5] += 0.5
    return upload(server, "audit-perturbed", eps)


def test_batch_page_lists_findings_and_opens_the_first_token(page, perturbed):
    bid = perturbed["batch_id"]
    slug = perturbed["episodes"][3]["slug"]
    page.goto(f"/b/{bid}")
    page.wait_for_selector('#audit-box[data-ready="1"]')
    assert "No configuration explains these advantages" in page.text_content("#audit-best")
    rows = page.query_selector_all("#audit-findings tbody tr")
    assert [(r.get_attribute("data-code"), r.get_attribute("data-severity")) for r in rows] == [
        ("advantage_not_constant_per_turn", "error")
    ]
    cells = [c.text_content() for c in rows[0].query_selector_all("td")]
    assert cells[0] == "error" and cells[1] == "advantage_not_constant_per_turn"
    assert cells[3:] == ["1", "1"]  # one episode, one token
    shot(page, "audit-batch-findings")

    page.click("a.finding-link")
    page.wait_for_url(f"**/e/{slug}?*")
    wait_ready(page)
    assert "tok=5" in page.url
    assert page.evaluate("window.__strip.cursor") == 5
    cell = page.evaluate("window.__strip.cellAt(5)")
    assert [r["name"] for r in cell["rows"]] == ["uploaded", "audit_reference", "audit_diff"]
    diff = cell["rows"][2]["value"]
    assert diff == pytest.approx(0.5, abs=1e-9)
    # The cursor's line is scrolled into view.
    box = page.evaluate(
        "(() => { const s = document.querySelector('.strip-scroller').getBoundingClientRect();"
        " const c = window.__strip.cellAt(5); return [s.top, s.bottom, c.y]; })()"
    )
    assert box[0] <= box[2] <= box[1]
    # The diff row has its own diverging scale: +0.5 is full blue, a token that agrees is white.
    assert page.evaluate("window.__strip.pixelAt(5, 2)")[:3] == pytest.approx(POS, abs=3)
    assert page.evaluate("window.__strip.pixelAt(6, 2)")[:3] == pytest.approx(WHITE, abs=3)
    # The token the finding names is marked (error red); its neighbour is not.
    assert cell["findings"] == ["advantage_not_constant_per_turn"] and cell["mark"] == "error"
    assert page.evaluate("window.__strip.markPixelAt(5)")[:3] == pytest.approx(ERROR_RED, abs=3)
    assert page.evaluate("window.__strip.markPixelAt(6)")[:3] == pytest.approx(WHITE, abs=3)
    note = page.text_content("#legend-audit")
    assert "uploaded − reference: own scale ±0.500" in note and "audit finding" in note
    shot(page, "audit-episode-diff")
    assert not page.probe.errors and not page.probe.csp_violations()


def test_batch_without_advantages_says_which_field_to_upload(page, server):
    from tests.browser import browser_data as data

    body = upload(server, "audit-none", [data.handbuilt()])
    page.goto(f"/b/{body['batch_id']}")
    page.wait_for_selector('#audit-box[data-ready="1"]')
    text = page.text_content("#audit-best")
    assert text.startswith("Nothing to audit:") and "`advantages`" in text
    assert page.is_hidden("#audit-findings")
