"""Bias and variance of the GAE policy gradient across lambda, on the repair MDP (R1).

One batch of sampled episodes goes through the project's own ``gae`` for every lambda and three
critics; bias and variance are measured against the exact policy gradient of the MDP.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from app.lab.params import Param, Params, Result, as_fraction, param_error
from estimators import gae
from estimators.oracles import (
    episode_gradients,
    exact_gradient,
    random_logits,
    repair_env,
    sample_episodes,
    score_vectors,
    softmax_policy,
    solve,
)

NAME = "lambda"
ORDER = 1
VERSION = 1
TITLE = "Bias and variance of the policy gradient across λ"
SUMMARY = "Figure 1: GAE gradient bias and variance across λ (R1)"
INTRO = """<p class="hint">Repair MDP R1 (a short bug-fixing task with exact values) under a random softmax policy
(<code>logit_seed</code>, <code>logit_scale</code>).
One batch of episodes in the same <code>[B, T]</code> layout as token batches goes through the project's own <code>gae</code> for each λ and three critics:
the exact V of the policy, a stale critic (the exact V of the uniform policy) and none (V = 0). Bias is ‖mean ĝ − g*‖/‖g*‖ against the exact
gradient g* (equal to autograd of J); variance is E‖ĝᵢ − mean ĝ‖² per episode; dotted lines are the Monte Carlo noise floor √(tr Cov / N)/‖g*‖.</p>"""

DEFAULT_LAMS = [0.0, 0.5, 0.8, 0.9, 0.95, 0.97, 0.99, 1.0]
PARAMS = {
    "logit_seed": Param("logit_seed", "int", 10, 0, 1_000_000, help="seed of the policy's random logits"),
    "logit_scale": Param("logit_scale", "float", 0.3, 0, 10, help="theta = scale * N(0, 1); 0 = uniform"),
    "episodes": Param("episodes", "int", 20_000, 100, 200_000, help="episodes sampled (one batch)"),
    "seed": Param("seed", "int", 0, 0, 1_000_000, help="sampling seed"),
    "lams": Param("lams", "floats", DEFAULT_LAMS, 0, 1, max_items=30, help="the lambda grid"),
    "cost": Param("cost", "float", 0.05, 0, 1, help="cost of every call"),
    "horizon": Param("horizon", "int", 5, 1, 10, help="most calls per episode"),
}


def compute(p: Params) -> Result:
    """Relative bias and per-episode variance of the GAE policy gradient on R1, per (critic, lambda).

    One batch of episodes is shared by every (critic, lambda): one [B, T] GAE call each, and the
    per-episode gradients sum_t A_hat[t] * score[t] by one einsum against precomputed score vectors.
    """
    started = time.perf_counter()
    mdp = repair_env(cost=as_fraction(p["cost"]), horizon=p["horizon"])
    dense = mdp.dense()
    pi = softmax_policy(dense, random_logits(mdp, p["logit_seed"], p["logit_scale"]))
    sol = solve(mdp, mdp.policy_from_tensor(pi))
    stale = solve(mdp)  # the exact V of the uniform policy: a critic that has not caught up
    g_star = exact_gradient(mdp, sol, pi).flatten()
    g_norm = float(g_star.norm())
    if g_norm < 1e-12:
        raise param_error(
            "logit_scale", "the exact gradient is zero for this policy; relative bias is undefined"
        )

    n = p["episodes"]
    batch = sample_episodes(dense, pi, n, seed=p["seed"])
    scores = score_vectors(batch, pi)
    t_idx = torch.arange(mdp.horizon).expand(n, -1)
    critics = {
        "exact": sol.value_table(mdp)[t_idx, batch.states] * batch.mask,
        "stale": stale.value_table(mdp)[t_idx, batch.states] * batch.mask,
        "none": torch.zeros_like(batch.rewards),
    }
    labels = {
        "exact": "exact critic (V of π)",
        "stale": "stale critic (V of uniform π)",
        "none": "no critic (V = 0)",
    }
    names = list(critics)
    # One [3B, T] GAE call per lambda: the three critics stacked on the batch axis. float32, as in a
    # training batch (7x faster than float64 here; the bias we measure is ~1e-2, float32 error ~1e-7).
    rewards3 = batch.rewards.repeat(len(names), 1).to(torch.float32)
    mask3 = batch.mask.repeat(len(names), 1).to(torch.float32)
    values3 = torch.cat([critics[c] for c in names]).to(torch.float32)
    adv_by = {}
    for lam in p["lams"]:
        adv, _ = gae(rewards3, values3, mask3, gamma=1.0, lam=lam)
        for i, c in enumerate(names):
            adv_by[(c, lam)] = adv[i * n : (i + 1) * n].to(torch.float64)
    series = []
    for name in names:
        points = []
        for lam in p["lams"]:
            g_i = episode_gradients(adv_by[(name, lam)], scores)
            mean = g_i.mean(0)
            variance = float((g_i - mean).pow(2).sum(-1).mean())
            points.append(
                {
                    "lam": lam,
                    "rel_bias": float((mean - g_star).norm()) / g_norm,
                    "variance": variance,
                    # The bias that sampling alone produces: E||mean - E mean|| ~ sqrt(tr Cov / N).
                    "noise_floor": math.sqrt(variance / n) / g_norm,
                }
            )
        series.append({"critic": name, "label": labels[name], "points": points})

    # TD(0) vs G - V with the exact critic: both are unbiased for A, TD(0) has the lower variance.
    A_step = sol.advantage_table(mdp)[t_idx, batch.states, batch.actions]
    live = batch.mask != 0
    td = gae(rewards3[:n], values3[:n], mask3[:n], gamma=1.0, lam=0.0)[0].to(torch.float64)
    mc = gae(rewards3[:n], values3[:n], mask3[:n], gamma=1.0, lam=1.0)[0].to(torch.float64)
    key = (t_idx * len(mdp.states) + batch.states) * len(mdp.actions) + batch.actions
    n_keys = mdp.horizon * len(mdp.states) * len(mdp.actions)
    diff = (td - A_step)[live]
    sums = torch.zeros(n_keys, dtype=torch.float64).index_add_(0, key[live], diff)
    cnt = torch.zeros(n_keys, dtype=torch.float64).index_add_(0, key[live], torch.ones_like(diff))
    well = cnt >= 100
    td_var = float(td[live].var(unbiased=False))
    mc_var = float(mc[live].var(unbiased=False))
    td_vs_mc = {
        "visits": int(live.sum()),
        "td_variance": td_var,
        "mc_variance": mc_var,
        "ratio": td_var / mc_var if mc_var > 0 else None,
        # The noise each estimate adds around the exact A (its conditional variance, pooled).
        "td_residual_variance": float((td - A_step)[live].pow(2).mean()),
        "mc_residual_variance": float((mc - A_step)[live].pow(2).mean()),
        "max_abs_mean_td_error": float((sums[well] / cnt[well]).abs().max()) if bool(well.any()) else None,
        "pairs_with_100_visits": int(well.sum()),
    }
    return {
        "figure": "lambda",
        "params": p,
        "env": {
            "name": "repair",
            "J": float(sol.J),
            "expected_length": float(sol.expected_length),
            "p_success": float(sol.p_success),
            "sampled_mean_return": float(batch.rewards.sum(-1).mean()),
            "sampled_mean_length": float(batch.length.to(torch.float64).mean()),
        },
        "policy": {
            "states": list(mdp.states),
            "actions": list(mdp.actions),
            "pi": pi[0].tolist(),
        },
        "g_star": g_star.tolist(),
        "g_star_norm": g_norm,
        "series": series,
        "td_vs_mc": td_vs_mc,
        "seconds": time.perf_counter() - started,
    }


def csv_rows(result: Result) -> list[dict[str, Any]]:
    """One row per (critic, lambda)."""
    return [{"critic": s["critic"], **pt} for s in result["series"] for pt in s["points"]]
