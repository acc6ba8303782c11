"""The episode page's `loss_weights` row against the real server in headless Chromium: the row
shows, the tokens whose weight was clipped carry a mark (and say so in the tooltip), each call
gets its share of the episode's weight, and the loss controls write the URL."""

from __future__ import annotations

import math

import pytest

from tests.browser.browser_util import shot, upload, wait_ready

pytestmark = pytest.mark.browser

#         p    P0    P1    P2    t    t    P3    P4
KINDS = ["prompt", "policy", "policy", "policy", "tool", "tool", "policy", "policy"]
ADV = [0.0, 1.0, 1.0, -1.0, 0.0, 0.0, 0.5, 0.5]
LOGP = [0.0, -0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
# logprobs - rollout_logprobs: 0, +0.5 (ratio 1.65 with A > 0: clipped high), -1 (0.37, A < 0:
# clipped low), 0, 0.1 -- under bypass (old_log_prob = rollout).
ROLL = [0.0, -0.5, -1.0, 0.5, 0.0, 0.0, -0.5, -0.6]


@pytest.fixture(scope="module")
def slug(server) -> str:
    ep = {
        "tokens": [f"w{i}" for i in range(len(KINDS))],
        "kinds": KINDS,
        "reward": 1.0,
        "advantages": ADV,
        "logprobs": LOGP,
        "rollout_logprobs": ROLL,
        "meta": {"task": "loss weights"},
    }
    return upload(server, "loss-weights", [ep])["episodes"][0]["slug"]


def test_the_row_shows_and_marks_the_clipped_tokens(page, slug):
    page.goto(f"/e/{slug}?scheme=uploaded,loss_weights&bypass=1")
    wait_ready(page)
    assert page.evaluate("window.__strip.rows.map(r => r.name)") == ["uploaded", "loss_weights"]
    values = page.evaluate("window.__strip.rows[1].advantages")
    # token-mean over 5 policy tokens: A * ratio / 5, 0 where clipped.
    assert values[1] == pytest.approx(1 / 5) and values[2] == 0 and values[3] == 0
    assert values[7] == pytest.approx(0.5 * math.exp(0.1) / 5)
    assert page.evaluate("window.__strip.cellAt(2).findings") == ["loss_clipped_high"]
    assert page.evaluate("window.__strip.cellAt(3).findings") == ["loss_clipped_low"]
    assert page.evaluate("window.__strip.cellAt(1).findings") == []
    # The tooltip says why.
    page.focus(".strip-canvas")
    page.evaluate("window.__strip.setCursor(2)")
    panel = page.locator(".hover-panel")
    panel.wait_for(state="visible")
    assert "loss_clipped_high" in panel.text_content()
    # Each call's share of the episode's |weight|: call 0 holds 1/5 of (1/5 + 2 * 0.5 e^0.1 ... ).
    head = page.locator("#calls thead").text_content()
    assert "Weight share" in head
    shares = page.locator("#calls td.loss-share").all_text_contents()
    w = [1 / 5, 0.0, 0.0, 0.5 / 5, 0.5 * math.exp(0.1) / 5]
    total = sum(w)
    assert shares == [f"{100 * w[0] / total:.1f}%", f"{100 * sum(w[3:]) / total:.1f}%"]
    shot(page, "loss-weights-row")
    assert not page.probe.errors and not page.probe.csp_violations()


def test_the_controls_write_the_url_and_reload(page, slug):
    page.goto(f"/e/{slug}?scheme=uploaded,loss_weights")
    wait_ready(page)
    assert page.evaluate("window.__strip.cellAt(2).findings") == []  # on-policy: nothing clipped
    page.locator("#schemes-box > summary").click()
    page.select_option("#agg", "seq-mean-token-sum")
    page.wait_for_function("() => location.search.includes('agg=seq-mean-token-sum')")
    page.wait_for_function(
        "() => window.__strip.rows[1] && Math.abs(window.__strip.rows[1].advantages[1] - 1) < 1e-12"
    )
    page.check("#bypass")
    page.wait_for_function("() => location.search.includes('bypass=1')")
    page.wait_for_function("() => window.__strip.rows[1].advantages[2] === 0")
    assert "loss=vanilla&agg=seq-mean-token-sum&rollout_is=none&rollout_is_threshold=2&bypass=1" in page.url
    assert not page.probe.errors


def test_another_trainers_loss_with_its_own_control(page, slug):
    """The loss select groups every registered loss by trainer; SkyRL's regular loss hides verl's
    agg / rollout_is / threshold and shows its own loss_reduction, both written to the URL. Under
    bypass with sequence_mean (one row: A' = A / (1 x 5)) the row is the same as verl's token-mean
    here: A r / 5, 0 where clipped; SkyRL's ratio is float32 (1e-6)."""
    page.goto(f"/e/{slug}?scheme=uploaded,loss_weights&bypass=1")
    wait_ready(page)
    page.locator("#schemes-box > summary").click()
    groups = page.eval_on_selector_all("#loss optgroup", "els => els.map((g) => g.label)")
    assert groups == ["verl 0.9.1", "TRL 1.16.0", "OpenRLHF 0.11.2", "SkyRL 0.3.0"]
    page.select_option("#loss", "skyrl:regular")
    page.wait_for_function("() => location.search.includes('loss=skyrl:regular')")
    assert page.locator("#agg").is_hidden() and page.locator("#rollout_is_threshold").is_hidden()
    assert page.locator("#loss-loss_reduction").input_value() == "token_mean"
    page.select_option("#loss-loss_reduction", "sequence_mean")
    page.wait_for_function("() => location.search.includes('loss_reduction=sequence_mean')")
    assert "agg=" not in page.url and "bypass=1" in page.url
    page.wait_for_function("() => window.__strip.rows[1] && window.__strip.rows[1].advantages[2] === 0")
    values = page.evaluate("window.__strip.rows[1].advantages")
    assert values[1] == pytest.approx(1 / 5, rel=1e-6) and values[3] == 0
    assert values[7] == pytest.approx(0.5 * math.exp(0.1) / 5, rel=1e-6)
    # Back to verl: its controls return, SkyRL's leave the URL.
    page.select_option("#loss", "vanilla")
    page.wait_for_function("() => location.search.includes('loss=vanilla&agg=')")
    assert "loss_reduction" not in page.url and page.locator("#agg").is_visible()
    assert page.locator("#loss-params label").count() == 0
    assert not page.probe.errors
