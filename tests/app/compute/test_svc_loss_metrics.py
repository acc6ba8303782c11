"""A run step's loss metrics (app/core/metrics.py: clip_fraction, masked_fraction,
length_bias_slope), stored at ingest and computed by hand on a two-episode step; a step without
log-probs stores null; the run page's figures name them from the catalogue."""

from __future__ import annotations

import math

import pytest
from sqlalchemy import text

from app.core import metrics
from tests.app.svc_helpers import jsonl


def two_episodes() -> list[dict]:
    """e0: 2 policy tokens, A = +1, log-ratio logprob - rollout = (+0.5, 0); e1: 4 policy tokens,
    A = -0.5, log-ratios (0, +0.8, 0, -1)."""
    e0 = {
        "tokens": ["p", "a", "b"],
        "kinds": ["prompt", "policy", "policy"],
        "reward": 1.0,
        "group": "g",
        "advantages": [0.0, 1.0, 1.0],
        "logprobs": [0.0, -1.0, -1.0],
        "rollout_logprobs": [0.0, -1.5, -1.0],
    }
    e1 = {
        "tokens": ["p", "a", "b", "c", "d"],
        "kinds": ["prompt"] + ["policy"] * 4,
        "reward": 0.0,
        "group": "g",
        "advantages": [0.0] + [-0.5] * 4,
        "logprobs": [0.0] + [-1.0] * 4,
        "rollout_logprobs": [0.0, -1.0, -1.8, -1.0, 0.0],
    }
    return [e0, e1]


def stored(client, batch_id: int) -> dict:
    import json

    with client.app.state.engine.connect() as conn:
        raw = conn.execute(text("SELECT metrics_json FROM batch WHERE id = :i"), {"i": batch_id}).scalar_one()
    return json.loads(raw)


def test_loss_metrics_of_a_step_by_hand(client):
    run = client.post("/api/runs", json={"name": "loss"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", content=jsonl(two_episodes()))
    assert r.status_code == 201, r.text
    m = stored(client, r.json()["batch_id"])
    # Bypass PPO (ratio r = exp(logprob - rollout), eps 0.2, dual clip 3):
    #   e0 token a: r = e^0.5 = 1.65 > 1.2 with A > 0 -> clipped (|A| 1);
    #   e1 token d: r = e^-1 = 0.37 < 0.8 with A < 0 -> clipped (|A| 0.5);
    #   e1 token b: r = e^0.8 = 2.23 > 1.2 but A < 0 (pessimistic side, below clip_ratio_c 3): kept.
    # |A| on policy tokens: 2 + 4 * 0.5 = 4 -> clip_fraction (1 + 0.5) / 4.
    assert m["clip_fraction"] == pytest.approx(1.5 / 4)
    # Token IcePop [0.5, 2] on rho = exp(logprob - rollout): e1 b (2.23) and d (0.37) -> 2 * 0.5 / 4.
    assert m["masked_fraction"] == pytest.approx(1.0 / 4)
    # Per-token weight per unit |A| (bypass weights |A| r, 0 when clipped):
    y0 = (0 + 1) / 2
    y1 = 0.5 * (1 + math.exp(0.8) + 1 + 0) / 2
    x = [2 / 3, 4 / 3]  # lengths 2, 4 over their mean 3
    y = [y0 / ((y0 + y1) / 2), y1 / ((y0 + y1) / 2)]
    assert m["length_bias_slope"] == pytest.approx((y[1] - y[0]) / (x[1] - x[0]))
    series = client.get(f"/api/runs/{run['id']}/metrics").json()
    assert series["clip_fraction"] == [[0, pytest.approx(0.375)]]


def test_a_step_without_logprobs_stores_null(client):
    eps = two_episodes()
    for e in eps:
        del e["rollout_logprobs"]
    run = client.post("/api/runs", json={"name": "plain"}).json()
    r = client.post(f"/api/runs/{run['id']}/steps/0", content=jsonl(eps))
    m = stored(client, r.json()["batch_id"])
    assert m["clip_fraction"] is None and m["masked_fraction"] is None and m["length_bias_slope"] is None


def test_length_bias_slope_of_the_aggregations():
    # token-mean: every token weighs 1 / N whatever its answer's length -> 0.
    assert metrics.length_bias_slope([2, 4, 8], [1, 1, 1]) == pytest.approx(0.0)
    # seq-mean-token-mean: 1 / L. Lengths 2, 4 (mean 3): y = 1/2, 1/4 over their mean 3/8 ->
    # (2/3 - 4/3) / (4/3 - 2/3) = -1.
    assert metrics.length_bias_slope([2, 4], [1 / 2, 1 / 4]) == pytest.approx(-1.0)
    assert metrics.length_bias_slope([3, 3], [1, 2]) is None  # equal lengths: no slope
    assert metrics.length_bias_slope([3], [1]) is None


def test_the_run_page_reads_the_loss_metrics_from_the_catalogue():
    figs = {f["id"]: f for f in metrics.run_figures()}
    names = [m["name"] for m in figs["loss-removed"]["metrics"]]
    assert names == ["clip_fraction", "masked_fraction"] and figs["loss-removed"]["percent"]
    assert [m["name"] for m in figs["length-bias"]["metrics"]] == ["length_bias_slope"]
    assert {"clip_fraction", "masked_fraction", "length_bias_slope"} <= set(metrics.STEP_METRICS)


def test_the_step_metrics_batched_loss_equals_the_episode_by_episode_one(monkeypatch):
    """app/compute/loss_view.episodes_removed (the step metrics' path at ingest: padded blocks, one
    kernel call each) gives exactly episode_removed's numbers, episode by episode, on episodes of
    different lengths with NaN log-probs, tool tokens, clipped and IcePop-masked ratios, across
    block boundaries (a block of 2,000 cells here)."""
    import numpy as np

    from app.compute import loss_view as lv

    monkeypatch.setattr(lv, "REMOVED_BLOCK_CELLS", 2_000)
    rng = np.random.default_rng(7)
    eps = []
    for n in (1, 700, 5, 999, 1_000, 3, 2_500, 64):
        policy = rng.random(n) < 0.7
        adv = rng.normal(0, 2, n)
        logp = -rng.exponential(1.0, n)
        roll = logp + rng.normal(0, 0.6, n)  # ratios well outside 0.8-1.2 and 0.5-2
        logp[rng.random(n) < 0.01] = np.nan
        eps.append((adv, policy, logp, roll))
    got = lv.episodes_removed(eps)
    want = [lv.episode_removed(*e) for e in eps]
    assert got == want
    assert any(r.abs_clipped > 0 for r in got) and any(r.abs_masked > 0 for r in got)
