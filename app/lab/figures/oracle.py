"""The oracle endpoint: exact V, Q and A of every (t, state, action), visitation, J and E[length]
of one oracle MDP under one policy (JSON and CSV only; no page)."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import torch

from app.lab.params import Param, Params, Result, as_fraction, param_error
from estimators.oracles import (
    delayed_effect_env,
    exact_gradient,
    random_logits,
    recovery_env,
    repair_env,
    softmax_policy,
    solve,
    variable_horizon_env,
)

NAME = "oracle"
ORDER = 5
VERSION = 1
TITLE = None  # an API twin only
SUMMARY = "Exact V, Q, A, visitation, J and E[length] of an oracle MDP"
INTRO = ""

PARAMS = {
    "env": Param("env", "choice", "repair", choices=("repair", "recovery", "delayed", "horizon")),
    "logit_seed": Param("logit_seed", "int", 0, 0, 1_000_000),
    "logit_scale": Param("logit_scale", "float", 0.0, 0, 10, help="0 = the uniform policy (exact fractions)"),
    "q": Param("q", "float", 1.0, 0, 1, help="recovery: recovery-success probability"),
    "cost": Param("cost", "float", 0.05, 0, 1, help="repair: cost per call"),
    "horizon": Param("horizon", "int", 0, 0, 20, help="repair/delayed: horizon (0 = the env's default)"),
    "k": Param("k", "int", 2, 1, 20, help="delayed: distractor actions"),
    "p_good": Param("p_good", "float", 0.8, 0, 1),
    "p_bad": Param("p_bad", "float", 0.2, 0, 1),
    "stop_rewards": Param("stop_rewards", "floats", [0.0, 2.0, 1.0, 3.0, 0.0], -1e6, 1e6, max_items=20),
    "p_stop": Param("p_stop", "float", -1.0, -1, 1, help="horizon env: STOP probability (-1 = use logits)"),
}


def _frac_str(x: Fraction, exact: bool) -> str | None:
    return str(x) if exact else None


def compute(p: Params) -> Result:
    """Exact V, Q, A of every (t, state, action), visitation, J and E[length] for one env and policy.

    Fraction strings are given when the policy is exact (uniform, or a decimal STOP probability);
    softmax policies from random logits are irrational, so only floats are meaningful there.
    """
    env = p["env"]
    if env == "repair":
        mdp = repair_env(cost=as_fraction(p["cost"]), horizon=p["horizon"] or 5)
    elif env == "recovery":
        mdp = recovery_env(as_fraction(p["q"]))
    elif env == "delayed":
        if p["horizon"] == 1:
            raise param_error("horizon", "delayed needs horizon >= 2")
        mdp = delayed_effect_env(
            horizon=p["horizon"] or 3,
            k=p["k"],
            p_good=as_fraction(p["p_good"]),
            p_bad=as_fraction(p["p_bad"]),
        )
    else:
        mdp = variable_horizon_env([as_fraction(x) for x in p["stop_rewards"]])
    dense = mdp.dense()
    if env == "horizon" and p["p_stop"] >= 0:
        ps = as_fraction(p["p_stop"])
        # Exact probabilities where the policy has them, floats from a softmax otherwise.
        policy: Mapping[tuple[int, str], Mapping[str, Fraction | float]] = {
            (t, s): ({"STOP": ps, "CONTINUE": 1 - ps} if len(acts) == 2 else {"STOP": Fraction(1)})
            for (t, s), acts in mdp.avail.items()
        }
        pi = torch.zeros(dense.avail.shape, dtype=torch.float64)
        for (t, s), dist in policy.items():
            for a, v in dist.items():
                pi[t, mdp.s_index[s], mdp.a_index[a]] = float(v)
        exact = True
    elif p["logit_scale"] == 0:
        policy = mdp.uniform_policy()
        pi = softmax_policy(dense, torch.zeros(len(mdp.states), len(mdp.actions), dtype=torch.float64))
        exact = True
    else:
        pi = softmax_policy(dense, random_logits(mdp, p["logit_seed"], p["logit_scale"]))
        policy = mdp.policy_from_tensor(pi)
        exact = False
    sol = solve(mdp, policy)
    g = exact_gradient(mdp, sol, pi)
    rows = []
    for t in range(mdp.horizon):
        for s in mdp.states:
            for a in mdp.avail[(t, s)]:
                rows.append(
                    {
                        "t": t,
                        "state": s,
                        "action": a,
                        "pi": float(sol.policy[(t, s)][a]),
                        "visitation": float(sol.d[t][s]),
                        "reachable": sol.d[t][s] > 0,
                        "V": float(sol.V[t][s]),
                        "Q": float(sol.Q[t][s][a]),
                        "A": float(sol.A[t][s][a]),
                        "V_exact": _frac_str(sol.V[t][s], exact),
                        "Q_exact": _frac_str(sol.Q[t][s][a], exact),
                        "A_exact": _frac_str(sol.A[t][s][a], exact),
                    }
                )
    return {
        "figure": "oracle",
        "params": p,
        "env": env,
        "horizon": mdp.horizon,
        "states": list(mdp.states),
        "actions": list(mdp.actions),
        "exact_fractions": exact,
        "J": float(sol.J),
        "J_exact": _frac_str(sol.J, exact),
        "expected_length": float(sol.expected_length),
        "expected_length_exact": _frac_str(sol.expected_length, exact),
        "p_success": float(sol.p_success),
        "p_success_exact": _frac_str(sol.p_success, exact),
        "gradient": {"shape": "[S, A], theta shared across t", "values": g.tolist()},
        "rows": rows,
    }


def csv_rows(result: Result) -> list[dict[str, Any]]:
    """One row per (t, state, action)."""
    rows: list[dict[str, Any]] = result["rows"]
    return rows
