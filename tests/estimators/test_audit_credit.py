"""The audit's loss findings (issue 23): large-|A| policy tokens whose loss weight is 0, by PPO
clipping (``credit_clipped``: verl's vanilla loss and defaults in bypass mode, ratio
``exp(logprobs - rollout_logprobs)``) or by token-level IcePop (``credit_masked_by_rollout_correction``,
window 0.5_2), on hand-built batches whose ratios are hand-computed; none without log-probs."""

from __future__ import annotations

import math

import torch

from estimators.audit import audit_episodes
from estimators.audit.batch import prepare
from estimators.audit.findings import large_advantages
from estimators.registry import EstimatorInput

Q, P = "prompt", "policy"
KINDS = [[Q, P, P, P, P], [Q, P, P, P, P]]
REWARDS = [[0.0] * 5, [0.0] * 5]
# Policy |A| sorted: .1 .1 .2 .2 .3 .3 .4 3.0; the 90th percentile (linear) is 0.4 + 0.3 * 2.6 = 1.18,
# so the one large-|A| token is episode 0, position 4 (A = 3.0).
ADV = [[0.0, 0.1, 0.2, 0.3, 3.0], [0.0, -0.1, -0.2, -0.3, -0.4]]
ZEROS = [[0.0] * 5, [0.0] * 5]


def _codes(res):
    return {f["code"]: f for f in res.findings}


def _with_log_ratio(at, log_ratio):
    """(logprobs, rollout_logprobs) with log ratio ``log_ratio`` at token ``at`` = (episode, position), 0 elsewhere."""
    lp = [[-1.0] * 5, [-1.0] * 5]
    rlp = [list(r) for r in lp]
    e, p = at
    rlp[e][p] = lp[e][p] - log_ratio
    return lp, rlp


def test_large_advantages_are_at_or_above_the_90th_percentile():
    kt = torch.tensor([[0, 1, 1, 1, 1]] * 2, dtype=torch.uint8)
    inp = EstimatorInput(rewards=torch.zeros(2, 5, dtype=torch.float64), mask=kt == 1)
    b = prepare(inp, torch.tensor(ADV, dtype=torch.float64), kt, None)
    assert large_advantages(b).nonzero().tolist() == [[0, 4]]


def test_large_token_with_ratio_past_the_clip_is_credit_clipped_warning():
    # ratio exp(log 2) = 2 > 1 + 0.2 with A > 0: PPO's clip zeroes its weight (IcePop keeps 2 <= 2).
    lp, rlp = _with_log_ratio((0, 4), math.log(2.0))
    res = audit_episodes(KINDS, ADV, REWARDS, logprobs=lp, rollout_logprobs=rlp)
    f = _codes(res)["credit_clipped"]
    assert f["severity"] == "warning"  # the only large-|A| token: 100 % of that mass
    assert f["tokens"] == [[0, 4]] and f["episodes"] == [0] and f["token_count"] == 1
    assert f["evidence"]["share_of_large_abs_advantage"] == 1.0
    assert f["evidence"]["abs_advantages"] == [3.0]
    assert abs(f["evidence"]["log_ratio"][0] - math.log(2.0)) < 1e-12
    assert "credit_masked_by_rollout_correction" not in _codes(res)


def test_small_share_is_info():
    # 18 tokens |A| 0.1, one 0.2, one 10: the 90th percentile is 0.1 + 0.1 * 0.1 = 0.11; large are the
    # 0.2 and the 10. Clipping the 0.2 (A < 0, ratio 0.6 < 0.8; IcePop keeps 0.6) takes 0.2 / 10.2 < 5 %
    # of their mass.
    kinds = [[Q] + [P] * 10, [Q] + [P] * 10]
    adv = [[0.0] + [0.1] * 9 + [10.0], [0.0] + [0.1] * 9 + [-0.2]]
    lp = [[-1.0] * 11, [-1.0] * 11]
    rlp = [list(r) for r in lp]
    rlp[1][10] = -1.0 - math.log(0.6)
    res = audit_episodes(kinds, adv, [[0.0] * 11] * 2, logprobs=lp, rollout_logprobs=rlp)
    assert "credit_masked_by_rollout_correction" not in _codes(res)
    f = _codes(res)["credit_clipped"]
    assert f["severity"] == "info" and f["tokens"] == [[1, 10]]
    assert abs(f["evidence"]["share_of_large_abs_advantage"] - 0.2 / 10.2) < 1e-12
    assert f["evidence"]["large_tokens"] == 2


def test_large_token_outside_the_icepop_window_is_masked_by_rollout_correction():
    # ratio 0.4 with A > 0: PPO does not clip (only above 1.2 for A > 0), IcePop zeroes it (0.4 < 0.5).
    lp, rlp = _with_log_ratio((0, 4), math.log(0.4))
    res = audit_episodes(KINDS, ADV, REWARDS, logprobs=lp, rollout_logprobs=rlp)
    f = _codes(res)["credit_masked_by_rollout_correction"]
    assert f["severity"] == "warning" and f["tokens"] == [[0, 4]] and f["episodes"] == [0]
    assert f["evidence"]["rollout_is_threshold"] == "0.5_2"
    assert "credit_clipped" not in _codes(res)


def test_a_small_token_zeroed_is_not_named():
    # Episode 1's last token (|A| 0.4, below the 90th percentile) clipped: no finding.
    lp, rlp = _with_log_ratio((1, 4), math.log(0.4))  # A < 0, ratio 0.4: clipped low and IcePop-zeroed
    res = audit_episodes(KINDS, ADV, REWARDS, logprobs=lp, rollout_logprobs=rlp)
    assert not {"credit_clipped", "credit_masked_by_rollout_correction"} & set(_codes(res))


def test_without_logprobs_neither_finding():
    lp, rlp = _with_log_ratio((0, 4), math.log(3.0))
    for kw in ({}, {"logprobs": lp}, {"rollout_logprobs": rlp}):
        res = audit_episodes(KINDS, ADV, REWARDS, **kw)
        assert not {"credit_clipped", "credit_masked_by_rollout_correction"} & set(_codes(res))
    # With both, ratio 3 is clipped (> 1.2) and masked (> 2): both findings.
    res = audit_episodes(KINDS, ADV, REWARDS, logprobs=lp, rollout_logprobs=rlp)
    assert {"credit_clipped", "credit_masked_by_rollout_correction"} <= set(_codes(res))
