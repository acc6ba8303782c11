"""GiGPO (``estimators.agent``) against verl-agent's own function, in the same run.

B = 4,096 episodes x 8 turns x 512 policy tokens per turn (a 64-token tool output after each turn),
float32, groups of 8 episodes, anchor states drawn from 6 per group. Ours: the registry's
``compute("gigpo", ...)`` on the ``[B, T]`` batch, step returns included. verl-agent's
``compute_gigpo_outcome_advantage`` takes one row per step ([B x 8, 512]) with the step returns
given (we pass ours; its ``compute_step_discounted_returns`` is not timed). verl-agent's file is
never part of this repository: set ``CREDITLENS_VERL_AGENT_GIGPO=/path/to/gigpo/core_gigpo.py`` to
time it too (it needs ``verl`` importable); the ratio of the medians is printed. One torch thread.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from estimators import EstimatorInput, compute

B, K, L, TOOL, GROUP, STATES = 4096, 8, 512, 64, 8, 6
ROUNDS = 5
QUICK = {"B": 64, "L": 32, "TOOL": 8, "ROUNDS": 1}


def batch(seed: int = 0) -> tuple[EstimatorInput, torch.Tensor]:
    """Our [B, T] batch and the per-turn rewards [B, K] it was built from."""
    g = torch.Generator().manual_seed(seed)
    T = K * (L + TOOL)
    mask = torch.zeros(B, T, dtype=torch.int64)
    for k in range(K):
        mask[:, k * (L + TOOL) : k * (L + TOOL) + L] = 1
    turn_r = torch.randint(0, 3, (B, K), generator=g).float() / 2
    rewards = torch.zeros(B, T)
    rewards[:, torch.arange(K) * (L + TOOL) + L - 1] = turn_r
    states = torch.randint(0, STATES, (B, K), generator=g)
    groups = torch.arange(B) // GROUP
    return EstimatorInput(rewards=rewards, mask=mask, groups=groups, turn_states=states), turn_r


def _theirs(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("verl_agent_core_gigpo", path)
    if spec is None or spec.loader is None:
        raise ImportError(path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CPU: list[float] = []  # CPU seconds of every timed run of ours (process_time)


def _median(fn: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        CPU.append(time.process_time() - c0)
    return statistics.median(times)


def run() -> dict[str, Any]:
    # One thread for both: verl-agent's loop is single-threaded Python, and on a shared machine
    # (load average above the core count) a 2-thread torch op mostly waits for its second thread.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run()
    finally:
        torch.set_num_threads(before)


def _run() -> dict[str, Any]:
    out: dict[str, Any] = {"load_average_1min_at_start": round(os.getloadavg()[0], 2)}
    inp, turn_r = batch()
    params = {"gamma": 0.95, "omega": 1.0, "mode": "mean_std_norm"}
    ours_fn = lambda: compute("gigpo", inp, **params)  # noqa: E731
    res = ours_fn()  # warm-up
    ours = _median(ours_fn, ROUNDS)
    out["gigpo.B4096_K8_L512.ours_s"] = round(ours, 4)
    path = os.environ.get("CREDITLENS_VERL_AGENT_GIGPO")
    if not path:
        out["gigpo.verl_agent"] = "set CREDITLENS_VERL_AGENT_GIGPO=/path/core_gigpo.py to compare"
        return out
    try:
        mod = _theirs(path)
    except Exception as exc:  # noqa: BLE001
        out["gigpo.verl_agent"] = f"not importable ({type(exc).__name__}: {exc})"
        return out
    n = B * K
    # verl-agent's layout: one row per step (episode-major), the episode score on its last token.
    tlr = torch.zeros(n, L)
    tlr[:, -1] = turn_r.sum(1).repeat_interleave(K)
    mask = torch.ones(n, L)
    anchor = np.array([f"state-{s}" for s in inp.turn_states.reshape(-1).tolist()], dtype=object)  # type: ignore[union-attr]
    index = np.array([f"group-{i // (GROUP * K)}" for i in range(n)], dtype=object)
    traj = np.array([f"traj-{i // K}" for i in range(n)], dtype=object)
    step_returns = res.extras["step_returns"].reshape(-1)

    def theirs() -> torch.Tensor:
        with contextlib.redirect_stdout(io.StringIO()):  # it prints the mean step-group size
            a, _ = mod.compute_gigpo_outcome_advantage(
                tlr,
                step_returns.clone(),
                mask,
                anchor,
                index,
                traj,
                epsilon=1e-6,
                step_advantage_w=1.0,
                mode="mean_std_norm",
            )
        return a

    t0, c0 = time.perf_counter(), time.process_time()
    a = theirs()
    t_theirs, c_theirs = [time.perf_counter() - t0], [time.process_time() - c0]
    ours_again = [_median(ours_fn, 3)]
    t0, c0 = time.perf_counter(), time.process_time()
    theirs()
    t_theirs.append(time.perf_counter() - t0)
    c_theirs.append(time.process_time() - c0)
    ours_again.append(_median(ours_fn, 3))
    ours_pooled = statistics.median([ours, *ours_again])
    out["gigpo.B4096_K8_L512.ours_s"] = round(ours_pooled, 4)
    out["gigpo.B4096_K8_L512.verl_agent_s"] = round(statistics.median(t_theirs), 3)
    out["gigpo.B4096_K8_L512.speedup_vs_verl_agent"] = round(statistics.median(t_theirs) / ours_pooled, 1)
    # CPU time (process_time): what each side computes, without the waiting an oversubscribed
    # machine adds to the wall clock.
    out["gigpo.B4096_K8_L512.ours_cpu_s"] = round(statistics.median(CPU), 4)
    out["gigpo.B4096_K8_L512.verl_agent_cpu_s"] = round(statistics.median(c_theirs), 3)
    out["gigpo.B4096_K8_L512.speedup_vs_verl_agent_cpu"] = round(
        statistics.median(c_theirs) / statistics.median(CPU), 1
    )
    diff = (a[:, 0] - res.extras["turn_advantages"].reshape(-1)).abs().max().item()
    out["gigpo.B4096_K8_L512.max_abs_diff_vs_verl_agent"] = float(f"{diff:.2e}")
    out["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key:<55} {value}")
