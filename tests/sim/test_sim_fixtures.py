"""The committed demo fixtures: the hand-built row's numbers, and the BugFix batch in
sync with the simulator (regenerate with `make fixtures`)."""

import json

import pytest
import torch

from app.core.resources import demo_dir
from app.core.schemas import EpisodeIn
from app.sim import sim_diagnostics
from app.sim.env import sample_batch
from app.sim.make_fixtures import DEMO_SEED, handbuilt_episode
from estimators import gae, returns_to_go

DEMO = demo_dir()


def _row():
    ep = EpisodeIn.model_validate_json((DEMO / "handbuilt.jsonl").read_text().strip())
    assert ep == handbuilt_episode()
    mask = torch.tensor([[k == "policy" for k in ep.kinds]])
    rewards = torch.tensor([ep.rewards], dtype=torch.float64)
    rewards[0, 9] += ep.reward  # the outcome lives on the last policy token
    values = torch.tensor([ep.values], dtype=torch.float64)
    return rewards, mask, values


def test_handbuilt_row_numbers_by_hand():
    rewards, mask, values = _row()
    g1 = returns_to_go(rewards, mask, gamma=1.0)[0]
    # gamma 1: -0.1 - 0.1 + 0.9 = 0.7 at the first call; 0.8 at the second; 0.9 at the last.
    assert g1[[0, 1, 5, 6, 9]].tolist() == pytest.approx([0.7, 0.7, 0.8, 0.8, 0.9])
    g09 = returns_to_go(rewards, mask, gamma=0.9)[0]
    # gamma 0.9: position 5 = 0.9 * (-0.1 + 0.9 * 0.9) = 0.639; position 1 = -0.1 + 0.9 * 0.639 = 0.4751.
    assert float(g09[5]) == pytest.approx(0.639)
    assert float(g09[1]) == pytest.approx(0.4751)
    # GAE at lambda 0 on position 1: -0.1 + V(c5) - V(c1) = -0.1 + 0.6 - 0.4 = 0.1 (not the 9 at position 2).
    a0, _ = gae(rewards, values, mask, gamma=1.0, lam=0.0)
    assert float(a0[0, 1]) == pytest.approx(0.1)
    # A naive recursion stepping into the tool span: -0.1 + 9 - 0.4 = 8.5 and -0.1 + 9 - 0.7 = 8.2.
    v = values[0]
    assert float(rewards[0, 1] + v[2] - v[1]) == pytest.approx(8.5)
    assert float(rewards[0, 6] + v[7] - v[6]) == pytest.approx(8.2)
    # Lambda 1 telescopes to returns minus values on policy tokens.
    a1, _ = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert a1[mask].tolist() == pytest.approx((g1 - values[0])[mask[0]].tolist())


def test_bugfix_demo_batch_is_in_sync_with_the_simulator():
    lines = (DEMO / "bugfix.jsonl").read_text().splitlines()
    eps = [EpisodeIn.model_validate_json(x) for x in lines]
    assert len(eps) == 160
    fresh = sample_batch(20, 8, seed=DEMO_SEED)
    assert [e.tokens for e in eps] == [e.tokens for e in fresh]
    assert [e.meta["turn_values"] for e in eps] == [e.meta["turn_values"] for e in fresh]
    assert all(e.values is not None and len(e.values) == len(e.tokens) for e in eps)
    # The committed meta file holds the diagnostics of these episodes as the code computes them now.
    meta = json.loads((DEMO / "bugfix.meta.json").read_text())
    now = sim_diagnostics(eps)
    assert now["zero_variance_share"] == pytest.approx(0.3)  # 6 all-fail groups of 8 in 160
    for key in ("zero_variance_share", "pass_rate", "useless_credit_share", "mean_calls"):
        assert meta["diagnostics"][key] == pytest.approx(now[key]), key
    assert meta["diagnostics"]["critic"]["explained_variance_train"] > 0.3
    total = sum(p.stat().st_size for p in DEMO.iterdir())
    assert total < 5 * 1024 * 1024
