"""The audit knows every trainer: on advantages computed by a trainer's own installed code, its
best match names that trainer, version and configuration, and the departures its code makes are
named on the tokens they touch. Checked against OpenRLHF 0.11.2's and verl 0.9.1's own functions."""

from __future__ import annotations

import pytest
import torch

from estimators.audit import KIND_PAD, KIND_POLICY, KIND_PROMPT, KIND_TOOL, audit
from estimators.registry import EstimatorInput
from tests.estimators.test_dialects_openrlhf import openrlhf
from tests.estimators.trainer_refs import agent_rows


def _kinds(mask: torch.Tensor) -> torch.Tensor:
    """Prompt before a row's first policy token, tool between policy tokens, padding after the last."""
    pol = mask.bool()
    seen = torch.cumsum(mask, 1) > 0
    ahead = torch.cumsum(mask.flip(1), 1).flip(1) > 0
    k = torch.full(mask.shape, KIND_PAD, dtype=torch.uint8)
    k[~seen & ~pol] = KIND_PROMPT
    k[seen & ahead & ~pol] = KIND_TOOL
    k[pol] = KIND_POLICY
    return k


def _codes(res) -> list[str]:
    return [f["code"] for f in res.findings]


def test_openrlhf_gae_is_named_with_its_step_through_tool_spans():
    # OpenRLHF 0.11.2's own compute_advantages_and_returns (GAE, gamma 1, lambda 0.95, whitened).
    rewards, values, mask, groups = agent_rows(seed=3)
    # OpenRLHF scores a sample by its row's total: put it on the row's last policy token, as its
    # experience maker does, so the upload's rewards are what the trainer trained on.
    adv, _ = openrlhf("gae", rewards, mask, values, 4, gamma=1.0, lam=0.95)
    pol = mask.bool()
    T = mask.shape[1]
    last = T - 1 - pol.flip(1).long().argmax(1)
    total = torch.zeros_like(rewards)
    total[torch.arange(mask.shape[0]), last] = rewards.sum(-1)
    inp = EstimatorInput(rewards=total, mask=pol, values=values, groups=groups)
    uploaded = torch.where(pol, adv.double(), 0.0)
    for trainer in ("openrlhf", None):
        res = audit(inp, uploaded, _kinds(mask), trainer=trainer)
        bm = res.best_match
        assert bm["scheme"] == "openrlhf:gae", bm
        assert bm["params"] == {"trainer": "openrlhf", "version": "0.11.2", "gamma": 1.0, "lam": 0.95}
        assert "gae_through_tool_spans" in _codes(res)
        f = next(f for f in res.findings if f["code"] == "gae_through_tool_spans")
        assert f["severity"] == "error" and f["evidence"]["trainer"] == "openrlhf"
        assert "OpenRLHF" in f["message"] and "decaying gamma * lambda" in f["message"]
        # Only rows with a tool span between policy tokens are named (every row of agent_rows has one).
        assert f["token_count"] > 0 and set(f["episodes"]) <= set(range(mask.shape[0]))


def test_verl_grpo_named_when_the_upload_says_verl():
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    import numpy as np

    kinds = torch.tensor(
        [[KIND_PROMPT, KIND_POLICY, KIND_POLICY, KIND_TOOL, KIND_POLICY]] * 4, dtype=torch.uint8
    )
    pol = kinds == KIND_POLICY
    rewards = torch.zeros(4, 5, dtype=torch.float64)
    rewards[:, 4] = torch.tensor([1.0, 0.0, 0.5, 1.0], dtype=torch.float64)
    adv, _ = core.compute_grpo_outcome_advantage(
        rewards.float(), pol.float(), np.array(["a"] * 4, dtype=object)
    )
    inp = EstimatorInput(rewards=rewards, mask=pol, groups=torch.zeros(4, dtype=torch.long))
    up = torch.where(pol, adv.double(), 0.0)
    # Unnamed: the reference configuration matches as it is, so it keeps its name and the
    # dialects are not searched (they cost as much as the rest of the audit).
    plain = audit(inp, up, kinds)
    assert plain.best_match["scheme"] == "grpo" and plain.best_match["also_matches"] == []
    # Named: verl's own estimator comes first.
    named = audit(inp, up, kinds, trainer="verl")
    assert named.best_match["scheme"] in ("verl:grpo", "verl:grpo_vectorized")
    assert named.best_match["params"]["version"] == "0.9.1"
