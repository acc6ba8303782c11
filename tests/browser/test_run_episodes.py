"""The run page's episodes table against the real server: sorted and filtered through
GET /api/runs/{id}/episodes, its whole state in the page's address (a reload or a copied link
shows the same table), and a kept step's batch page saying how many episodes it kept."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlparse

import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot

pytestmark = pytest.mark.browser


def episode(step: int, i: int) -> dict:
    ep = data.handbuilt()
    scale = 0.1 * (i + 1) + step  # distinct |A| per episode: max |A| = scale
    return {
        **ep,
        "reward": float(i % 2),
        "group": f"s{step}-g{i // 2}",
        "advantages": [scale if k == "policy" else 0.0 for k in ep["kinds"]],
        "entropy": [0.5 + 0.01 * i] * len(ep["kinds"]),
    }


@pytest.fixture(scope="module")
def run(server) -> dict:
    """3 steps of 8 episodes in groups of 2; keep 4 of each (2 groups)."""
    steps = {step: [episode(step, i) for i in range(8)] for step in range(3)}
    return data.post_run(server, "search-demo", steps, keep=4)


def query(page) -> dict:
    return parse_qs(urlparse(page.url).query)


def column(page, n: int) -> list[str]:
    return page.locator(f"#episodes tbody tr td:nth-child({n})").all_text_contents()


def test_sort_filter_and_the_address_as_state(page, run):
    page.goto(f"/r/{run['ref']}?sort=-max_abs_adv")
    page.wait_for_selector('#episodes[data-ready="1"]')
    assert page.locator("#episodes tbody tr").count() == 12  # 4 kept of 8, 3 steps
    assert "of 12" in page.text_content("#eps-count")
    adv = [float(x) for x in column(page, 7)]  # max |A|
    assert adv == sorted(adv, reverse=True) and adv[0] == pytest.approx(2.8)
    assert "▼" in page.text_content('button[data-sort="max_abs_adv"]')
    # A click on "reward" sorts by it, ascending; the address says so.
    page.click('button[data-sort="reward"]')
    page.wait_for_url(re.compile(r"sort=reward"))
    page.wait_for_selector('#episodes[data-ready="1"]')
    rewards = [float(x) for x in column(page, 3)]
    assert rewards == sorted(rewards)
    # A filter from the form: passed = yes.
    page.select_option("#eps-field", "passed")
    page.select_option("#eps-op", "eq")
    page.fill("#eps-value", "true")
    page.click("#eps-filter button[type=submit]")
    page.wait_for_url(re.compile(r"passed=true"))
    page.wait_for_selector('#episodes[data-ready="1"]')
    assert set(column(page, 4)) == {"yes"} and page.locator("#episodes tbody tr").count() == 6
    page.select_option("#eps-field", "step")
    page.select_option("#eps-op", "gt")
    page.fill("#eps-value", "0")
    page.click("#eps-filter button[type=submit]")
    page.wait_for_url(re.compile(r"step__gt=0"))
    page.wait_for_selector('#episodes[data-ready="1"]')
    assert set(column(page, 1)) == {"1", "2"} and page.locator("#episodes tbody tr").count() == 4
    assert query(page) == {"sort": ["reward"], "passed": ["true"], "step__gt": ["0"]}
    shot(page, "run-episodes")
    # The address is the whole state: a fresh load of it shows the same table.
    url = page.url
    rows = page.locator("#episodes tbody tr").all_text_contents()
    page.goto(url)
    page.wait_for_selector('#episodes[data-ready="1"]')
    assert page.locator("#episodes tbody tr").all_text_contents() == rows
    # Removing a filter's chip drops it from the address and the table.
    page.click('.chip[data-param="step__gt"] .chip-x')
    page.wait_for_function("() => !location.search.includes('step__gt')")
    page.wait_for_selector('#episodes[data-ready="1"]')
    assert page.locator("#episodes tbody tr").count() == 6
    # A row's link opens the episode.
    href = page.locator("#episodes tbody tr").first.locator("td:last-child a").get_attribute("href")
    assert href.startswith("/e/")
    assert not page.probe.errors


def test_a_bad_filter_in_the_address_says_which_parameter(page, run):
    page.goto(f"/r/{run['ref']}?reward__gt=lots")
    page.wait_for_selector('#episodes[data-ready="1"]', state="attached")
    assert "reward__gt" in page.text_content("#eps-error")


def test_a_kept_step_says_how_many_it_kept(page, run):
    page.goto(f"/b/{run['batches'][1]}")
    page.wait_for_function("() => document.getElementById('b-meta').textContent.includes('kept')")
    assert "4 of 8 episodes kept" in page.text_content("#b-meta")
