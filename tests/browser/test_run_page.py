"""The run page against the real server: the timeline is drawn from the stored step metrics and a
click on a point opens that step's batch page, which links back to the run."""

from __future__ import annotations

import re

import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def run(server) -> dict:
    """A run of 4 steps whose pass rate climbs 0, 1/4, 1/2, 3/4 (4 episodes per step)."""
    steps = {
        step * 10: [{**data.handbuilt(), "reward": float(i < step), "group": f"t{i // 2}"} for i in range(4)]
        for step in range(4)
    }
    return data.post_run(server, "grpo-demo", steps)


def test_run_page_draws_the_timeline_and_a_point_opens_its_batch(page, run):
    page.goto(f"/r/{run['id']}")
    page.wait_for_selector('#timeline[data-ready="1"]')
    page.wait_for_selector('#timeline[data-drawn="all"]')
    assert "grpo-demo" in page.text_content("h1")
    assert "4 steps" in page.text_content("#r-meta")
    # The outcome figure: pass rate and mean score over the 4 steps, as stored.
    traces = page.evaluate(
        "document.getElementById('fig-outcome').data.map(t => ({name: t.name, x: t.x, y: t.y}))"
    )
    assert traces[0] == {"name": "pass rate", "x": [0, 10, 20, 30], "y": [0, 0.25, 0.5, 0.75]}
    ids = page.evaluate("document.getElementById('fig-zero-variance').data.map(t => t.name)")
    assert ids == ["all", "all passed", "all failed"]
    assert page.locator("#steps tbody tr").count() == 4
    # Figures below the first screen are drawn after it, every one of them.
    n_figs = page.locator("#timeline .plot").count()
    assert n_figs >= 3 and page.locator('#timeline .plot[data-drawn="1"]').count() == n_figs
    shot(page, "run-page")
    # Click the pass-rate point of step 20: Plotly reports it, the page opens that step's batch.
    point = page.locator("#fig-outcome .scatterlayer .trace").first.locator(".points path").nth(2)
    box = point.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.wait_for_url(re.compile(rf"/b/{run['batches'][20]}$"))
    link = page.locator("#run-link")
    assert link.text_content().strip() == "run grpo-demo · step 20"
    assert link.locator("a").get_attribute("href") == f"/r/{run['id']}"
    assert not page.probe.errors


def test_unknown_run_is_a_404_page(page):
    r = page.goto("/r/987654")
    assert r.status == 404


def test_a_long_runs_steps_table_shows_the_latest_steps_then_all(page, server):
    """Beyond 100 steps the table lists the latest 100, newest first; one click shows them all."""
    episodes = [{**data.handbuilt(), "group": "t0"}]
    run_id = data.post_run(server, "long-run", dict.fromkeys(range(103), episodes))["id"]
    page.goto(f"/r/{run_id}")
    page.wait_for_selector('#timeline[data-drawn="all"]')
    rows = page.locator("#steps tbody tr")
    assert rows.count() == 100
    assert rows.first.locator("td").first.text_content() == "102"
    assert rows.last.locator("td").first.text_content() == "3"
    assert page.text_content("#steps-more").startswith("The latest 100 of 103 steps.")
    page.click("#steps-all")
    assert rows.count() == 103
    assert rows.last.locator("td").first.text_content() == "0"
    assert page.locator("#steps-all").count() == 0
    assert not page.probe.errors
