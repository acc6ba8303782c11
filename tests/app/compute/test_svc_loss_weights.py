"""The `loss_weights` row of GET /api/episodes/{slug}/advantages, through the real app on a real
SQLite file with real uploads: hand-computed weights, the batch's aggregation, clipping and
IcePop marks, each call's share, the 422s, and the same numbers as verl 0.9.1's own loss through
autograd on the uploaded batch."""

from __future__ import annotations

import math

import pytest
import torch

from app.core.views import EpisodeView
from tests.app.svc_helpers import make_client, upload

# Episode A: prompt, 3 policy tokens, a tool span, 1 policy token (two calls). Episode B: 2 policy.
KINDS_A = ["prompt", "policy", "policy", "policy", "tool", "tool", "policy"]
ADV_A = [0.0, 1.0, 1.0, -0.5, 0.0, 0.0, 2.0]
LOGP_A = [0.0, -0.5, -1.0, -0.2, 0.0, 0.0, -0.3]
# logprobs - rollout_logprobs: 0, 0.5 (ratio 1.65: above 1.2), 0, -1.0 (ratio 0.37), 0, 0, 0.1
ROLL_A = [0.0, -0.5, -1.5, -0.2, 0.0, 0.0, -0.4]
KINDS_B = ["prompt", "policy", "policy"]
ADV_B = [0.0, -1.0, -1.0]
LOGP_B = [0.0, -0.1, -0.2]
ROLL_B = [0.0, -0.1, -0.2]
ROLL_A[3] = LOGP_A[3] + 1.0


def _ep(kinds, adv, logp, roll, reward):
    return {
        "tokens": [f"t{i}" for i in range(len(kinds))],
        "kinds": kinds,
        "reward": reward,
        "group": "g",
        "advantages": adv,
        "logprobs": logp,
        "rollout_logprobs": roll,
    }


@pytest.fixture
def client(db_url):
    with make_client(db_url) as c:
        yield c


@pytest.fixture
def slugs(client):
    r = upload(client, [_ep(KINDS_A, ADV_A, LOGP_A, ROLL_A, 1.0), _ep(KINDS_B, ADV_B, LOGP_B, ROLL_B, 0.0)])
    assert r.status_code == 201, r.text
    return [e["slug"] for e in r.json()["episodes"]]


def _get(client, slug, **params):
    r = client.get(f"/api/episodes/{slug}/advantages", params={"scheme": "uploaded,loss_weights", **params})
    return r


def _row(body):
    return next(s for s in body["schemes"] if s["name"] == "loss_weights")["advantages"]


def test_default_is_verl_token_mean_on_the_batch(client, slugs):
    body = _get(client, slugs[0]).json()
    # On-policy (ratio 1), token-mean over the batch's 4 + 2 = 6 policy tokens: w = A / 6.
    w = _row(body)
    assert w == [
        None,
        pytest.approx(1 / 6),
        pytest.approx(1 / 6),
        pytest.approx(-0.5 / 6),
        None,
        None,
        pytest.approx(2 / 6),
    ]
    loss = body["loss"]
    assert {k: loss[k] for k in ("loss", "agg", "rollout_is", "bypass", "advantages_from")} == {
        "loss": "vanilla",
        "agg": "token-mean",
        "rollout_is": "none",
        "bypass": False,
        "advantages_from": "uploaded",
    }
    assert loss["marks"] == [] and loss["n_zeroed"] == 0
    # Calls: tokens 1-3 (|w| 2.5/6) and token 6 (2/6) of the episode's 4.5/6.
    shares = [t["loss_share"] for t in body["turns"]]
    assert shares == [pytest.approx(2.5 / 4.5), pytest.approx(2 / 4.5)]


def test_seq_mean_token_mean_length_bias(client, slugs):
    a = _row(_get(client, slugs[0], agg="seq-mean-token-mean").json())
    b = _row(_get(client, slugs[1], agg="seq-mean-token-mean").json())
    # 2 episodes: a token of A (4 tokens) weighs 1 / (4 * 2), one of B (2 tokens) 1 / (2 * 2).
    assert a[1] == pytest.approx(1 / 8, rel=1e-7) and b[1] == pytest.approx(-1 / 4, rel=1e-7)


def test_bypass_clips_and_icepop_zeroes_with_marks(client, slugs):
    body = _get(client, slugs[0], bypass="true").json()
    w = _row(body)
    # old_log_prob = rollout: ratios 1, e^0.5 = 1.65 (A > 0: clipped high), 1, e^-1 (A < 0: clipped low), e^0.1.
    assert w[1] == pytest.approx(1 / 6) and w[2] == 0 and w[3] == 0
    assert w[6] == pytest.approx(2 * math.exp(0.1) / 6)
    marks = {m["code"]: m["positions"] for m in body["loss"]["marks"]}
    assert marks == {"loss_clipped_high": [2], "loss_clipped_low": [3]}
    assert body["loss"]["n_zeroed"] == 2
    assert body["loss"]["abs_advantage_zeroed_share"] == pytest.approx(1.5 / 4.5)

    body = _get(client, slugs[0], rollout_is="token", rollout_is_threshold="0.5_1.5").json()
    w = _row(body)
    # IcePop on exp(logprobs - rollout): 1, 1.65 (out), 1, 0.37 (out), 1.105: kept ones times their weight.
    assert w[2] == 0 and w[3] == 0 and w[6] == pytest.approx(2 * math.exp(0.1) / 6)
    marks = {m["code"]: m["positions"] for m in body["loss"]["marks"]}
    assert marks == {"loss_icepop_zeroed": [2, 3]}
    assert body["loss"]["states"][2] == 16


def test_equals_verl_on_the_uploaded_batch(client, slugs):
    """verl's compute_policy_loss_vanilla through autograd on the two uploaded rows, right-padded to
    one [2, 7] batch: token TIS on logprobs - rollout_logprobs, and bypass mode."""
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    rch = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
    from verl.workers.config import ActorConfig

    pad = lambda x: x + [0.0] * (7 - len(x))  # noqa: E731
    mask = torch.tensor(
        [[k == "policy" for k in KINDS_A], [k == "policy" for k in pad(KINDS_B)]], dtype=torch.float64
    )
    adv = torch.tensor([ADV_A, pad(ADV_B)], dtype=torch.float64)
    lp = torch.tensor([LOGP_A, pad(LOGP_B)], dtype=torch.float64)
    roll = torch.tensor([ROLL_A, pad(ROLL_B)], dtype=torch.float64)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    config.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None)
    cases = [  # (the service's parameters, verl's old_log_prob, its rollout weights or None)
        ({"rollout_is": "token", "rollout_is_threshold": "1.5"}, lp, "tis"),
        ({"bypass": "1"}, roll, None),  # bypass: old = rollout, PPO clips the mismatch
    ]
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        for params, old, corr in cases:
            rw = None
            if corr:
                rw, _ = rch.compute_rollout_correction_weights(
                    lp - roll, mask, rollout_is="token", rollout_is_threshold=1.5
                )
            x = lp.clone().requires_grad_(True)
            value, _ = core.compute_policy_loss_vanilla(old, x, adv, mask, agg, config, rw)
            value.backward()
            theirs = (-x.grad).tolist()
            for row, slug in enumerate(slugs):
                w = _row(_get(client, slug, agg=agg, **params).json())
                for i, v in enumerate(w):
                    if v is not None:
                        assert v == pytest.approx(theirs[row][i], abs=1e-12), (agg, params, row, i)
            if old is roll:  # bypass: PPO clips tokens 2 and 3
                assert theirs[0][2] == 0 and theirs[0][3] == 0


def test_without_logprobs_the_ratio_is_one(client):
    ep = {"tokens": ["a", "b", "c"], "kinds": ["policy"] * 3, "reward": 1.0, "advantages": [1.0, -1.0, 0.5]}
    slug = upload(client, [ep]).json()["episodes"][0]["slug"]
    body = _get(client, slug, loss="cispo").json()
    assert _row(body) == [pytest.approx(1 / 3), pytest.approx(-1 / 3), pytest.approx(0.5 / 3)]
    assert body["loss"]["ratio_from"].startswith("none")
    r = _get(client, slug, rollout_is="token")
    assert r.status_code == 422 and r.json()["error"]["field"] == "rollout_is"


@pytest.mark.parametrize(
    "params,field",
    [
        ({"loss": "ppo"}, "loss"),
        ({"agg": "mean"}, "agg"),
        ({"rollout_is": "row"}, "rollout_is"),
        ({"rollout_is_threshold": "3_1"}, "rollout_is_threshold"),
        ({"rollout_is_threshold": "x"}, "rollout_is_threshold"),
    ],
)
def test_bad_parameters_are_422_naming_the_field(client, slugs, params, field):
    r = _get(client, slugs[0], **params)
    assert r.status_code == 422
    assert r.json()["error"]["field"] == field


def test_view_query_carries_the_loss_only_with_the_row():
    v = EpisodeView.from_query(
        {
            "scheme": "uploaded,loss_weights",
            "loss": "gspo",
            "agg": "seq-mean-token-mean",
            "rollout_is": "token",
            "rollout_is_threshold": "0.5_2",
            "bypass": "1",
        }
    )
    assert (v.loss, v.agg, v.rollout_is, v.rollout_is_threshold, v.bypass) == (
        "gspo",
        "seq-mean-token-mean",
        "token",
        "0.5_2",
        True,
    )
    assert (
        "loss=gspo&agg=seq-mean-token-mean&rollout_is=token&rollout_is_threshold=0.5_2&bypass=1" in v.query()
    )
    assert "loss=" not in EpisodeView.from_query({"scheme": "uploaded", "loss": "gspo"}).query()
    bad = EpisodeView.from_query({"scheme": "loss_weights", "loss": "x", "rollout_is_threshold": "2_1"})
    assert (bad.loss, bad.rollout_is_threshold) == ("vanilla", "2")
