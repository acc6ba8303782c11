"""The audit's bug variants from issue 23: verl's GAE before PR #2337 (the recursion steps over
every response token, tool spans included, while whitening and the loss use the policy mask),
built here with verl 0.9.1's own ``compute_gae_advantage_return`` and ``masked_whiten``; and an
uploaded ``rewards`` field that puts the outcome on a tool token (``reward_on_non_policy_token`` as a
data finding: a warning under verl's GRPO, which sums the whole row's rewards, an error under verl's
GAE, which drops a reward on a masked token)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from estimators.audit import audit_episodes
from tests.estimators.test_audit import (
    KINDS,
    T_,
    VALUES,
    P,
    Q,
    _codes,
    _kinds_mask,
    _one,
    _pad,
    _rewards,
    _rows,
)

pytestmark = pytest.mark.verl


def test_pre_2337_gae_is_gae_through_tool_spans():
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    verl_F = pytest.importorskip("verl.utils.torch_functional")
    pol, resp = _kinds_mask()
    r, v = _pad(_rewards()), _pad(VALUES)
    # The old loop: the recursion over every response token (tool output included) ...
    _, returns = core.compute_gae_advantage_return(r, v, resp.double(), 0.99, 0.95)
    raw = returns - v
    # ... then whitened over the policy tokens only, and the loss masks tool tokens out.
    adv = verl_F.masked_whiten(raw, pol.double()) * pol
    res = audit_episodes(KINDS, _rows(adv), _rewards(), values=VALUES)
    assert res.best_match["scheme"] == "verl_gae", res.best_match
    p = res.best_match["params"]
    assert (p["mask"], p["gamma"], p["lam"], p["whiten"]) == ("response_recursion", 0.99, 0.95, "batch")
    assert "mismatch_unexplained" not in _codes(res)
    assert "credit_on_non_policy_tokens" not in _codes(res)  # the loss mask is the policy mask
    f = _one(res, "gae_through_tool_spans")
    assert f["severity"] == "error"
    assert "PR #2337" in f["message"]
    # The tokens left of a tool span change (they bootstrap through it); episode 1's last turn does not.
    assert [0, 1] in f["tokens"] and [1, 6] not in f["tokens"]


def _on_tool(rows, at):
    """The rewards with each episode's outcome moved from its last policy token to position ``at[i]``
    (a tool token), as an uploaded ``rewards`` field may hold it."""
    out = [list(r) for r in rows]
    for r, t in zip(out, at, strict=True):
        if t is not None:
            s = sum(r)
            r[:] = [0.0] * len(r)
            r[t] = s
    return out


def test_reward_on_a_tool_token_under_grpo_of_the_row_sum_is_a_warning():
    """verl's GRPO scores an episode by the sum of its token-level rewards, tool tokens included:
    where the reward sits changes nothing, so the finding is a warning that names the reward token."""
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    kinds = [[Q, P, P, T_, T_] for _ in range(4)] + [[Q, P, P, T_, P] for _ in range(4)]
    scores = [1.0, 0.0, 0.5, 1.0, 0.0, 1.0, 0.25, 1.0]
    groups = ["a"] * 4 + ["b"] * 4
    rew = _on_tool(_rewards(scores, kinds), [4, None, 3, None, None, 3, None, None])
    pol = torch.tensor([[k == P for k in ks] for ks in kinds])
    adv, _ = core.compute_grpo_outcome_advantage(
        torch.tensor(rew, dtype=torch.float32), pol.float(), np.array(groups, dtype=object)
    )
    res = audit_episodes(kinds, _rows((adv * pol).double(), kinds), rew, groups=groups)
    assert res.best_match["scheme"] == "grpo", res.best_match
    assert res.best_match["params"]["score"] == "row"  # the row's sum, as verl takes it
    f = _one(res, "reward_on_non_policy_token")
    assert f["severity"] == "warning"
    assert f["tokens"] == [[0, 4], [2, 3], [5, 3]] and f["episodes"] == [0, 2, 5]
    assert f["evidence"]["source"] == "rewards" and f["evidence"]["depends_on_placement"] is False
    assert f["evidence"]["rewards"] == [1.0, 0.5, 1.0] and f["evidence"]["policy_tokens_changed"] == 0
    assert not res.has_error


def test_reward_on_a_tool_token_under_token_gae_is_an_error():
    """verl's GAE with the policy mask skips a reward on a masked (tool) token: placement changes the
    values, so the finding is an error, and the policy tokens it changes are counted."""
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    verl_F = pytest.importorskip("verl.utils.torch_functional")
    pol, _ = _kinds_mask()
    rew = _on_tool(_rewards(), [3, None, 3])  # episodes 0 and 2: the outcome on their first tool token
    r, v = _pad(rew), _pad(VALUES)
    _, returns = core.compute_gae_advantage_return(r, v, pol.double(), 0.99, 0.95)
    adv = verl_F.masked_whiten(returns - v, pol.double()) * pol
    res = audit_episodes(KINDS, _rows(adv), rew, values=VALUES)
    assert res.best_match["scheme"] == "verl_gae", res.best_match
    f = _one(res, "reward_on_non_policy_token")
    assert f["severity"] == "error" and res.has_error
    assert f["tokens"] == [[0, 3], [2, 3]]
    ev = f["evidence"]
    assert ev["depends_on_placement"] is True and ev["rewards"] == [1.0, 1.0]
    # Moved onto the policy token before the span (position 2), both episodes' policy tokens up to
    # it see the reward: positions 1 and 2 of episodes 0 and 2 at least.
    assert ev["policy_tokens_changed"] >= 4
    assert "mismatch_unexplained" not in _codes(res)
