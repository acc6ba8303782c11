"""Talk mode keys, batch and group pages, JSON twins and security headers, against the real server."""

from __future__ import annotations

import re

import httpx
import pytest
from playwright.sync_api import expect

from tests.browser import browser_data as data
from tests.browser.browser_util import shot, upload, wait_ready

pytestmark = pytest.mark.browser


@pytest.mark.usefixtures("demo")
def test_talk_mode_keys_step_through_shareable_urls(page):
    page.goto("/talk")
    assert page.url.endswith("/talk/1")
    page.wait_for_selector('body[data-ready="1"]')
    page.keyboard.press("ArrowRight")
    page.wait_for_url(re.compile(r"/talk/2$"))
    wait_ready(page)
    # Step 2: returns-to-go on the hand-built row, γ = 1: the first call's return is
    # −0.1 − 0.1 + 0.9 = 0.7 (the hand-built row), the last call's 0.9.
    assert page.evaluate("window.__strip.cellAt(0).rows[0].value") == pytest.approx(0.7)
    assert page.evaluate("window.__strip.cellAt(9).rows[0].value") == pytest.approx(0.9)
    shot(page, "talk-2")
    page.keyboard.press("PageDown")
    page.wait_for_url(re.compile(r"/talk/3$"))
    wait_ready(page)
    # γ = 0.9: position 1 = −0.1 + 0.9 × 0.639 = 0.4751 (0.639 = −0.1 + 0.9 × 0.81, position 5).
    assert page.evaluate("window.__strip.cellAt(1).rows[0].value") == pytest.approx(0.4751, abs=1e-4)
    page.keyboard.press(" ")
    page.wait_for_url(re.compile(r"/talk/4$"))
    wait_ready(page)
    # The tool-span bug: masked TD 0.1 vs naive 8.5 at position 1 and 8.2 at position 6.
    naive = page.text_content("#naive-box")
    assert "masked 0.10, naive 8.50" in naive and "naive 8.20" in naive
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["td", "naive"]
    shot(page, "talk-4-naive-gae")
    page.keyboard.press("ArrowLeft")
    page.wait_for_url(re.compile(r"/talk/3$"))
    page.keyboard.press("PageUp")
    page.wait_for_url(re.compile(r"/talk/2$"))
    page.keyboard.press("End")
    page.wait_for_url(re.compile(r"/talk/10$"))
    page.keyboard.press("Home")
    page.wait_for_url(re.compile(r"/talk/1$"))
    assert page.probe.dialogs == [] and not page.probe.errors


@pytest.mark.usefixtures("demo")
def test_talk_group_and_batch_steps_use_the_demo_batch(page):
    page.goto("/talk/5")
    page.wait_for_selector('body[data-ready="1"]')
    # The mixed group with the fewest successes: parse_date, 1 of 8.
    assert "parse_date" in page.text_content("#talk-view")
    rloo = page.locator('tr[data-baseline="rloo"] td').all_text_contents()
    # RLOO, G = 8, one success: 1 − 0/7 = 1 for it, 0 − 1/7 = −0.143 for the others.
    assert rloo[0] == "1.000" and rloo[1:] == ["-0.143"] * 7
    shot(page, "talk-5-group")
    page.goto("/talk/6")
    page.wait_for_selector('body[data-ready="1"]')
    # limit is never solved: 8 of 32 episodes = 25% in zero-variance groups.
    assert "25% of episodes in zero-variance groups (1 of 4 groups)" in page.text_content("#talk-view")
    shot(page, "talk-6-zero-variance")


def test_batch_page_diagnostics_and_group_page(page, demo):
    bid = demo["bugfix"]["batch_id"]
    page.goto(f"/b/{bid}")
    page.wait_for_selector('body[data-ready="1"]')
    cards = page.text_content("#cards")
    assert "25%" in cards and "1 of 4 groups" in cards
    assert "limit" in page.text_content("#zv-banner")
    assert page.locator("#episodes tbody tr").count() == 32
    page.fill("#ep-filter", "clamp")
    assert page.locator("#episodes tbody tr").count() == 8
    assert "q=clamp" in page.url
    shot(page, "batch")

    # Follow the link by its href (a click can miss while Plotly's responsive figures resize).
    href = page.get_attribute("#groups a >> text=limit", "href")
    assert href == f"/b/{bid}/g/limit"
    page.goto(href)
    page.wait_for_selector('body[data-ready="1"]')
    why = page.text_content("#zv-why")
    assert "All 8 attempts scored 0" in why and "no gradient" in why
    assert "8 attempts · 0 passed" in page.text_content("#g-meta")  # the API's `passed`
    assert page.locator('tr[data-baseline="grpo"] td').all_text_contents() == ["0"] * 8
    shot(page, "group-zero-variance")
    assert not page.probe.errors and not page.probe.csp_violations()


def test_json_twins_and_security_headers(server, demo):
    slug = demo["handbuilt"]["episodes"][0]["slug"]
    with httpx.Client(base_url=server) as c:
        r = c.get(f"/e/{slug}", params={"lam": "0", "scheme": "td,bogus", "format": "json"})
        assert r.status_code == 200
        body = r.json()
        assert body["view"]["lam"] == 0.0 and body["view"]["schemes"] == ["td"]
        # The masked TD error at position 1 is −0.1 + 0.6 − 0.4 = 0.1.
        assert body["data"]["schemes"][0]["advantages"][1] == pytest.approx(0.1)
        same = c.get(f"/e/{slug}?scheme=td&lam=0", headers={"accept": "application/json"}).json()
        assert same["data"] == body["data"]
        assert c.get("/e/no-such-episode?format=json").json()["error"]["status"] == 404
        assert c.get("/e/no-such-episode").status_code == 404
        assert c.get("/b/987654").status_code == 404
        b = c.get(f"/b/{demo['bugfix']['batch_id']}?format=json").json()
        assert b["data"]["diagnostics"]["zero_variance_share"] == pytest.approx(0.25)
        g = c.get(f"/b/{demo['bugfix']['batch_id']}/g/limit", params={"format": "json"}).json()
        assert g["data"]["zero_variance"] is True
        t = c.get("/talk/4?format=json").json()
        assert t["title"] == "The naive-GAE tool-span bug" and t["next"] == "/talk/5"
        assert c.get("/talk/99?format=json").status_code == 404
        home = c.get("/?q=bugfix&format=json").json()
        assert [x["name"] for x in home["data"]] == ["bugfix"]

        html = c.get(f"/e/{slug}")
        csp = html.headers["content-security-policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-eval" not in csp
        assert html.headers["x-content-type-options"] == "nosniff"
        assert html.headers["x-frame-options"] == "DENY"
        # No inline scripts: every <script> is external or inert JSON.
        for tag in re.findall(r"<script[^>]*>", html.text):
            assert "src=" in tag or 'type="application/json"' in tag, tag
        assert "<script>" not in html.text


def test_upload_errors_are_shown_next_to_the_file(page, tmp_path):
    bad = dict(data.handbuilt())
    bad["values"] = bad["values"][:-1]  # one value short
    f = tmp_path / "bad.jsonl"
    f.write_text(data.jsonl([data.handbuilt(), bad]))
    page.goto("/")
    page.set_input_files("#file", str(f))
    page.click("#upload-btn")
    err = page.locator(".file-item.bad .file-error")
    err.wait_for()
    text = err.text_content()
    # The server's message plus where: line 2 of the file, episode 2 (or 1 zero-based), field values.
    assert "line 2" in text and "values" in text
    assert page.text_content(".file-item.bad .fname") == "bad.jsonl"
    shot(page, "home-upload-error")


@pytest.mark.usefixtures("demo")
def test_home_search_filters_batches(page, server):
    upload(server, "zzz-unrelated", [data.handbuilt()])
    page.goto("/?q=bugfix")
    page.wait_for_selector('body[data-ready="1"]')
    names = page.locator("#batches tbody tr td:first-child").all_text_contents()
    assert names == ["bugfix"]
    page.click("#batches tbody tr button")
    page.wait_for_selector("#batches tr.detail table tbody tr")
    assert page.locator("#batches tr.detail table tbody tr").count() == 32
    shot(page, "home-search")


def test_drag_and_drop_upload_shows_the_servers_error_next_to_the_file(page):
    page.goto("/")
    page.wait_for_selector('body[data-ready="1"]')
    # A real drop event carrying a File (what a desktop drag delivers), first line not JSON.
    page.evaluate(
        """() => {
          const dt = new DataTransfer();
          dt.items.add(new File(['{"tokens": ["a"], oops\\n'], "dropped <b>.jsonl", {type: "application/x-ndjson"}));
          const zone = document.getElementById("dropzone");
          zone.dispatchEvent(new DragEvent("dragover", {dataTransfer: dt, bubbles: true, cancelable: true}));
          zone.dispatchEvent(new DragEvent("drop", {dataTransfer: dt, bubbles: true, cancelable: true}));
        }"""
    )
    item = page.locator(".file-item.bad")
    item.wait_for()
    assert item.locator(".fname").text_content() == "dropped <b>.jsonl"
    text = item.locator(".file-error").text_content()
    assert "line 1" in text
    assert text.count("line 1") == 1  # the location is said once, not repeated
    shot(page, "home-drop-error")


def test_batch_page_pages_through_a_big_batch(page, server):
    # 1,203 episodes: three pages of at most 500; the figures' aggregates cover the whole batch.
    eps = [
        {
            "tokens": ["p", "a"],
            "kinds": ["prompt", "policy"],
            "reward": float(i % 3 == 0),
            "group": f"g{i % 40}",
        }
        for i in range(1203)
    ]
    body = upload(server, "big", eps)
    bid, slugs = body["batch_id"], [e["slug"] for e in body["episodes"]]
    page.goto(f"/b/{bid}")
    page.wait_for_selector('body[data-ready="1"]')
    assert "1203 episodes" in page.text_content("#b-meta")
    assert page.locator("#episodes tbody tr").count() == 500
    assert page.text_content("#ep-range") == "Episodes 1–500 of 1203"
    assert page.is_disabled("#ep-prev") and not page.is_disabled("#ep-next")
    # The mean reward of the whole batch, not of the page: 401 of 1203 episodes pass.
    assert "0.333" in page.text_content("#cards")
    page.click("#ep-next")
    expect(page.locator("#ep-range")).to_have_text("Episodes 501–1000 of 1203")
    assert page.locator("#episodes tbody tr a").first.text_content() == slugs[500]
    assert "offset=500" in page.url
    page.click("#ep-next")
    expect(page.locator("#ep-range")).to_have_text("Episodes 1001–1203 of 1203")
    assert page.locator("#episodes tbody tr").count() == 203 and page.is_disabled("#ep-next")
    # A shared URL opens on its page.
    page.goto(f"/b/{bid}?offset=1000")
    page.wait_for_selector('body[data-ready="1"]')
    assert page.text_content("#ep-range") == "Episodes 1001–1203 of 1203"
    page.click("#ep-prev")
    expect(page.locator("#ep-range")).to_have_text("Episodes 501–1000 of 1203")
    assert not page.probe.errors and not page.probe.csp_violations()
