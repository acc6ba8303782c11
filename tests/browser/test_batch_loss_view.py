"""The batch page's loss view against the real server in headless Chromium: the Plotly chart of
per-token weight per unit |A| against response length (hand-computed values, see
tests/app/compute/test_svc_batch_loss.py), the |A| share removed by clipping, and the controls writing
the URL; a batch without log-probs says so."""

from __future__ import annotations

import pytest

from tests.browser.browser_util import upload, wait_ready

pytestmark = pytest.mark.browser


def two_episodes() -> list[dict]:
    """As tests/app/compute/test_svc_loss_metrics.py: e0 2 policy tokens, A = +1, log-ratios (+0.5, 0);
    e1 4 policy tokens, A = -0.5, log-ratios (0, +0.8, 0, -1)."""
    return [
        {
            "tokens": ["p", "a", "b"],
            "kinds": ["prompt", "policy", "policy"],
            "reward": 1.0,
            "group": "g",
            "advantages": [0.0, 1.0, 1.0],
            "logprobs": [0.0, -1.0, -1.0],
            "rollout_logprobs": [0.0, -1.5, -1.0],
        },
        {
            "tokens": ["p", "a", "b", "c", "d"],
            "kinds": ["prompt"] + ["policy"] * 4,
            "reward": 0.0,
            "group": "g",
            "advantages": [0.0] + [-0.5] * 4,
            "logprobs": [0.0] + [-1.0] * 4,
            "rollout_logprobs": [0.0, -1.0, -1.8, -1.0, 0.0],
        },
    ]


def test_the_chart_and_the_removed_share(page, server):
    bid = upload(server, "loss-view", two_episodes())["batch_id"]
    page.goto(f"/b/{bid}?agg=seq-mean-token-mean")
    wait_ready(page, "#loss-box")
    assert page.locator("#loss-agg").input_value() == "seq-mean-token-mean"
    trace = page.evaluate(
        "(() => { const t = document.getElementById('fig-loss').data[0]; return {x: t.x, y: t.y}; })()"
    )
    # Lengths 2 and 4; seq-mean-token-mean c = 1 / (2 L), ratio 1 (no bypass): 1/4 and 1/8.
    assert trace["x"] == [2, 4]
    assert trace["y"] == [pytest.approx(0.25), pytest.approx(0.125)]
    assert page.locator("#fig-loss .scatterlayer .points path").count() == 2
    assert "Clipping removes 0.0%" in page.locator("#loss-removed").inner_text()
    # Bypass: 1.5 of the |A| mass 4 clipped (tests/app/compute/test_svc_loss_metrics.py).
    page.evaluate("document.getElementById('loss-box').dataset.ready = ''")
    page.locator("#loss-bypass").check()
    wait_ready(page, "#loss-box")
    assert "Clipping removes 37.5%" in page.locator("#loss-removed").inner_text()
    assert "bypass=1" in page.url and "agg=seq-mean-token-mean" in page.url


def test_a_batch_without_logprobs_says_so(page, server):
    eps = two_episodes()
    for e in eps:
        del e["logprobs"], e["rollout_logprobs"]
    bid = upload(server, "loss-view-plain", eps)["batch_id"]
    page.goto(f"/b/{bid}")
    wait_ready(page, "#loss-box")
    assert "no log-probs" in page.locator("#loss-removed").inner_text()
    assert page.evaluate("document.getElementById('fig-loss').data[0].y") == [
        pytest.approx(1 / 6),
        pytest.approx(1 / 6),
    ]


def test_a_trainers_loss_grouped_by_trainer(page, server):
    """The loss select groups the registered losses by trainer (from the page state); picking TRL's
    dapo shows its own control (importance_sampling_level) in place of verl's, writes the URL and
    draws the chart: dapo's token mean over the 6 tokens, ratio 1, so 1/6 per unit |A| for both."""
    bid = upload(server, "loss-view-trl", two_episodes())["batch_id"]
    page.goto(f"/b/{bid}")
    wait_ready(page, "#loss-box")
    groups = page.eval_on_selector_all("#loss-loss optgroup", "els => els.map((g) => g.label)")
    assert groups == ["verl 0.9.1", "TRL 1.16.0", "OpenRLHF 0.11.2", "SkyRL 0.3.0"]
    assert page.locator("#loss-agg").count() == 1
    page.evaluate("document.getElementById('loss-box').dataset.ready = ''")
    page.locator("#loss-loss").select_option("trl:dapo")
    wait_ready(page, "#loss-box")
    assert page.locator("#loss-agg").count() == 0
    assert page.locator("#loss-importance_sampling_level").input_value() == "token"
    assert "loss=trl%3Adapo" in page.url or "loss=trl:dapo" in page.url
    assert "agg=" not in page.url
    y = page.evaluate("document.getElementById('fig-loss').data[0].y")
    assert y == [pytest.approx(1 / 6), pytest.approx(1 / 6)]
    assert "trl:dapo × token" in page.locator("#loss-plotted").inner_text()
    # The sequence level: each episode's ratio is its geometric mean (1 here): the same weights.
    page.evaluate("document.getElementById('loss-box').dataset.ready = ''")
    page.locator("#loss-importance_sampling_level").select_option("sequence")
    wait_ready(page, "#loss-box")
    assert "importance_sampling_level=sequence" in page.url
