"""A prompt's history page against the real server: its pass rate and credit over the steps,
drawn from GET /api/runs/{id}/prompts/{key}, linked from the run page, linking to its groups."""

from __future__ import annotations

import re

import pytest

from tests.browser import browser_data as data
from tests.browser.browser_util import shot

pytestmark = pytest.mark.browser

PROMPT = ["Fix", " the", " bug", " in", " sort.py"]


def episode(step: int, i: int) -> dict:
    return {
        "tokens": PROMPT + ["edit", "</call>", "ok", "submit"],
        "kinds": ["prompt"] * 5 + ["policy", "policy", "tool", "policy"],
        "reward": float(i < step),  # the pass rate climbs 0, 1/4, 2/4, 3/4 over the steps
        "group": f"uid-{step}",  # a new uid every step, as verl makes them
        "advantages": [0.0] * 5 + [0.1 * (step + 1)] * 2 + [0.0] + [0.1 * (step + 1)],
    }


@pytest.fixture(scope="module")
def run(server) -> dict:
    return data.post_run(
        server, "prompt-demo", {step: [episode(step, i) for i in range(4)] for step in range(4)}
    )


def test_a_prompt_is_followed_over_the_steps(page, run):
    page.goto(f"/r/{run['ref']}")
    page.wait_for_selector('#prompts[data-ready="1"]')
    link = page.locator("#prompts tbody tr a").first
    assert link.text_content() == "".join(PROMPT)
    assert page.locator("#prompts tbody tr td").nth(1).text_content() == "4"
    link.click()
    page.wait_for_url(re.compile(r"/prompts/[0-9a-f]{16}$"))
    page.wait_for_selector('#p-figs[data-ready="1"]')
    assert page.text_content("#p-text") == "".join(PROMPT)
    assert "in 4 steps" in page.text_content("#p-meta")
    ys = page.evaluate("document.getElementById('fig-pass').data[0].y")
    assert ys == [0, 0.25, 0.5, 0.75]
    adv = page.evaluate("document.getElementById('fig-adv').data[0].y")
    assert adv == pytest.approx([0.1, 0.2, 0.3, 0.4])
    shot(page, "run-prompt")
    # Each step's row links to the prompt's group in that step's batch.
    group = page.locator("#p-steps tbody tr").nth(2).locator("td:last-child a")
    assert group.get_attribute("href") == f"/b/{run['batches'][2]}/g/uid-2"
    assert page.locator("#p-run").get_attribute("href") == f"/r/{run['ref']}"
    assert not page.probe.errors
