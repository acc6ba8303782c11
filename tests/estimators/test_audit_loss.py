"""The audit's bug variants from issue 23: verl's GAE before PR #2337 (the recursion steps over
every response token, tool spans included, while whitening and the loss use the policy mask),
built here with verl 0.9.1's own ``compute_gae_advantage_return`` and ``masked_whiten``; and the
policy-loss findings are not written yet."""

from __future__ import annotations

import pytest
from test_audit import KINDS, VALUES, _codes, _kinds_mask, _one, _pad, _rewards, _rows

from estimators.audit import audit_episodes

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
