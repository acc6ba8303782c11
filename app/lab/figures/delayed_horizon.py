"""The delayed-effect horizon sweep (AgentCreditBench's experiment): on DelayedEffectEnv (a GOOD or
BAD first action, then H - 1 zero-advantage distractor steps, the reward at the end), how much
credit each estimator leaks onto the distractors and how well its batch gradient points, against
the horizon H. Several seeds, mean ± 1 standard error."""

from __future__ import annotations

import time
from typing import Any

from app.core.errors import ApiError
from app.lab.params import Param, Params, Result
from estimators import available
from estimators.oracles import delayed_horizon_sweep

NAME = "delayed_horizon"
ORDER = 5
VERSION = 1
TITLE = "Delayed effect: credit leakage and gradient vs horizon"
SUMMARY = "Delayed-effect horizon sweep: credit leakage and gradient cosine vs H, per estimator (± 1 SE)"
INTRO = """<p class="hint">DelayedEffectEnv under the uniform policy: the first action (GOOD or BAD) sets the success probability (4/5 or 1/5),
the next H − 1 steps are distractors with exact advantage 0, and the reward comes at the end. <b>Leakage</b> is the share of |credit| on
the distractors; <b>gradient cosine</b> compares each batch's policy gradient with the exact one. Each point is the mean over
<code>seeds</code> independent batches (seeds seed, seed+1, …) with ± 1 standard error. Registry estimators get γ = 1, the exact
critic as values, the exact V as Monte Carlo turn values and (t, state) as GiGPO's anchor state; the whole batch is one group.
Gradient metrics use <code>params</code>: <code>per_timestep</code> (one softmax table per step, AgentCreditBench's) or <code>shared</code>.</p>"""

ESTIMATORS = ("oracle", *available())
DEFAULT_ESTIMATORS = ["oracle", "grpo", "rloo", "verl_gae", "turn_loo", "gigpo", "monte_carlo"]
MAX_SEEDS = 50
# One work unit = one step of one episode through one estimator (seeds x batch x sum(H) x estimators);
# about 1 microsecond of CPU each, so the cap is a few seconds. The defaults are ~0.5M units.
MAX_WORK = 4_000_000

# The parameters every multi-seed sweep takes (this one and variable_horizon.py).
SWEEP_PARAMS = {
    "estimators": Param(
        "estimators",
        "names",
        DEFAULT_ESTIMATORS,
        choices=ESTIMATORS,
        max_items=12,
        help="oracle or registry names",
    ),
    "seeds": Param("seeds", "int", 5, 1, MAX_SEEDS, help="independent batches per point"),
    "batch": Param("batch", "int", 500, 10, 20_000, help="episodes per batch (one group)"),
    "seed": Param("seed", "int", 0, 0, 1_000_000, help="first seed"),
}

PARAMS = {
    "horizons": Param("horizons", "ints", [2, 4, 8, 16], 2, 64, max_items=12, help="horizons H (2 to 64)"),
    **SWEEP_PARAMS,
    "k": Param("k", "int", 2, 1, 20, help="distractor actions per step"),
    "params": Param(
        "params",
        "choice",
        "per_timestep",
        choices=("per_timestep", "shared"),
        help="gradient parametrisation",
    ),
    "critic": Param(
        "critic", "choice", "exact", choices=("exact", "zero"), help="values the critic estimators get"
    ),
}


def work(p: Params) -> int:
    """The sweep's work units (see MAX_WORK)."""
    return int(p["seeds"] * p["batch"] * sum(p["horizons"]) * len(p["estimators"]))


def check_budget(units: int, limit: int, what: str) -> None:
    """413 naming the work and what to reduce when ``units`` exceeds ``limit``."""
    if units > limit:
        raise ApiError(
            413,
            "too_much_work",
            f"this sweep is {units:,} work units ({what}); the limit is {limit:,}: use fewer seeds, "
            "fewer or shorter horizons, fewer estimators or a smaller batch.",
            field="seeds",
        )


def compute(p: Params) -> Result:
    """Leakage and gradient metrics per (H, estimator), via estimators.oracles.delayed_horizon_sweep."""
    check_budget(work(p), MAX_WORK, "seeds x batch x sum of horizons x estimators")
    started = time.perf_counter()
    seeds = list(range(p["seed"], p["seed"] + p["seeds"]))
    rows = delayed_horizon_sweep(
        p["horizons"], p["estimators"], seeds, p["batch"], k=p["k"], params=p["params"], critic=p["critic"]
    )
    return {
        "figure": NAME,
        "params": p,
        "seeds": seeds,
        "gradient_params": p["params"],
        "rows": rows,
        "seconds": time.perf_counter() - started,
    }


def csv_rows(result: Result) -> list[dict[str, Any]]:
    """One row per (horizon, estimator): each metric's mean, SE and number of seeds."""
    out = []
    for r in result["rows"]:
        row = {"horizon": r["horizon"], "estimator": r["estimator"]}
        for key in ("leakage_ratio", "gradient_cosine"):
            row |= {f"{key}_mean": r[key]["mean"], f"{key}_se": r[key]["se"], f"{key}_n": r[key]["n"]}
        row |= {
            key: r[key]
            for key in ("mean_gradient_cosine", "relative_mean_gradient_error", "gradient_variance")
        }
        row["params"] = result["gradient_params"]
        out.append(row)
    return out
