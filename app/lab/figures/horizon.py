"""How far an outcome reaches: the weight (gamma*lam)^L of the direct path from an outcome L steps
away, counted in policy tokens and in turns."""

from __future__ import annotations

import math
from typing import Any

import torch

from app.lab.params import Param, Params, Result

NAME = "horizon"
ORDER = 3
VERSION = 1
TITLE = "How far an outcome reaches: (γλ)^L"
SUMMARY = "Figure 3: (γλ)^L, token-level vs turn-level"
INTRO = """<p class="hint">GAE weights the TD error L steps ahead by (γλ)ᴸ, so the direct path from an outcome to an early token decays geometrically.
Token-level GAE counts policy tokens; turn-level GAE counts calls.</p>"""

PARAMS = {
    "gamma": Param("gamma", "float", 1.0, 0, 1),
    "lams": Param("lams", "floats", [0.9, 0.95, 0.99, 0.999], 0, 1, max_items=12),
    "max_tokens": Param("max_tokens", "int", 30_000, 10, 1_000_000, help="longest token distance drawn"),
    "tokens_per_turn": Param("tokens_per_turn", "int", 40, 1, 100_000, help="policy tokens per call"),
    "max_turns": Param("max_turns", "int", 50, 1, 10_000),
}


def compute(p: Params) -> Result:
    """The weight (gamma*lam)^L the direct path gives an outcome L steps away, per token and per turn."""
    gamma = p["gamma"]
    # A log grid of token distances, plus the checkpoints below.
    grid = sorted(
        {int(round(x)) for x in torch.logspace(0, math.log10(p["max_tokens"]), 60).tolist()}
        | {12, 50, 2000, 30_000} & set(range(1, p["max_tokens"] + 1))
    )
    token_curves = [{"lam": lam, "weights": [(gamma * lam) ** L for L in grid]} for lam in p["lams"]]
    turns = list(range(0, p["max_turns"] + 1))
    tpt = p["tokens_per_turn"]
    turn_curves = [
        {
            "lam": lam,
            "turn_level": [(gamma * lam) ** n for n in turns],
            "token_level": [(gamma * lam) ** (n * tpt) for n in turns],
        }
        for lam in p["lams"]
    ]
    checkpoints = [
        {
            "what": "token-level, 12 policy tokens (a typical BugFix episode)",
            "lam": 0.95,
            "L": 12,
            "unit": "tokens",
        },
        {
            "what": "token-level, 2,000 policy tokens (a short SWE episode)",
            "lam": 0.95,
            "L": 2000,
            "unit": "tokens",
        },
        {"what": "token-level, 30,000 policy tokens", "lam": 0.99, "L": 30_000, "unit": "tokens"},
        {"what": "turn-level, 50 turns", "lam": 0.95, "L": 50, "unit": "turns"},
    ]
    for c in checkpoints:
        c["weight"] = (gamma * c["lam"]) ** c["L"]
    return {
        "figure": "horizon",
        "params": p,
        "token_distances": grid,
        "token_curves": token_curves,
        "turns": turns,
        "turn_curves": turn_curves,
        "checkpoints": checkpoints,
    }


def csv_rows(result: Result) -> list[dict[str, Any]]:
    """One row per (unit, lambda, distance): token-level curves, then turn-level ones."""
    out = [
        {"unit": "tokens", "lam": c["lam"], "distance": L, "weight": w}
        for c in result["token_curves"]
        for L, w in zip(result["token_distances"], c["weights"], strict=True)
    ]
    out += [
        {"unit": "turns", "lam": c["lam"], "distance": n, "weight": w, "token_level_weight": tw}
        for c in result["turn_curves"]
        for n, w, tw in zip(result["turns"], c["turn_level"], c["token_level"], strict=True)
    ]
    return out
