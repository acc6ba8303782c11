"""The multi-seed oracle runner: ``estimators.oracles.benchmark`` at 30 seeds x batch 2,000 on the
recovery environment with the recovery page's estimators (goal: under 3 s), and the two sweeps at
their default-sized settings. One torch thread (small tensors; see bench/agent.py)."""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from estimators.oracles import benchmark, delayed_horizon_sweep, recovery_env, variable_horizon_sweep

RECOVERY_ESTIMATORS = [
    "oracle",
    "grpo",
    "dr_grpo",
    "rloo",
    "reinforce_plus_plus",
    "verl_gae",
    "turn_gae",
    "gigpo",
    "turn_loo",
    "monte_carlo",
]


def _best(fn: Any, repeat: int = 3) -> tuple[float, float]:
    """(best wall-clock seconds, CPU seconds of that run). On a machine with more runnable threads
    than cores the wall clock mostly measures waiting; the CPU time is the work."""
    best = (float("inf"), float("inf"))
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - t0, time.process_time() - c0))
    return best


# Sizes: seeds x batch of the benchmark; seeds x batch of the sweeps.
SEEDS, BATCH, SWEEP_SEEDS, SWEEP_BATCH = 30, 2000, 10, 1000
QUICK = {"SEEDS": 2, "BATCH": 100, "SWEEP_SEEDS": 2, "SWEEP_BATCH": 100}


def run() -> dict[str, Any]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out: dict[str, Any] = {"load_average_1min_at_start": round(os.getloadavg()[0], 2)}
        env = recovery_env()
        benchmark(env, RECOVERY_ESTIMATORS, 2, 100)  # warm-up
        figures = {
            f"benchmark, recovery, 30 seeds x 2000, {len(RECOVERY_ESTIMATORS)} estimators": _best(
                lambda: benchmark(env, RECOVERY_ESTIMATORS, SEEDS, BATCH)
            ),
        }
        ests = ["oracle", "grpo", "rloo", "turn_loo", "gigpo", "verl_gae"]
        figures["delayed horizon sweep, H in 2..64 (6), 10 seeds x 1000, 6 estimators"] = _best(
            lambda: delayed_horizon_sweep([2, 4, 8, 16, 32, 64], ests, SWEEP_SEEDS, SWEEP_BATCH), 1
        )
        figures["variable-horizon sweep, 9 stop probabilities, 10 seeds x 1000, 6 estimators"] = _best(
            lambda: variable_horizon_sweep([i / 10 for i in range(1, 10)], ests, SWEEP_SEEDS, SWEEP_BATCH), 1
        )
        for name, (wall, cpu) in figures.items():
            out[f"{name}, s"] = round(wall, 3)
            out[f"{name}, cpu s"] = round(cpu, 3)
        out["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
        return out
    finally:
        torch.set_num_threads(before)


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:<80} {value}")
