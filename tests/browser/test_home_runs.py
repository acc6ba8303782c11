"""The home page's training runs against the real server: a run logged through the API is listed
with its number of steps and last step, its name opens its page, the nav's "Runs" link comes back
to the list, and an unlisted run is never shown."""

from __future__ import annotations

import re

import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot

pytestmark = pytest.mark.browser


def _run(server: str, name: str, steps: list[int], **body) -> dict:
    """A run logged through the real API, 2 episodes a step."""
    eps = [{**data.handbuilt(), "reward": float(i), "group": "t0"} for i in range(2)]
    return data.post_run(server, name, dict.fromkeys(steps, eps), **body)


def test_home_lists_a_logged_run_and_its_name_opens_the_run_page(page, server):
    quiet = _run(server, "home-quiet-run", [0], visibility="unlisted")
    run = _run(server, "home-listed-run", [0, 5])
    page.goto("/")
    page.wait_for_selector('#runs[data-ready="1"]')
    row = page.locator(f'#runs-table tbody tr[data-run="{run["id"]}"]')
    cells = [c.strip() for c in row.locator("td").all_text_contents()]
    assert cells[:3] == ["home-listed-run", "2", "5"]
    assert cells[5] == str(run["id"])
    # The date as a person reads it (the browser's locale), not the raw ISO text.
    assert re.search(r"\b20\d\d\b", cells[6]) and "T" not in cells[6] and "Z" not in cells[6], cells
    # Newest first: the run just logged heads the list; the unlisted one is nowhere on the page.
    first = page.locator("#runs-table tbody tr").first
    assert first.get_attribute("data-run") == str(run["id"])
    assert "home-quiet-run" not in page.content()
    assert quiet["ref"] not in page.content()
    shot(page, "home-runs")
    row.get_by_role("link", name="home-listed-run").click()
    page.wait_for_url(re.compile(rf"/r/{run['id']}$"))
    page.wait_for_selector("#r-meta")
    assert "home-listed-run" in page.text_content("h1")
    # The nav's "Runs" link leads back to the list on the home page.
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Runs").click()
    page.wait_for_selector(f'#runs[data-ready="1"] tr[data-run="{run["id"]}"]')
    # The batch search rewrites the query string when the page starts; the fragment stays.
    assert page.url == f"{server}/#runs"
    assert not page.probe.errors
