"""GET /api/batches/{id}/loss (the batch page's loss view): per-episode loss weight against length
for token-mean and seq-mean-token-mean computed by hand on a two-episode batch, the |A| shares
clipping (bypass) and IcePop masking remove, honest answers without log-probs, and the errors."""

from __future__ import annotations

import pytest

from tests.app.compute.test_svc_loss_metrics import two_episodes
from tests.app.svc_helpers import upload


def plain_batch() -> list[dict]:
    """e0: 2 policy tokens with A = +1; e1: 4 with A = -0.5; no log-probs."""
    eps = two_episodes()
    for e in eps:
        del e["logprobs"], e["rollout_logprobs"]
    return eps


def loss_of(client, batch_id, **params):
    r = client.get(f"/api/batches/{batch_id}/loss", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_token_mean_vs_seq_mean_token_mean_by_hand(client):
    bid = upload(client, plain_batch()).json()["batch_id"]
    tm = loss_of(client, bid)
    assert tm["agg"] == "token-mean" and tm["has_logprobs"] is False
    # token-mean: N = 6 tokens, w = A / 6. e0: sum 2/6, per token per |A| 1/6; e1: sum -2/6, 1/6.
    e0, e1 = tm["episodes"]
    assert (e0["length"], e1["length"]) == (2, 4)
    assert e0["weight_sum"] == pytest.approx(1 / 3) and e1["weight_sum"] == pytest.approx(-1 / 3)
    assert e0["weight_per_abs_advantage"] == pytest.approx(1 / 6) == e1["weight_per_abs_advantage"]
    assert tm["length_bias_slope"] == pytest.approx(0.0, abs=1e-12)
    # Without log-probs the ratio is 1: nothing clips, nothing is masked.
    assert tm["clipped_share"] == 0.0 and tm["masked_share"] == 0.0
    sm = loss_of(client, bid, agg="seq-mean-token-mean")
    # seq-mean-token-mean: S = 2, c = 1 / (2 L). e0: w = 1/4 each (sum 1/2, per |A| 1/4);
    # e1: w = -0.5/8 each (sum -1/4, per |A| 1/8): the long answer's tokens weigh half.
    e0, e1 = sm["episodes"]
    assert e0["weight_sum"] == pytest.approx(0.5) and e1["weight_sum"] == pytest.approx(-0.25)
    assert e0["weight_per_abs_advantage"] == pytest.approx(0.25)
    assert e1["weight_per_abs_advantage"] == pytest.approx(0.125)
    # y / mean(y) = 4/3, 2/3 against x / mean(x) = 2/3, 4/3: slope -1.
    assert sm["length_bias_slope"] == pytest.approx(-1.0)


def test_clipped_and_masked_shares_by_hand(client):
    bid = upload(client, two_episodes()).json()["batch_id"]
    # The arithmetic is in tests/app/compute/test_svc_loss_metrics.py: |A| 4 in all, 1.5 clipped under
    # bypass PPO, 1 masked by token IcePop [0.5, 2].
    by = loss_of(client, bid, bypass="true")
    assert by["has_logprobs"] and by["clipped_share"] == pytest.approx(1.5 / 4) and by["masked_share"] == 0.0
    ice = loss_of(client, bid, rollout_is="token", rollout_is_threshold="0.5_2")
    assert ice["masked_share"] == pytest.approx(1 / 4) and ice["clipped_share"] == 0.0
    # verl's default (no bypass): old_log_prob = logprobs, ratio 1, nothing clips.
    assert loss_of(client, bid)["clipped_share"] == 0.0


def test_errors_name_the_field(client):
    bid = upload(client, plain_batch()).json()["batch_id"]
    r = client.get(f"/api/batches/{bid}/loss", params={"agg": "nope"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "agg"
    r = client.get(f"/api/batches/{bid}/loss", params={"rollout_is": "token"})
    assert r.status_code == 422 and r.json()["error"]["field"] == "rollout_is"
    eps = plain_batch()
    del eps[1]["advantages"]
    bid2 = upload(client, eps).json()["batch_id"]
    r = client.get(f"/api/batches/{bid2}/loss")
    assert r.status_code == 409 and r.json()["error"]["field"] == "advantages"
