"""The recovery diagnostic: on RecoveryEnv (a bad action, then a recovering one), how much credit
each estimator gives the bad step and the recovery on successful episodes, against the exact
advantage, this project's estimators and verl's own functions when installed."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from fractions import Fraction
from types import ModuleType
from typing import Any

import torch

from app.core.errors import ApiError
from app.core.schemes import BASELINES
from app.lab.params import Param, Params, Result, as_fraction
from estimators import EstimatorInput, available, gae
from estimators import compute as run_estimator
from estimators.oracles import (
    benchmark,
    credit_metrics,
    exact_gradient,
    recovery_diagnostic,
    recovery_env,
    score_vectors,
    softmax_policy,
    solve,
)
from estimators.oracles.policy import EpisodeBatch
from estimators.oracles.runner import BatchContext, _mean_se

NAME = "recovery"
ORDER = 4
VERSION = 2
TITLE = "The recovery diagnostic"
SUMMARY = "Figure 4: recovery diagnostic and credit metrics"
INTRO = """<p class="hint">RecoveryEnv under the uniform policy (q = recovery-success probability). On successful BAD → RECOVER episodes: the mean credit on BAD and on
RECOVER and the share where both are positive, for the exact advantage, this project's estimators and verl 0.9.1's own functions when installed
(one tensor cell per turn, float64, the whole batch one group). Below: AgentCreditBench's credit metrics on the same batch.
With <code>seeds</code> &gt; 1, every number is the mean over that many independent batches (seeds seed, seed+1, …) with ± 1 standard error.
Gradient metrics use per-timestep parameters (one softmax table per step, AgentCreditBench's parametrisation).</p>"""

MAX_SEEDS = 30
# seeds x batch cap (one work unit = one episode through every row): ~2-3 s of CPU at the cap.
MAX_EPISODES = 200_000

PARAMS = {
    "q": Param("q", "float", 1.0, 0, 1, help="recovery-success probability"),
    "batch": Param("batch", "int", 2000, 10, 200_000, help="episodes in the batch (one group)"),
    "seed": Param("seed", "int", 0, 0, 1_000_000, help="first seed"),
    "seeds": Param(
        "seeds", "int", 1, 1, MAX_SEEDS, help="independent batches (seed, seed+1, ...); > 1 draws ± 1 SE"
    ),
    "verl": Param("verl", "choice", "auto", choices=("auto", "off"), help="also run verl's own functions"),
}


def _verl_algos() -> tuple[ModuleType | None, Callable[..., Any] | None, str | None]:
    """verl's core_algos module, or the reason it is unavailable (first import takes ~10 s)."""
    try:
        import verl.trainer.ppo.core_algos as core_algos  # noqa: PLC0415
        from verl.trainer.config.algorithm import AlgoConfig  # noqa: PLC0415
    except Exception as exc:  # verl is optional; any import failure just drops its rows
        return None, None, f"{type(exc).__name__}: {exc}"
    return core_algos, AlgoConfig, None


# This project's outcome estimators: (registry name, row label, parameters).
OURS: list[tuple[str, str, dict[str, Any]]] = [
    *((name, BASELINES[name], {}) for name in ("grpo", "dr_grpo", "rloo")),
    ("reinforce_plus_plus", "REINFORCE++ (whitened)", {}),
]
GAE_ROWS = [
    ("gae_exact_lam1", "GAE, exact critic, λ=1 (whitened)", "exact", 1.0),
    ("gae_exact_lam0", "GAE, exact critic, λ=0 (whitened)", "exact", 0.0),
    ("gae_zero_lam1", "GAE, zero critic, λ=1 (whitened)", "zero", 1.0),
]


CreditFn = Callable[[BatchContext], torch.Tensor]
# The exact value of every step of a sampled batch (0 off-mask).
ValueFn = Callable[[EpisodeBatch], torch.Tensor]


def _rows(
    core: ModuleType | None,
    AlgoConfig: Callable[..., Any] | None,
    registered: Mapping[str, object],
    notes: list[str],
    v_exact: ValueFn,
) -> list[tuple[str, str, str, CreditFn]]:
    """Every row of the figure: (name, label, source, credit of a sampled batch)."""

    def ours(name: str, kw: dict[str, Any]) -> CreditFn:
        def fn(ctx: BatchContext) -> torch.Tensor:
            b = ctx.batch
            groups = torch.zeros(b.mask.shape[0], dtype=torch.long)
            return run_estimator(
                name, EstimatorInput(rewards=b.rewards, mask=b.mask, groups=groups), **kw
            ).advantages

        return fn

    def gae_row(critic: str, lam: float, whitened: bool = True) -> CreditFn:
        def fn(ctx: BatchContext) -> torch.Tensor:
            b = ctx.batch
            v = v_exact(b)
            values = v if critic == "exact" else torch.zeros_like(v)
            if whitened:
                return run_estimator(
                    "verl_gae", EstimatorInput(rewards=b.rewards, mask=b.mask, values=values, lam=lam)
                ).advantages
            return gae(b.rewards, values, b.mask, gamma=1.0, lam=lam)[0]

        return fn

    rows: list[tuple[str, str, str, CreditFn]] = [
        ("oracle_advantage", "oracle (exact A)", "oracle", lambda ctx: ctx.true_adv)
    ]
    for name, label, kw in OURS:
        if name not in registered:
            notes.append(f"estimator {name!r} is not registered; its row is omitted")
            continue
        rows.append((name, label, "ours", ours(name, kw)))
    for name, label, critic, lam in GAE_ROWS:
        rows.append((name, label, "ours", gae_row(critic, lam)))
    # Raw (not whitened) GAE with the exact critic: credit(BAD) = (q/4 - 1/2) + lam (1 - q/2) exactly.
    for lam in (1.0, 0.0):
        rows.append(
            (
                f"gae_exact_lam{int(lam)}_raw",
                f"GAE, exact critic, λ={int(lam)} (raw)",
                "ours",
                gae_row("exact", lam, False),
            )
        )
    if core is not None and AlgoConfig is not None:
        rows += _verl_rows(core, AlgoConfig, v_exact)
    return rows


def compute(p: Params) -> Result:
    """The recovery diagnostic on RecoveryEnv under the uniform policy, for any q, batch, seed and
    number of seeds (seeds ``seed .. seed + seeds - 1``, one independent batch each).

    Episodes are packed one cell per turn ([B, 2], float64) and the whole batch is one group. The
    batches and metrics go through :func:`estimators.oracles.benchmark`; with ``seeds = 1`` every
    row is the one batch's diagnostic and :func:`credit_metrics`; with more, the means over seeds,
    their standard errors (``se``) and the across-seed gradient metrics.
    """
    started = time.perf_counter()
    if p["seeds"] * p["batch"] > MAX_EPISODES:
        raise ApiError(
            413,
            "too_much_work",
            f"seeds x batch = {p['seeds']} x {p['batch']} = {p['seeds'] * p['batch']} episodes; the limit is "
            f"{MAX_EPISODES}: use fewer seeds or a smaller batch.",
            field="seeds",
        )
    mdp = recovery_env(as_fraction(p["q"]))
    dense = mdp.dense()
    pi = softmax_policy(dense, torch.zeros(len(mdp.states), len(mdp.actions), dtype=torch.float64))
    sol = solve(mdp)
    g_star = exact_gradient(mdp, sol, pi, shared=False).flatten()
    n = p["batch"]
    n_seeds = p["seeds"]
    seeds = list(range(p["seed"], p["seed"] + n_seeds))
    t_idx = torch.arange(mdp.horizon).expand(n, -1)
    v_table = sol.value_table(mdp)
    adv_table = sol.advantage_table(mdp)
    bad, rec = mdp.a_index["BAD"], mdp.a_index["RECOVER"]
    notes: list[str] = []

    def v_exact(b: EpisodeBatch) -> torch.Tensor:
        return v_table[t_idx, b.states] * b.mask

    verl_status, core, AlgoConfig = "off", None, None
    if p["verl"] == "auto":
        core, AlgoConfig, err = _verl_algos()
        verl_status = f"unavailable ({err})" if core is None else "ok"
    rows = _rows(core, AlgoConfig, available(), notes, v_exact)

    # Each row's credit per seed, recorded as benchmark draws the batches (same seeds, same order).
    credits: dict[str, list[tuple[Any, torch.Tensor]]] = {name: [] for name, *_ in rows}

    def recording(name: str, fn: CreditFn) -> CreditFn:
        def run(ctx: BatchContext) -> torch.Tensor:
            credit = fn(ctx).to(torch.float64) * ctx.batch.mask
            credits[name].append((ctx.batch, credit))
            return credit

        return run

    bench = benchmark(mdp, [(name, recording(name, fn)) for name, _, _, fn in rows], seeds, n)
    by_name = {r["name"]: r for r in bench["estimators"]}
    out_rows: list[dict[str, Any]] = []
    successes = selected = 0
    for name, label, source, _ in rows:
        row: dict[str, Any] = {"name": name, "label": label, "source": source}
        diags = [recovery_diagnostic(c, b.actions, b.success, bad, rec) for b, c in credits[name]]
        if n_seeds == 1:
            b, credit = credits[name][0]
            true_adv = adv_table[t_idx, b.states, b.actions] * b.mask
            keys = t_idx * len(mdp.states) + b.states
            row.update(diags[0])
            row["metrics"] = credit_metrics(credit, true_adv, b.mask, keys, score_vectors(b, pi), g_star)
        else:
            br = by_name[name]
            row["n_selected"] = sum(d["n_selected"] for d in diags)
            se: dict[str, Any] = {}
            for key in ("credit_bad", "credit_recover", "both_positive"):
                ms = _mean_se([d[key] for d in diags])
                row[key], se[key] = ms["mean"], ms["se"]
            row["metrics"] = {k: v["mean"] for k, v in br["metrics"].items()} | {
                "per_turn": br["per_turn"],
                "params": bench["params"],
            }
            row["se"] = se | {k: v["se"] for k, v in br["metrics"].items()}
            # The gradient of the mean over seeds, and AgentCreditBench's across-seed variance.
            row["across_seeds"] = {
                key: br[key]
                for key in ("gradient_variance", "mean_gradient_cosine", "relative_mean_gradient_error")
            }
        out_rows.append(row)
    for b, _ in credits["oracle_advantage"]:
        successes += int(b.success.sum())
        selected += int((b.success & (b.actions[:, 0] == bad) & (b.actions[:, 1] == rec)).sum())
    q = as_fraction(p["q"])
    return {
        "figure": "recovery",
        "params": p,
        "exact": {
            "A_bad": float(q / 4 - Fraction(1, 2)),
            "A_recover": float(q / 2),
            "V0": float(sol.V[0]["s0"]),
            "raw_gae_credit_bad": {
                "formula": "(q/4 - 1/2) + lam (1 - q/2)",
                "lam0": float(q / 4 - Fraction(1, 2)),
                "lam1": float(q / 4 - Fraction(1, 2) + 1 - q / 2),
            },
        },
        "batch": {"episodes": n * n_seeds, "successes": successes, "selected": selected},
        "rows": out_rows,
        "verl": verl_status,
        "notes": notes,
        "seconds": time.perf_counter() - started,
    }


def _verl_rows(
    core: ModuleType, AlgoConfig: Callable[..., Any], v_exact: ValueFn
) -> list[tuple[str, str, str, CreditFn]]:
    """verl 0.9.1's own functions on the same packed batch (float64, one group)."""
    import numpy as np  # noqa: PLC0415

    def call(kind: str, **kw: Any) -> CreditFn:
        def fn(ctx: BatchContext) -> torch.Tensor:
            r, m = ctx.batch.rewards.clone(), ctx.batch.mask.clone()
            adv: torch.Tensor  # verl's functions return (advantages, returns)
            if kind == "grpo":
                index = np.array(["batch"] * r.shape[0], dtype=object)
                adv = core.compute_grpo_outcome_advantage(r, m, index, **kw)[0]
            elif kind == "rloo":
                index = np.array(["batch"] * r.shape[0], dtype=object)
                adv = core.compute_rloo_outcome_advantage(r, m, index)[0]
            elif kind == "rpp":
                adv = core.compute_reinforce_plus_plus_outcome_advantage(r, m, config=AlgoConfig(gamma=1.0))[
                    0
                ]
            else:
                v = v_exact(ctx.batch)
                values = v if kw["critic"] == "exact" else torch.zeros_like(v)
                adv = core.compute_gae_advantage_return(r, values.clone(), m, gamma=1.0, lam=kw["lam"])[0]
            return adv

        return fn

    rows = [
        ("verl_grpo", "verl GRPO", "verl", call("grpo", norm_adv_by_std_in_grpo=True)),
        ("verl_dr_grpo", "verl Dr. GRPO", "verl", call("grpo", norm_adv_by_std_in_grpo=False)),
        ("verl_rloo", "verl RLOO", "verl", call("rloo")),
        ("verl_reinforce_plus_plus", "verl REINFORCE++", "verl", call("rpp")),
    ]
    for name, label, critic, lam in GAE_ROWS:
        rows.append((f"verl_{name}", f"verl {label}", "verl", call("gae", critic=critic, lam=lam)))
    return rows


def csv_rows(result: Result) -> list[dict[str, Any]]:
    """One row per estimator, its credit metrics flattened (the per-turn list left out); with
    several seeds, each mean's standard error as ``<name>_se`` and the across-seed gradient
    metrics as ``across_seeds_<name>``."""
    out = []
    for r in result["rows"]:
        m = {k: v for k, v in r["metrics"].items() if k != "per_turn"}
        se = {f"{k}_se": v for k, v in r.get("se", {}).items()}
        flat = {k: v for k, v in r.items() if k not in ("metrics", "se", "across_seeds")}
        across = {f"across_seeds_{k}": v for k, v in r.get("across_seeds", {}).items()}
        out.append(flat | m | se | across)
    return out
