"""Runs side by side against the real server: /r/compare?runs=a,b overlays each metric, one
colour per run, links back to each run, and is reached from a run page's "Compare with run"."""

from __future__ import annotations

import re

import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot

pytestmark = pytest.mark.browser


def steps(rates: list[float]) -> dict[int, list[dict]]:
    return {
        s: [{**data.handbuilt(), "reward": float(i < r * 4), "group": f"g{i // 2}"} for i in range(4)]
        for s, r in enumerate(rates)
    }


def test_two_runs_side_by_side(page, server):
    a = data.post_run(server, "baseline", steps([0.0, 0.25, 0.25, 0.5]))
    b = data.post_run(server, "credit-fix", steps([0.25, 0.5, 0.75, 1.0]))
    page.goto(f"/r/{a['ref']}")
    page.wait_for_selector('#r-compare-with[data-ready="1"]')
    page.select_option("#r-compare-with", str(b["ref"]))  # the picker lists runs by name, valued by id
    page.click("#r-compare button[type=submit]")
    page.wait_for_url(re.compile(rf"/r/compare\?runs={a['ref']},{b['ref']}$"))
    page.wait_for_selector('#c-figs[data-ready="1"]')
    traces = page.evaluate(
        "document.getElementById('fig-pass_rate').data.map(t => ({name: t.name, y: t.y, color: t.line.color}))"
    )
    assert [t["name"] for t in traces] == ["baseline", "credit-fix"]
    assert traces[0]["y"] == [0, 0.25, 0.25, 0.5] and traces[1]["y"] == [0.25, 0.5, 0.75, 1.0]
    assert traces[0]["color"] != traces[1]["color"]
    links = page.locator("#c-runs a.run-link")
    assert [links.nth(i).get_attribute("href") for i in range(2)] == [f"/r/{a['ref']}", f"/r/{b['ref']}"]
    shot(page, "compare")
    links.nth(1).click()
    page.wait_for_url(re.compile(rf"/r/{b['ref']}$"))
    assert not page.probe.errors


@pytest.mark.usefixtures("server")
def test_an_unknown_run_says_which_parameter(page):
    page.goto("/r/compare?runs=1,987654")
    page.wait_for_selector('#c-figs[data-ready="1"]', state="attached")
    assert "runs" in page.text_content("#error")
