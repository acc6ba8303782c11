"""The multi-seed runner, the sweep data, the new environment parameters and time-dependent
policies (estimators.oracles)."""

from __future__ import annotations

import math
from fractions import Fraction as F

import pytest
import torch

from estimators.oracles import (
    benchmark,
    credit_metrics,
    delayed_effect_env,
    delayed_horizon_sweep,
    exact_gradient,
    recovery_env,
    sample_episodes,
    score_vectors,
    solve,
    stop_probability_policy,
    time_dependent_policy,
    variable_horizon_env,
    variable_horizon_sweep,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_continue_reward_and_long_delayed_horizon():
    # continue_reward c: V_{H-1} = 0 (forced STOP pays stop_rewards[-1] = 0); with p = 1/2,
    # V_t = (stop_t + c + V_{t+1}) / 2.
    sol = solve(variable_horizon_env(continue_reward=F(1, 10)))
    v = F(0)
    for stop in reversed((0, 2, 1, 3)):
        v = (stop + F(1, 10) + v) / 2
    assert sol.V[0]["s"] == v
    assert solve(variable_horizon_env()).V[0]["s"] == F(13, 16)
    sol = solve(delayed_effect_env(horizon=64))
    assert sol.A[0]["s0"] == {"GOOD": F(3, 10), "BAD": F(-3, 10)}
    assert sol.expected_length == 64
    with pytest.raises(ValueError, match=r"\[2, 64\]"):
        delayed_effect_env(horizon=65)


def test_time_dependent_policies():
    env = variable_horizon_env()
    pi = stop_probability_policy(env, [0.1, 0.2, 0.3, 0.4, 0.5])
    stop, cont = env.a_index["STOP"], env.a_index["CONTINUE"]
    assert pi[:, 0, stop].tolist() == pytest.approx([0.1, 0.2, 0.3, 0.4, 1.0])  # last step forces STOP
    assert pi[4, 0, cont].item() == 0.0
    # V0 by hand for the time-dependent policy equals the exact solver's.
    v = 0.0
    for t in reversed(range(4)):
        p = [0.1, 0.2, 0.3, 0.4][t]
        v = p * (0, 2, 1, 3)[t] + (1 - p) * v
    assert float(solve(env, env.policy_from_tensor(pi)).V[0]["s"]) == pytest.approx(v, abs=1e-12)
    with pytest.raises(ValueError, match="one per timestep"):
        stop_probability_policy(env, [0.5, 0.5])
    with pytest.raises(ValueError, match="sum to"):
        time_dependent_policy(env, lambda t, _s: {"STOP": 0.7} if t < 4 else {"STOP": 1.0})


def test_benchmark_mean_se_and_across_seed_gradient_variance():
    env = recovery_env()
    res = benchmark(env, ["oracle", "rloo", "grpo"], seeds=[3, 4, 5, 6], batch=300)
    rows = {r["name"]: r for r in res["estimators"]}
    assert res["params"] == "per_timestep" and res["seeds"] == [3, 4, 5, 6]
    # Recompute RLOO's figures seed by seed with the one-batch metrics.
    dense = env.dense()
    pi = dense.avail.double() / dense.avail.sum(-1, keepdim=True)
    sol = solve(env)
    g = exact_gradient(env, sol, pi, shared=False).reshape(2, -1)
    rmses, grads = [], []
    for seed in (3, 4, 5, 6):
        b = sample_episodes(dense, pi, 300, seed=seed)
        t_idx = torch.arange(2).expand(300, 2)
        adv = sol.advantage_table(env)[t_idx, b.states, b.actions] * b.mask
        s = b.rewards.sum(1)
        credit = ((s - s.mean()) * 300 / 299)[:, None] * b.mask  # RLOO, whole batch one group
        sc = score_vectors(b, pi)
        m = credit_metrics(credit, adv, b.mask, t_idx * 2 + b.states, sc, g)
        rmses.append(m["rmse"])
        grads.append(torch.einsum("bt,btp->tp", credit, sc).reshape(-1) / 300)
    mean = sum(rmses) / 4
    se = math.sqrt(sum((x - mean) ** 2 for x in rmses) / 3 / 4)
    assert rows["rloo"]["metrics"]["rmse"]["mean"] == pytest.approx(mean, abs=1e-12)
    assert rows["rloo"]["metrics"]["rmse"]["se"] == pytest.approx(se, abs=1e-12)
    G = torch.stack(grads)
    var = float((G - G.mean(0)).square().sum(1).mean())
    assert rows["rloo"]["gradient_variance"] == pytest.approx(var, rel=1e-9)
    rel = float((G.mean(0) - g.reshape(-1)).norm() / g.norm())
    assert rows["rloo"]["relative_mean_gradient_error"] == pytest.approx(rel, rel=1e-9)
    # The oracle: exact credit, zero rmse with zero SE; its gradient error is sampling noise only.
    assert rows["oracle"]["metrics"]["rmse"] == {"mean": 0.0, "se": 0.0, "n": 4}
    assert rows["oracle"]["mean_gradient_cosine"] > 0.99
    # Whitened GRPO is off in scale: far from g* though well aligned.
    assert rows["grpo"]["relative_mean_gradient_error"] > 0.5
    # Per-turn, pooled over seeds: 1200 episodes at t=0.
    assert rows["oracle"]["per_turn"][0]["n"] == 1200
    assert rows["rloo"]["per_turn_seeds"][0]["bias"]["n"] == 4


def test_benchmark_validates():
    env = recovery_env()
    with pytest.raises(ValueError, match="unique"):
        benchmark(env, ["oracle"], [1, 1], 10)
    with pytest.raises(ValueError, match="params"):
        benchmark(env, ["oracle"], 2, 10, params="tied")
    with pytest.raises(ValueError, match="batch"):
        benchmark(env, ["oracle"], 2, 0)
    with pytest.raises(KeyError, match="unknown estimator"):
        benchmark(env, ["nope"], 2, 10)


def test_benchmark_turn_estimators_and_custom_fn():
    # turn_loo, gigpo and monte_carlo run on oracle batches; monte_carlo with exact values is
    # r + V(next) - V: the exact advantage where the transition is deterministic (t = 0), unbiased
    # elsewhere; a custom (label, fn) pair is scored like the rest.
    env = delayed_effect_env(horizon=4)
    res = benchmark(
        env,
        ["monte_carlo", "turn_loo", "gigpo", ("zeros", lambda ctx: torch.zeros_like(ctx.true_adv))],
        seeds=3,
        batch=200,
    )
    rows = {r["name"]: r for r in res["estimators"]}
    t0 = rows["monte_carlo"]["per_turn"][0]
    assert t0["bias"] == pytest.approx(0.0, abs=1e-12) and t0["residual_variance"] == pytest.approx(
        0.0, abs=1e-12
    )
    assert abs(rows["monte_carlo"]["per_turn"][3]["bias"]) < 0.05
    assert rows["zeros"]["mean_gradient_cosine"] is None  # a zero gradient has no direction
    assert rows["zeros"]["relative_mean_gradient_error"] == pytest.approx(1.0)
    # Outcome-like credit leaks onto the distractors (A = 0 there): leakage ~ 3/4 of |credit|.
    assert rows["turn_loo"]["metrics"]["leakage_ratio"]["mean"] == pytest.approx(0.75, abs=1e-6)


def test_sweeps():
    rows = delayed_horizon_sweep([2, 6], ["oracle", "rloo"], seeds=3, batch=200)
    by = {(r["horizon"], r["estimator"]): r for r in rows}
    assert by[(2, "oracle")]["leakage_ratio"]["mean"] == 0.0
    # RLOO's broadcast credit: the share on the H-1 distractors is (H-1)/H.
    assert by[(6, "rloo")]["leakage_ratio"]["mean"] == pytest.approx(5 / 6, abs=1e-6)
    assert by[(2, "rloo")]["leakage_ratio"]["mean"] == pytest.approx(1 / 2, abs=1e-6)
    vrows = variable_horizon_sweep([0.5, 1.0], ["oracle", "turn_loo"], seeds=3, batch=200)
    assert {r["p"] for r in vrows} == {0.5, 1.0}
    # p = 1 stops at t = 0: only turn 0 exists.
    assert {r["t"] for r in vrows if r["p"] == 1.0} == {0}
    assert all(r["bias"] == 0.0 for r in vrows if r["estimator"] == "oracle")
