"""Exact oracles: closed forms (docs/lab.md), validation, gradient vs autograd, sampling."""

from __future__ import annotations

import math
from fractions import Fraction as F

import pytest
import torch

from estimators.oracles import (
    credit_metrics,
    delayed_effect_env,
    exact_gradient,
    expected_return,
    random_logits,
    recovery_diagnostic,
    recovery_env,
    repair_env,
    sample_episodes,
    score_vectors,
    softmax_policy,
    solve,
    spearman,
    variable_horizon_env,
)
from estimators.oracles.mdp import TabularMDP

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---- closed forms ------------------------------------------------------------------------------


def test_repair_uniform_exact_numbers():
    sol = solve(repair_env())
    assert sol.J == F(7, 4860)
    assert sol.expected_length == F(211, 81)
    assert sol.p_success == F(32, 243)
    # Last step: submitting from `fixed` at t=4 pays 0.95; read/edit pay -0.05 and are cut off.
    assert sol.Q[4]["fixed"] == {"read": F(-1, 20), "edit": F(-1, 20), "submit": F(19, 20)}
    assert sol.V[4]["fixed"] == F(17, 60)  # (0.95 - 0.05 - 0.05) / 3


def test_repair_visitation_hand_computed():
    d = solve(repair_env()).d
    assert d[0] == {"fresh": 1, "located": 0, "fixed": 0}
    # t=1: read (1/3) -> located, edit (1/3) stays fresh, submit ends.
    assert d[1] == {"fresh": F(1, 3), "located": F(1, 3), "fixed": 0}
    # t=2: fresh 1/9 (edit again); located 1/9 (from fresh read) + 1/9 (located read); fixed 1/9.
    assert d[2] == {"fresh": F(1, 9), "located": F(2, 9), "fixed": F(1, 9)}


@pytest.mark.parametrize("q", [F(1), F(1, 2), F(0), F(3, 10)])
def test_recovery_closed_forms(q):
    sol = solve(recovery_env(q))
    assert sol.V[0]["s0"] == F(1, 2) + q / 4
    assert sol.A[0]["s0"]["BAD"] == q / 4 - F(1, 2)
    assert sol.A[0]["s0"]["GOOD"] == F(1, 2) - q / 4
    assert sol.A[1]["mistake"]["RECOVER"] == q / 2
    assert sol.A[1]["mistake"]["GIVE_UP"] == -q / 2
    assert sol.p_success == F(1, 2) + q / 4


def test_recovery_q1_values():
    sol = solve(recovery_env(1))
    assert (sol.V[0]["s0"], sol.A[0]["s0"]["GOOD"], sol.A[0]["s0"]["BAD"]) == (F(3, 4), F(1, 4), F(-1, 4))
    assert (sol.A[1]["mistake"]["RECOVER"], sol.A[1]["mistake"]["GIVE_UP"]) == (F(1, 2), F(-1, 2))


@pytest.mark.parametrize("horizon,k", [(2, 1), (3, 2), (5, 3)])
def test_delayed_effect(horizon, k):
    sol = solve(delayed_effect_env(horizon=horizon, k=k))
    assert sol.V[0]["s0"] == F(1, 2)
    assert sol.A[0]["s0"] == {"GOOD": F(3, 10), "BAD": F(-3, 10)}
    for t in range(1, horizon):
        for s in ("good", "bad"):
            assert set(sol.A[t][s].values()) == {0}
    assert sol.expected_length == horizon


def test_variable_horizon_v0():
    # V3 = 1/2*3 = 3/2; V2 = 1/2 + 3/4 = 5/4; V1 = 1 + 5/8 = 13/8; V0 = 13/16 = 0.8125.
    sol = solve(variable_horizon_env())
    assert sol.V[0]["s"] == F(13, 16)
    assert float(sol.V[0]["s"]) == 0.8125
    assert sol.Q[4]["s"] == {"STOP": 0}


# ---- validation ---------------------------------------------------------------------------------


def _one_state(transition):
    return TabularMDP(
        "t", ("s",), ("a", "b"), 1, {"s": 1}, lambda _t, _s: ("a",), lambda _t, _s, _a: transition
    )


@pytest.mark.parametrize(
    "transition,match",
    [
        ([(F(3, 2), None, 0, True), (F(-1, 2), None, 0, True)], "in \\[0, 1\\]"),
        ([(float("nan"), None, 0, True)], "finite"),
        ([(float("inf"), None, 0, True)], "finite"),
        ([(F(1, 2), None, 0, True), (F(1, 3), None, 1, True)], "sum to 5/6"),
        ([(0.5, None, 0, True), (0.4, None, 1, True)], "sum to 0.9"),
        ([(F(1), "nowhere", 0, False)], "unknown next state"),
        ([("x", None, 0, True)], "real number"),
    ],
)
def test_solver_rejects_bad_transitions(transition, match):
    with pytest.raises(ValueError, match=match):
        _one_state(transition)


def test_solver_rejects_bad_policies():
    mdp = recovery_env()
    pol = mdp.uniform_policy()
    bad = dict(pol)
    bad[(0, "s0")] = {"GOOD": F(1, 2), "BAD": F(1, 4)}
    with pytest.raises(ValueError, match="sum to 3/4"):
        solve(mdp, bad)
    bad[(0, "s0")] = {"GOOD": F(1, 2), "BAD": F(1, 4), "RECOVER": F(1, 4)}
    with pytest.raises(ValueError, match="unavailable action 'RECOVER'"):
        solve(mdp, bad)
    bad[(0, "s0")] = {"GOOD": float("nan"), "BAD": 0.5}
    with pytest.raises(ValueError, match="finite"):
        solve(mdp, bad)
    bad[(0, "s0")] = {"GOOD": 1.5, "BAD": -0.5}
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        solve(mdp, bad)
    del bad[(0, "s0")]
    with pytest.raises(ValueError, match="no distribution"):
        solve(mdp, bad)
    # Zero mass on an unavailable action is fine; floats within 1e-9 of 1 are fine.
    ok = dict(pol)
    ok[(0, "s0")] = {"GOOD": 0.1 + 0.2, "BAD": 0.7, "RECOVER": 0.0}
    assert abs(float(solve(mdp, ok).J) - (0.3 + 0.7 * 0.5)) < 1e-12


@pytest.mark.parametrize("q", [-0.1, 1.5, float("nan")])
def test_env_parameters_validated(q):
    with pytest.raises(ValueError):
        recovery_env(q)


def test_env_structure_validated():
    with pytest.raises(ValueError, match="horizon"):
        delayed_effect_env(horizon=1)
    with pytest.raises(ValueError, match="distractor"):
        delayed_effect_env(k=0)
    with pytest.raises(ValueError, match="cost"):
        repair_env(cost=-0.1)
    with pytest.raises(ValueError, match="horizon"):
        repair_env(horizon=0)


# ---- exact gradient == autograd of J --------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [repair_env, recovery_env, delayed_effect_env, variable_horizon_env, lambda: recovery_env(F(1, 3))],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_gradient_equals_autograd(make, seed):
    mdp = make()
    dense = mdp.dense()
    theta = random_logits(mdp, seed=seed, scale=1.0).requires_grad_(True)
    pi = softmax_policy(dense, theta)
    J = expected_return(dense, pi)
    J.backward()
    sol = solve(mdp, mdp.policy_from_tensor(pi))
    assert abs(float(sol.J) - J.item()) < 1e-12
    g = exact_gradient(mdp, sol, pi)
    assert torch.allclose(g, theta.grad, atol=1e-12, rtol=0)
    assert theta.grad.abs().max() > 1e-3  # a real gradient, not zeros on both sides


def test_exact_gradient_per_time_matches_autograd():
    mdp = repair_env()
    dense = mdp.dense()
    theta = (
        0.7 * torch.randn(mdp.horizon, 3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ).requires_grad_(True)
    pi = softmax_policy(dense, theta)
    expected_return(dense, pi).backward()
    g = exact_gradient(mdp, solve(mdp, mdp.policy_from_tensor(pi)), pi, shared=False)
    assert torch.allclose(g, theta.grad, atol=1e-12, rtol=0)


# ---- vectorised sampling ------------------------------------------------------------------------


def test_sampling_matches_exact_moments():
    mdp = repair_env()
    dense = mdp.dense()
    pi = softmax_policy(dense, random_logits(mdp, seed=3, scale=0.8))
    sol = solve(mdp, mdp.policy_from_tensor(pi))
    n = 40_000
    b = sample_episodes(dense, pi, n, seed=0)
    assert b.states.shape == (n, 5) and b.mask.dtype == torch.float64
    G = b.rewards.sum(-1)
    se = G.std().item() / math.sqrt(n)
    assert abs(G.mean().item() - float(sol.J)) < 4 * se
    L = b.length.to(torch.float64)
    assert abs(L.mean().item() - float(sol.expected_length)) < 4 * L.std().item() / math.sqrt(n)
    ps = float(sol.p_success)
    assert abs(b.success.double().mean().item() - ps) < 4 * math.sqrt(ps * (1 - ps) / n)
    # Visitation: fraction of episodes in `located` at t=2.
    d = float(sol.d[2]["located"])
    freq = ((b.states[:, 2] == 1) & (b.mask[:, 2] == 1)).double().mean().item()
    assert abs(freq - d) < 4 * math.sqrt(d * (1 - d) / n)
    # Masks are prefixes; truncated episodes ran all 5 steps without a submit.
    assert torch.all(b.mask[:, 1:] <= b.mask[:, :-1])
    assert torch.all(b.length[b.truncated] == 5)
    assert torch.all(b.actions[b.truncated, 4] != 2)
    # Same seed, same batch.
    b2 = sample_episodes(dense, pi, n, seed=0)
    assert torch.equal(b.actions, b2.actions)


def test_sampled_td_errors_match_exact_advantages():
    # With the exact critic, the mean TD error of each visited (t, s, a) is A(t, s, a).
    mdp = repair_env()
    dense = mdp.dense()
    pi = softmax_policy(dense, random_logits(mdp, seed=10, scale=0.3))
    sol = solve(mdp, mdp.policy_from_tensor(pi))
    V = sol.value_table(mdp)
    b = sample_episodes(dense, pi, 30_000, seed=1)
    t_idx = torch.arange(5).expand_as(b.states)
    v = V[t_idx, b.states] * b.mask
    v_next = torch.cat([v[:, 1:], torch.zeros(len(v), 1, dtype=v.dtype)], 1)
    delta = b.rewards + v_next - v
    A = sol.advantage_table(mdp)[t_idx, b.states, b.actions]
    live = b.mask == 1
    key = (t_idx * 9 + b.states * 3 + b.actions)[live]
    diff = (delta - A)[live]
    sums = torch.zeros(45, dtype=torch.float64).index_add_(0, key, diff)
    cnt = torch.zeros(45, dtype=torch.float64).index_add_(0, key, torch.ones_like(diff))
    frequent = cnt > 1000
    assert frequent.sum() >= 10
    assert (sums[frequent] / cnt[frequent]).abs().max() < 0.03


def test_score_vectors_rows():
    mdp = recovery_env()
    dense = mdp.dense()
    pi = softmax_policy(dense, torch.zeros(2, 4, dtype=torch.float64))
    b = sample_episodes(dense, pi, 64, seed=0)
    sc = score_vectors(b, pi).reshape(64, 2, 2, 4)
    i = int(torch.nonzero(b.actions[:, 0] == 1)[0])  # an episode that chose BAD first
    # Row s0 of step 0: e_BAD - (1/2, 1/2, 0, 0).
    assert sc[i, 0, 0].tolist() == [-0.5, 0.5, 0.0, 0.0]
    assert sc[i, 0, 1].abs().sum() == 0
    j = int(torch.nonzero(b.actions[:, 0] == 0)[0])  # GOOD ended the episode: step 1 is masked
    assert sc[j, 1].abs().sum() == 0


# ---- credit metrics -----------------------------------------------------------------------------


def test_spearman_average_ranks():
    # x ranks (ties averaged): [0.5, 0.5, 2, 3]; y ranks [0, 1, 2, 3]. Centred: [-1, -1, .5, 1.5],
    # [-1.5, -.5, .5, 1.5]; cov = 1.5+.5+.25+2.25 = 4.5; |x| = sqrt(4.5), |y| = sqrt(5) -> 4.5/sqrt(22.5).
    x = torch.tensor([1.0, 1.0, 2.0, 3.0])
    y = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert abs(spearman(x, y) - 4.5 / math.sqrt(22.5)) < 1e-12
    assert spearman(torch.ones(4), y) == 0.0


def test_credit_metrics_hand_example():
    # Two episodes, two steps; second episode stops after one step.
    credit = torch.tensor([[1.0, 0.5], [-1.0, 9.0]])
    true_adv = torch.tensor([[0.5, 0.0], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    keys = torch.tensor([[0, 1], [0, 1]])
    m = credit_metrics(credit, true_adv, mask, keys)
    # residuals on live steps: 0.5, 0.5, -0.5 -> rmse = 0.5.
    assert m["rmse"] == pytest.approx(0.5)
    # key 0 residuals {0.5, -0.5} centre to {0.5, -0.5}; key 1 {0.5} centres to 0 -> sqrt(0.5/3).
    assert m["centered_rmse"] == pytest.approx(math.sqrt(0.5 / 3))
    assert m["multi_visit_fraction"] == pytest.approx(2 / 3)
    assert m["sign_accuracy"] == 1.0 and m["sign_scored"] == 2 and m["sign_excluded"] == 1
    # leakage: |0.5| on the A=0 step over |1|+|0.5|+|-1| = 2.5.
    assert m["leakage_ratio"] == pytest.approx(0.5 / (2.5 + 1e-8))
    # AgentCreditBench's per-turn variance is the credit's variance at t; ours is residual_variance.
    assert m["per_turn"][1] == {"t": 1, "n": 1, "bias": 0.5, "variance": 0.0, "residual_variance": 0.0}
    assert m["per_turn"][0] == {"t": 0, "n": 2, "bias": 0.0, "variance": 1.0, "residual_variance": 0.25}
    assert "gradient_variance" not in m


@pytest.mark.parametrize("params", ["per_timestep", "shared"])
def test_gradient_metrics_of_exact_advantage(params):
    # Exact A as credit is an unbiased gradient: relative error near the Monte Carlo floor.
    mdp = repair_env()
    dense = mdp.dense()
    pi = softmax_policy(dense, random_logits(mdp, seed=10, scale=0.3))
    sol = solve(mdp, mdp.policy_from_tensor(pi))
    b = sample_episodes(dense, pi, 20_000, seed=2)
    t_idx = torch.arange(5).expand_as(b.states)
    A = sol.advantage_table(mdp)[t_idx, b.states, b.actions] * b.mask
    sc = score_vectors(b, pi)
    g = exact_gradient(mdp, sol, pi, shared=params == "shared")
    m = credit_metrics(A, A, b.mask, t_idx * 3 + b.states, sc, g, params=params)
    assert m["params"] == params and "gradient_variance" not in m
    floor = math.sqrt(m["per_episode_gradient_variance"] / 20_000) / g.norm().item()
    assert m["relative_mean_gradient_error"] < 3 * floor
    assert m["gradient_cosine"] > 0.99
    assert m["rmse"] == 0.0 and m["sign_accuracy"] == 1.0
    # A constant credit of 1 for every step is not the gradient.
    bad = credit_metrics(b.mask, A, b.mask, t_idx * 3 + b.states, sc, g, params=params)
    assert bad["relative_mean_gradient_error"] > 0.5


def test_gradient_params_differ_and_are_checked():
    # Per-timestep gradient blocks sum to the shared gradient; a shared g* under the per-timestep
    # default is refused with a message naming the fix.
    mdp = delayed_effect_env(horizon=4)
    dense = mdp.dense()
    pi = softmax_policy(dense, random_logits(mdp, seed=1, scale=0.5))
    sol = solve(mdp, mdp.policy_from_tensor(pi))
    g_t = exact_gradient(mdp, sol, pi, shared=False)
    assert torch.allclose(g_t.sum(0), exact_gradient(mdp, sol, pi), atol=1e-15)
    b = sample_episodes(dense, pi, 500, seed=0)
    t_idx = torch.arange(4).expand_as(b.states)
    A = sol.advantage_table(mdp)[t_idx, b.states, b.actions] * b.mask
    sc = score_vectors(b, pi)
    keys = t_idx * 3 + b.states
    per_t = credit_metrics(b.mask, A, b.mask, keys, sc, g_t)
    shared = credit_metrics(b.mask, A, b.mask, keys, sc, g_t.sum(0), params="shared")
    assert per_t["relative_mean_gradient_error"] != pytest.approx(shared["relative_mean_gradient_error"])
    with pytest.raises(ValueError, match="shared=False"):
        credit_metrics(b.mask, A, b.mask, keys, sc, g_t.sum(0))
    with pytest.raises(ValueError, match="params"):
        credit_metrics(b.mask, A, b.mask, keys, sc, g_t, params="tied")


def test_recovery_diagnostic_selects_bad_recover_successes():
    credit = torch.tensor([[0.3, 0.6], [-0.2, 0.4], [0.9, 0.0], [0.1, 0.2]])
    actions = torch.tensor([[1, 2], [1, 2], [0, 0], [1, 3]])
    success = torch.tensor([True, True, True, False])
    d = recovery_diagnostic(credit, actions, success, bad=1, recover=2)
    assert d["n_selected"] == 2
    assert d["credit_bad"] == pytest.approx(0.05) and d["credit_recover"] == pytest.approx(0.5)
    assert d["both_positive"] == 0.5


# ---- properties ---------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_logits = st.lists(st.floats(-3, 3, allow_nan=False), min_size=9, max_size=9)


@settings(max_examples=25, deadline=None)
@given(_logits, st.integers(1, 6), st.fractions(0, 1, max_denominator=20))
def test_property_gradient_equals_autograd(values, horizon, cost):
    mdp = repair_env(cost=cost, horizon=horizon)
    dense = mdp.dense()
    theta = torch.tensor(values, dtype=torch.float64).reshape(3, 3).requires_grad_(True)
    pi = softmax_policy(dense, theta)
    expected_return(dense, pi).backward()
    sol = solve(mdp, mdp.policy_from_tensor(pi))
    assert torch.allclose(exact_gradient(mdp, sol, pi), theta.grad, atol=1e-10, rtol=0)
    # V is the exact expectation: J in [-cost * H, 1 - cost].
    assert -cost * horizon <= sol.J <= 1 - cost


@settings(max_examples=25, deadline=None)
@given(_logits, st.integers(0, 10_000), st.fractions(0, 1, max_denominator=10))
def test_property_sampled_batches_are_well_formed(values, seed, q):
    for mdp in (repair_env(), recovery_env(q)):
        dense = mdp.dense()
        S, A = len(mdp.states), len(mdp.actions)
        theta = torch.tensor(values[: S * A], dtype=torch.float64).reshape(S, A)
        pi = softmax_policy(dense, theta)
        b = sample_episodes(dense, pi, 257, seed=seed)
        assert torch.all(b.mask[:, 1:] <= b.mask[:, :-1])  # running, then stopped for good
        assert torch.all(b.mask[:, 0] == 1)
        off = b.mask == 0
        assert torch.all(b.rewards[off] == 0) and torch.all(b.actions[off] == 0)
        # Every chosen action was available in its (t, state).
        t_idx = torch.arange(mdp.horizon).expand_as(b.states)
        assert torch.all(dense.avail[t_idx, b.states, b.actions][~off])
        assert torch.equal(b.length, b.mask.sum(-1).long())
