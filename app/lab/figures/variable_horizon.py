"""The variable-horizon sweep (AgentCreditBench's experiment): on VariableHorizonEnv (STOP pays
stop_rewards[t] and ends, CONTINUE pays continue_reward and goes on), each estimator's per-turn bias
(mean credit - exact advantage at step t) against the policy's stop probability p. Several seeds,
mean ± 1 standard error."""

from __future__ import annotations

import time
from typing import Any

from app.lab.figures.delayed_horizon import SWEEP_PARAMS, check_budget
from app.lab.params import Param, Params, Result
from estimators.oracles import variable_horizon_sweep

NAME = "variable_horizon"
ORDER = 6
VERSION = 1
TITLE = "Variable horizon: per-turn bias vs stop probability"
SUMMARY = "Variable-horizon sweep: per-turn bias of each estimator vs the stop probability (± 1 SE)"
INTRO = """<p class="hint">VariableHorizonEnv: at each step the policy STOPs with probability p (paid <code>stop_rewards[t]</code>) or
CONTINUEs (paid <code>continue_reward</code>); the last step must stop. Episodes that stop early are short, so a baseline that ignores
how far an episode got is biased at later turns. Each point is the mean over <code>seeds</code> independent batches of the
per-turn bias (mean credit − exact advantage at step t) with ± 1 standard error; turns nobody reached are left out.
Registry estimators get γ = 1, the exact critic as values and the exact V as Monte Carlo turn values; the whole batch is one group.
This page shows no gradient metrics, so it has no <code>params</code> (gradient parametrisation) choice.</p>"""

# seeds x batch x stop probabilities x horizon x estimators; the defaults are ~0.4M units.
MAX_WORK = 4_000_000

PARAMS = {
    "stop_probabilities": Param(
        "stop_probabilities", "floats", [0.1, 0.3, 0.5, 0.7, 0.9], 0, 1, max_items=11, help="p in [0, 1]"
    ),
    "stop_rewards": Param(
        "stop_rewards",
        "floats",
        [0.0, 2.0, 1.0, 3.0, 0.0],
        -100,
        100,
        max_items=64,
        help="reward of STOP at t (H entries)",
    ),
    "continue_reward": Param("continue_reward", "float", 0.0, -100, 100, help="reward of CONTINUE"),
    **SWEEP_PARAMS,
    "critic": Param(
        "critic", "choice", "exact", choices=("exact", "zero"), help="values the critic estimators get"
    ),
}


def work(p: Params) -> int:
    """The sweep's work units (see MAX_WORK)."""
    return int(
        p["seeds"] * p["batch"] * len(p["stop_probabilities"]) * len(p["stop_rewards"]) * len(p["estimators"])
    )


def compute(p: Params) -> Result:
    """Per-turn bias per (p, estimator, t), via estimators.oracles.variable_horizon_sweep."""
    check_budget(work(p), MAX_WORK, "seeds x batch x stop probabilities x horizon x estimators")
    started = time.perf_counter()
    seeds = list(range(p["seed"], p["seed"] + p["seeds"]))
    rows = variable_horizon_sweep(
        p["stop_probabilities"],
        p["estimators"],
        seeds,
        p["batch"],
        stop_rewards=p["stop_rewards"],
        continue_reward=p["continue_reward"],
        critic=p["critic"],
    )
    return {
        "figure": NAME,
        "params": p,
        "seeds": seeds,
        "horizon": len(p["stop_rewards"]),
        "rows": rows,
        "seconds": time.perf_counter() - started,
    }


def csv_rows(result: Result) -> list[dict[str, Any]]:
    """One row per (p, estimator, t): pooled bias and steps, per-seed mean, SE and seeds."""
    return [
        {
            "p": r["p"],
            "estimator": r["estimator"],
            "t": r["t"],
            "n": r["n"],
            "bias": r["bias"],
            "bias_mean": r["bias_seeds"]["mean"],
            "bias_se": r["bias_seeds"]["se"],
            "bias_n": r["bias_seeds"]["n"],
        }
        for r in result["rows"]
    ]
