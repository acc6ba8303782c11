"""Worked numbers, with the arithmetic in comments: the hand-built row (returns, TD errors, GAE),
a group of eight with one success, and packed transitions (terminated vs truncated GAE)."""

from __future__ import annotations

import pytest
import torch

from estimators import (
    EstimatorInput,
    compute,
    gae,
    group_mean,
    grpo,
    outcome_rewards,
    packed_gae,
    returns_to_go,
    rloo,
    td_errors,
    turn_gae,
)
from tests.estimators.paths import GAE_PATHS, gae_path

F64 = torch.float64

# The hand-built row: three calls of 2, 2 and 1 tokens separated by tool spans of 3 and 2 tokens.
#   position: 0  1 | 2  3  4 | 5  6 | 7  8 | 9
#   kind:     c1 c1| tool    | c2 c2| tool | c3
MASK = torch.tensor([[1, 1, 0, 0, 0, 1, 1, 0, 0, 1]])
# Cost 0.1 on the last token of each call, outcome 1 at the end (on the last policy token).
REWARDS = torch.tensor([[0, -0.1, 0, 0, 0, 0, -0.1, 0, 0, -0.1 + 1.0]], dtype=F64)
# Values: V(c1) = 0.4 at position 1 and V(c5) = 0.6 at position 5; 9 at every tool position is
# deliberate garbage. V(c6) = 0.7 makes the naive number at the last token of call 2
# -0.1 + 9 - V(c6) = 8.2; V(c0) = 0.3 and V(c9) = 0.8 are free choices.
VALUES = torch.tensor([[0.3, 0.4, 9, 9, 9, 0.6, 0.7, 9, 9, 0.8]], dtype=F64)


def naive_gae(rewards, values, gamma, lam):
    """The tool-span bug: every position is a step (tool values are bootstrapped from)."""
    T = rewards.shape[1]
    adv = torch.zeros_like(rewards)
    a = 0.0
    for t in reversed(range(T)):
        nv = values[0, t + 1] if t + 1 < T else 0.0
        a = rewards[0, t] + gamma * nv - values[0, t] + gamma * lam * a
        adv[0, t] = a
    return adv


def test_outcome_rewards_on_last_policy_token():
    m = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1], [0, 0, 0, 0]])
    r = outcome_rewards(m, torch.tensor([1.0, 0.5, 2.0]))
    assert r.tolist() == [[0, 1, 0, 0], [0, 0, 0, 0.5], [0, 0, 0, 0]]


def test_returns_gamma_1_first_call_is_0_7():
    g = returns_to_go(REWARDS, MASK, 1.0)
    # Call 1: -0.1 - 0.1 + 0.9 = 0.7 (position 0 gets the same: its own reward is 0).
    assert g[0, 0].item() == pytest.approx(0.7, abs=1e-12)
    assert g[0, 1].item() == pytest.approx(0.7, abs=1e-12)
    # Call 2: -0.1 + 0.9 = 0.8; call 3: 0.9; tool positions carry 0.
    assert g[0, 5].item() == pytest.approx(0.8, abs=1e-12)
    assert g[0, 9].item() == pytest.approx(0.9, abs=1e-12)
    assert g[0, [2, 3, 4, 7, 8]].abs().max().item() == 0.0


def test_returns_gamma_0_9_discounts_once_per_policy_token():
    g = returns_to_go(REWARDS, MASK, 0.9)
    # Position 6: -0.1 + 0.9 * 0.9 = 0.71; position 5: 0 + 0.9 * 0.71 = 0.639.
    assert g[0, 5].item() == pytest.approx(0.639, abs=1e-12)
    # Position 1: -0.1 + 0.9 * 0.639 = 0.4751 (0.475 rounded): one discount across the
    # three tool positions, not four.
    assert g[0, 1].item() == pytest.approx(0.4751, abs=1e-12)
    assert round(g[0, 1].item(), 3) == 0.475


@pytest.mark.parametrize("path", GAE_PATHS)
def test_gae_lambda_0_skips_tool_values(path):
    with gae_path(path):
        adv, _ = gae(REWARDS, VALUES, MASK, gamma=1.0, lam=0.0)
    # Position 1: -0.1 + V(c5) - V(c1) = -0.1 + 0.6 - 0.4 = 0.1 (not the garbage 9 at position 2).
    assert adv[0, 1].item() == pytest.approx(0.1, abs=1e-12)
    # Position 6: -0.1 + V(c9) - V(c6) = -0.1 + 0.8 - 0.7 = 0.0.
    assert adv[0, 6].item() == pytest.approx(0.0, abs=1e-12)
    naive = naive_gae(REWARDS, VALUES, 1.0, 0.0)
    # Naive: -0.1 + 9 - 0.4 = 8.5 at position 1 and -0.1 + 9 - 0.7 = 8.2 at position 6.
    assert naive[0, 1].item() == pytest.approx(8.5, abs=1e-12)
    assert naive[0, 6].item() == pytest.approx(8.2, abs=1e-12)
    # lambda = 0 is exactly the TD error.
    assert torch.equal(adv, td_errors(REWARDS, VALUES, MASK, 1.0))


@pytest.mark.parametrize("path", GAE_PATHS)
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_gae_lambda_1_is_returns_minus_values(gamma, path):
    with gae_path(path):
        adv, targets = gae(REWARDS, VALUES, MASK, gamma=gamma, lam=1.0)
    expected = (returns_to_go(REWARDS, MASK, gamma) - VALUES) * MASK
    torch.testing.assert_close(adv, expected, atol=1e-12, rtol=0)
    # Value targets = A + V on policy tokens = the returns; 0 on tool positions.
    torch.testing.assert_close(targets, returns_to_go(REWARDS, MASK, gamma), atol=1e-12, rtol=0)
    # gamma = 1 numbers: position 0: 0.7 - 0.3 = 0.4; position 5: 0.8 - 0.6 = 0.2; position 9: 0.9 - 0.8.
    if gamma == 1.0:
        assert adv[0, [0, 5, 9]].tolist() == pytest.approx([0.4, 0.2, 0.1], abs=1e-12)


@pytest.mark.parametrize("path", GAE_PATHS)
def test_turn_gae_hand_row(path):
    # Turns: call 1 (r = -0.1, V = V(c0) = 0.3), call 2 (r = -0.1, V = 0.6), call 3 (r = 0.9, V = 0.8).
    # gamma = 1, lam = 0.5: d3 = 0.9 - 0.8 = 0.1; d2 = -0.1 + 0.8 - 0.6 = 0.1; d1 = -0.1 + 0.6 - 0.3 = 0.2
    # A3 = 0.1; A2 = 0.1 + 0.5 * 0.1 = 0.15; A1 = 0.2 + 0.5 * 0.15 = 0.275.
    with gae_path(path):
        adv, targets = turn_gae(REWARDS, VALUES, MASK, gamma=1.0, lam=0.5)
    assert adv[0].tolist() == pytest.approx([0.275, 0.275, 0, 0, 0, 0.15, 0.15, 0, 0, 0.1], abs=1e-12)
    # Targets: A + V of the turn: 0.575, 0.75, 0.9.
    assert targets[0].tolist() == pytest.approx([0.575, 0.575, 0, 0, 0, 0.75, 0.75, 0, 0, 0.9], abs=1e-12)


# One group of eight with a single success.
EIGHT = torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0], dtype=F64)


def test_group_of_eight_one_success():
    # Group mean 1/8: success 1 - 0.125 = +0.875, failures -0.125.
    gm = group_mean(EIGHT)
    assert gm[0].item() == pytest.approx(0.875) and gm[1].item() == pytest.approx(-0.125)
    # RLOO: success 1 - 0/7 = +1; failure 0 - 1/7 = -0.142857.
    r = rloo(EIGHT)
    assert r[0].item() == pytest.approx(1.0) and r[1].item() == pytest.approx(-1 / 7)
    assert round(r[1].item(), 3) == -0.143
    # Sample std: sqrt((0.875^2 + 7 * 0.125^2) / 7) = sqrt(0.875 / 7) = 0.35355; 0.875 / 0.35355 = 2.4749.
    g = grpo(EIGHT)
    assert round(g[0].item(), 2) == 2.47 and round(g[1].item(), 2) == -0.35
    # Scale factor 1 / 0.35355 = 2.83 for 1 of 8.
    assert round((g[0] / gm[0]).item(), 2) == 2.83


def test_scale_factor_four_of_eight():
    s = torch.tensor([1.0, 1, 1, 1, 0, 0, 0, 0], dtype=F64)
    # Sample std: sqrt(8 * 0.25 / 7) = 0.5345; 1 / 0.5345 = 1.87.
    assert round((grpo(s)[0] / group_mean(s)[0]).item(), 2) == 1.87
    # Population std 0.5 would give exactly 2 (the smallest ratio, at p = 1/2).
    assert (grpo(s, std="population", eps=0)[0] / group_mean(s)[0]).item() == pytest.approx(2.0)


def test_group_of_eight_through_registry_broadcasts():
    # Eight one-token episodes: the score is the reward on the policy token.
    rewards = EIGHT[:, None].repeat(1, 3)
    rewards[:, 1:] = 0
    mask = torch.tensor([[1, 0, 0]] * 8)
    out = compute("rloo", EstimatorInput(rewards=rewards, mask=mask, groups=torch.zeros(8, dtype=torch.long)))
    assert out.advantages[0].tolist() == pytest.approx([1.0, 0, 0])
    assert out.advantages[3, 0].item() == pytest.approx(-1 / 7)


# Packed transitions (terminated vs truncated).
def _packed_example():
    reward, value, next_value = map(
        torch.tensor, ([1.0, 2.0, 10.0], [0.5, 1.0, 3.0], [1.0, 4.0, float("nan")])
    )
    terminated = torch.tensor([False, False, True])
    boundary = torch.tensor([False, True, True])
    return reward, value, next_value, terminated, boundary


def test_packed_gae_worked_example():
    reward, value, next_value, terminated, boundary = _packed_example()
    adv, target = packed_gae(reward, value, next_value, terminated, boundary, 0.5, 0.8)
    # delta = r + 0.5 * bootstrap - V: [1 + 0.5 - 0.5, 2 + 2 - 1, 10 + 0 - 3] = [1, 3, 7]
    # A0 = 1 + (0.5 * 0.8) * 3 = 2.2 (the carry stops at the boundary after transition 1).
    assert adv.tolist() == pytest.approx([2.2, 3.0, 7.0])
    assert not adv.requires_grad and target[1].item() == 4.0


@pytest.mark.parametrize(
    "bad_terminated, bad_boundary",
    [
        ([False, True, False], [False, False, True]),  # a terminal transition that is no boundary
        ([False, False, False], [False, True, False]),  # the fragment is not closed at the end
        ("long", "long"),  # not boolean
    ],
)
def test_packed_gae_rejects_bad_flags(bad_terminated, bad_boundary):
    reward, value, next_value, terminated, boundary = _packed_example()
    if bad_terminated == "long":
        t, b = terminated.long(), boundary.long()
    else:
        t, b = torch.tensor(bad_terminated), torch.tensor(bad_boundary)
    with pytest.raises(ValueError):
        packed_gae(reward, value, next_value, t, b)


def test_packed_gae_rejects_shapes():
    reward, value, next_value, terminated, boundary = _packed_example()
    with pytest.raises(ValueError):
        packed_gae(reward, value[:2], next_value, terminated, boundary)
    with pytest.raises(ValueError):
        packed_gae(reward[:0], value[:0], next_value[:0], terminated[:0], boundary[:0])
    with pytest.raises(ValueError):
        packed_gae(reward[None], value[None], next_value[None], terminated[None], boundary[None])


@pytest.mark.parametrize("path", GAE_PATHS)
def test_hand_computation_truncated_vs_terminal(path):
    # gamma 0.9, lam 0.95; r0 = 0, V0 = 0.4, V1 = 0.6; r1 = 1, truncated with V_final = 0.8.
    # delta1 = 1 + 0.9 * 0.8 - 0.6 = 1.12 = A1; delta0 = 0 + 0.9 * 0.6 - 0.4 = 0.14;
    # A0 = 0.14 + 0.9 * 0.95 * 1.12 = 1.0976.
    rewards = torch.tensor([[0.0, 1.0]], dtype=F64)
    values = torch.tensor([[0.4, 0.6]], dtype=F64)
    mask = torch.ones(1, 2)
    with gae_path(path):
        adv, _ = gae(rewards, values, mask, 0.9, 0.95, last_value=torch.tensor([0.8], dtype=F64))
        # Terminal instead: delta1 = 1 - 0.6 = 0.4; A0 = 0.14 + 0.855 * 0.4 = 0.482.
        adv_t, _ = gae(rewards, values, mask, 0.9, 0.95)
        # NaN last_value means terminated too.
        adv_n, _ = gae(rewards, values, mask, 0.9, 0.95, last_value=torch.tensor([float("nan")], dtype=F64))
    assert adv[0].tolist() == pytest.approx([1.0976, 1.12], abs=1e-12)
    assert adv_t[0].tolist() == pytest.approx([0.482, 0.4], abs=1e-12)
    assert torch.equal(adv_n, adv_t)
    # The same two transitions packed (next_value explicit, boundary after the second):
    adv_p, _ = packed_gae(
        rewards[0],
        values[0],
        torch.tensor([0.6, 0.8], dtype=F64),
        torch.tensor([False, False]),
        torch.tensor([False, True]),
        0.9,
        0.95,
    )
    assert adv_p.tolist() == pytest.approx([1.0976, 1.12], abs=1e-12)


@pytest.mark.parametrize("path", GAE_PATHS)
@pytest.mark.parametrize("lam", [0.0, 0.5, 0.95, 1.0])
def test_recovery_env_credit_of_bad_matches_closed_form(lam, path):
    """RecoveryEnv (docs/lab.md) at q = 1 with the uniform policy and the exact critic:
    V(s0) = 0.75, V(mistake) = 0.5; a successful BAD -> RECOVER episode gets raw GAE credit
    (BAD) = -0.25 + 0.5 lam. Here each action is a 3-token call, separated by a 4-token tool span.
    delta(BAD) = 0 + V(mistake) - V(s0) = -0.25; delta(RECOVER) = 1 - 0.5 = 0.5 (terminal)."""
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1]])  # prompt, call 1, tool, call 2
    rewards = outcome_rewards(mask, torch.tensor([1.0], dtype=F64))
    values = torch.full((1, 12), 7.0, dtype=F64)  # garbage off the turn starts
    values[0, 2], values[0, 9] = 0.75, 0.5
    with gae_path(path):
        adv, _ = turn_gae(rewards, values, mask, gamma=1.0, lam=lam)
    assert adv[0, 2].item() == pytest.approx(-0.25 + 0.5 * lam, abs=1e-12)
    assert adv[0, 9].item() == pytest.approx(0.5, abs=1e-12)  # A(RECOVER) = +0.5 at q = 1
