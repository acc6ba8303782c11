"""The difficulty bias of std normalisation: expected total |advantage| of a group of G binary
attempts against the task's pass rate, with and without division by the group's std."""

from __future__ import annotations

from typing import Any

import torch

from app.lab.params import Param, Params, Result

NAME = "difficulty"
ORDER = 2
VERSION = 1
TITLE = "Difficulty bias of std normalisation"
SUMMARY = "Figure 2: difficulty bias of std normalisation"
INTRO = """<p class="hint">Expected total |advantage| of a group of G binary attempts at a task of pass rate p — an exact binomial sum — with and without
division by the group's std (torch.std, + eps), and their ratio: the extra weight normalisation gives a task of that difficulty
(the difficulty bias that Dr. GRPO, Liu et al. 2025, removes).
Zero-variance groups (all fail or all pass, probability pᴳ + (1 − p)ᴳ) carry no gradient.</p>"""

PARAMS = {
    "G": Param("G", "int", 8, 2, 256, help="group size"),
    "eps": Param("eps", "float", 1e-6, 0, 1, help="epsilon added to the std"),
    "std": Param("std", "choice", "sample", choices=("sample", "population"), help="std convention"),
    "points": Param("points", "int", 199, 9, 999, help="pass-rate grid: p = k/(points+1)"),
    "group_sizes": Param(
        "group_sizes", "ints", [4, 8, 16, 32], 2, 1024, max_items=12, help="zero-variance curves"
    ),
    "p_target": Param("p_target", "float", 0.1, 0, 1, help="pass rate for the group-size question"),
    "target": Param("target", "float", 0.25, 0, 1, help="zero-variance probability to get below"),
    "tasks": Param("tasks", "int", 64, 1, 100_000, help="tasks per step (rollouts = tasks x G)"),
}


def _group_stds(G: int, std: str) -> torch.Tensor:
    """std of a 0/1 group with k successes, k = 0..G, computed by torch.std on the groups themselves."""
    groups = (torch.arange(G).unsqueeze(0) < torch.arange(G + 1).unsqueeze(1)).to(torch.float64)  # [G+1, G]
    return groups.std(dim=1, unbiased=(std == "sample"))


def compute(p: Params) -> Result:
    """Expected total |advantage| of a group of G vs pass rate, with and without std normalisation.

    Exact binomial sums: E = sum_k C(G,k) p^k (1-p)^(G-k) T(k), T(k) = sum_i |r_i - mean| = 2k(G-k)/G,
    divided by (std_k + eps) when normalised.
    """
    G, eps = p["G"], p["eps"]
    k = torch.arange(G + 1, dtype=torch.float64)
    total_abs = 2 * k * (G - k) / G
    stds = _group_stds(G, p["std"])
    scale = 1.0 / (stds + eps)
    norm_abs = total_abs * scale
    log_binom = (
        torch.lgamma(torch.tensor(G + 1.0, dtype=torch.float64))
        - torch.lgamma(k + 1)
        - torch.lgamma(G - k + 1)
    )
    ps = torch.arange(1, p["points"] + 1, dtype=torch.float64) / (p["points"] + 1)

    def pmf(pp: torch.Tensor) -> torch.Tensor:  # [P, G+1]
        pp = pp.unsqueeze(-1)
        return torch.exp(log_binom + k * torch.log(pp) + (G - k) * torch.log1p(-pp))

    w = pmf(ps)
    e_plain = w @ total_abs
    e_norm = w @ norm_abs
    zero_var = ps**G + (1 - ps) ** G
    curve = [
        {
            "p": float(ps[i]),
            "expected_abs_plain": float(e_plain[i]),
            "expected_abs_normalised": float(e_norm[i]),
            "ratio": float(e_norm[i] / e_plain[i]) if e_plain[i] > 0 else None,
            "zero_variance": float(zero_var[i]),
        }
        for i in range(len(ps))
    ]

    def at(pp: float) -> dict[str, float | None]:
        wi = pmf(torch.tensor([pp], dtype=torch.float64))[0]
        a, b = float(wi @ total_abs), float(wi @ norm_abs)
        return {
            "p": pp,
            "expected_abs_plain": a,
            "expected_abs_normalised": b,
            "ratio": b / a if a > 0 else None,
        }

    conditional = [
        {
            "successes": int(i),
            "std": float(stds[i]),
            "scale": float(scale[i]),
            "total_abs_plain": float(total_abs[i]),
        }
        for i in range(1, G)
    ]
    zero_curves = [
        {"G": g, "zero_variance": [float(x) for x in (ps**g + (1 - ps) ** g)]} for g in p["group_sizes"]
    ]
    pt, target = p["p_target"], p["target"]
    needed = None
    if 0 < pt < 1 and target > 0:
        for g in range(2, 100_001):
            if pt**g + (1 - pt) ** g < target:
                needed = g
                break
    return {
        "figure": "difficulty",
        "params": p,
        "curve": curve,
        "checkpoints": [at(x) for x in (0.05, 0.1, 0.5)],
        "conditional_scale": conditional,
        "zero_variance_curves": zero_curves,
        "p_grid": [float(x) for x in ps],
        "group_size_needed": {
            "p": pt,
            "target": target,
            "G": needed,
            "zero_variance_at_G": (pt**needed + (1 - pt) ** needed) if needed else None,
            "zero_variance_at_G_minus_1": (pt ** (needed - 1) + (1 - pt) ** (needed - 1)) if needed else None,
            "rollouts_per_step": needed * p["tasks"] if needed else None,
            "tasks": p["tasks"],
        },
    }


def csv_rows(result: Result) -> list[dict[str, Any]]:
    """One row per pass rate of the grid."""
    rows: list[dict[str, Any]] = result["curve"]
    return rows
