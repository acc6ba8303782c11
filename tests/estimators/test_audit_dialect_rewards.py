"""When the best match is a trainer's dialect and the upload puts rewards on prompt/tool tokens,
``reward_on_non_policy_token`` runs that dialect again on the rewards moved to their policy tokens
(it used to look up a reference configuration's ``mask`` in the dialect's parameters: KeyError;
for an outcome dialect it found no reference candidate and called every policy token changed).
The uploads are computed by verl 0.9.1's and OpenRLHF 0.11.2's own installed functions."""

from __future__ import annotations

import pytest
import torch

from estimators.audit import KIND_POLICY, KIND_PROMPT, KIND_TOOL, audit
from estimators.registry import EstimatorInput
from tests.estimators.test_audit_dialects import _kinds
from tests.estimators.test_dialects_openrlhf import openrlhf
from tests.estimators.trainer_refs import agent_rows


def _finding(res) -> dict:
    return next(f for f in res.findings if f["code"] == "reward_on_non_policy_token")


def test_verl_grpo_reads_the_rows_total_wherever_the_reward_sits():
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np

    kinds = torch.tensor(
        [[KIND_PROMPT, KIND_POLICY, KIND_POLICY, KIND_TOOL, KIND_POLICY]] * 4, dtype=torch.uint8
    )
    pol = kinds == KIND_POLICY
    rewards = torch.zeros(4, 5, dtype=torch.float64)
    rewards[:, 3] = torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=torch.float64)  # on the tool token
    # verl scores a row by token_level_rewards.sum(-1): the tool token's reward counts as it is.
    adv, _ = core.compute_grpo_outcome_advantage(
        rewards.float(), pol.float(), np.array(["a"] * 4, dtype=object)
    )
    inp = EstimatorInput(rewards=rewards, mask=pol, groups=torch.zeros(4, dtype=torch.long))
    res = audit(inp, torch.where(pol, adv.double(), 0.0), kinds, trainer="verl")
    assert res.best_match["scheme"] in ("verl:grpo", "verl:grpo_vectorized")
    f = _finding(res)
    # Moved onto token 2 (the policy token before it), each row's total is the same: nothing changes.
    assert f["severity"] == "warning" and f["evidence"]["depends_on_placement"] is False
    assert f["evidence"]["policy_tokens_changed"] == 0 and f["token_count"] == 3  # rows 0, 2, 3


def test_openrlhf_gae_reads_the_rows_total_wherever_the_reward_sits():
    # OpenRLHF 0.11.2's own GAE (gamma 1, lambda 0.95, whitened) on agent rows whose reward sits on
    # the last policy token, as its experience maker puts it.
    rewards, values, mask, groups = agent_rows(seed=3)
    pol = mask.bool()
    kinds = _kinds(mask)
    T = mask.shape[1]
    last = T - 1 - pol.flip(1).long().argmax(1)
    total = torch.zeros_like(rewards)
    total[torch.arange(mask.shape[0]), last] = rewards.sum(-1)
    adv, _ = openrlhf("gae", total, mask, values, 4, gamma=1.0, lam=0.95)
    # The upload then also lists 0.5 on row 0's first tool token with that row's total 0.5 lower:
    # the dialect (a sample's reward is the sum of its row, on the last policy token) trains on
    # the same numbers, so OpenRLHF's advantages are still what it computes.
    up_r = total.clone()
    tool0 = int((kinds[0] == KIND_TOOL).nonzero()[0])
    up_r[0, tool0] = 0.5
    up_r[0, last[0]] -= 0.5
    inp = EstimatorInput(rewards=up_r, mask=pol, values=values, groups=groups)
    res = audit(inp, torch.where(pol, adv.double(), 0.0), kinds, trainer="openrlhf")
    assert res.best_match["scheme"] == "openrlhf:gae"
    f = _finding(res)
    # Moving the 0.5 onto the policy token before the tool span leaves the row's total, and so
    # every advantage, as it was.
    assert f["severity"] == "warning" and f["evidence"]["depends_on_placement"] is False
    assert f["token_count"] == 1 and f["episodes"] == [0]
    assert f["evidence"]["scheme"] == "openrlhf:gae" and f["evidence"]["params"]["trainer"] == "openrlhf"
