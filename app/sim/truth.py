"""Ground-truth turn values of the BugFix simulator: exact, and Monte Carlo (VinePPO style).

The policy is stationary and the latent state has 24 values, so V^pi solves one 24 x 24 linear
system (gamma = 1; every state submits with positive probability, so episodes end almost surely):

    V(s) = sum_c pi(c|s) * [ -call_cost + outcome(s, c) + (c is not submit) * V(s') ]

`max_calls` in env.py only cuts the *recording*: the dynamics continue, which is why a truncated
episode bootstraps from V(state at the cut).
"""

from __future__ import annotations

import random

import numpy as np

from app.sim.policy import ALL_STATES, START, PolicyParams, State, call_distribution, transition
from app.sim.tasks import Task

_INDEX = {s: i for i, s in enumerate(ALL_STATES)}


# (task name, bug, skill, params, call_cost) -> V.
_CACHE: dict[tuple[str, str, float, PolicyParams, float], dict[State, float]] = {}


def exact_values(task: Task, params: PolicyParams, call_cost: float = 0.0) -> dict[State, float]:
    """V^pi(s) for every latent state s, by solving (I - P) V = r exactly (float64)."""
    # Task holds lists (unhashable); what the dynamics read is its name, bug and skill.
    key = (task.name, task.bug, task.skill, params, float(call_cost))
    if key not in _CACHE:
        if len(_CACHE) > 4096:
            _CACHE.clear()
        _CACHE[key] = _solve(task, params, call_cost)
    return _CACHE[key]


def _solve(task: Task, params: PolicyParams, call_cost: float) -> dict[State, float]:
    n = len(ALL_STATES)
    a = np.eye(n)
    b = np.zeros(n)
    for s in ALL_STATES:
        i = _INDEX[s]
        for call, p in call_distribution(params, task, s):
            step = transition(task, s, call)
            b[i] += p * (-call_cost + step.outcome)
            if not step.done:
                a[i, _INDEX[step.next_state]] -= p
    v = np.linalg.solve(a, b)
    return {s: float(v[_INDEX[s]]) for s in ALL_STATES}


def q_value(task: Task, params: PolicyParams, state: State, call: str, call_cost: float = 0.0) -> float:
    """Q^pi(s, c): the call's reward plus the value of where it leads."""
    v = exact_values(task, params, call_cost)
    step = transition(task, state, call)
    return -call_cost + step.outcome + (0.0 if step.done else v[step.next_state])


def pass_rate(task: Task, params: PolicyParams) -> float:
    """P(the hidden tests pass at submit) from the start state: V with no call cost."""
    return exact_values(task, params, 0.0)[START]


def sample_call(params: PolicyParams, task: Task, state: State, rng: random.Random) -> tuple[str, float]:
    """Draw one call from the policy; returns (call, its probability)."""
    dist = call_distribution(params, task, state)
    u = rng.random()
    acc = 0.0
    for call, p in dist:
        acc += p
        if u < acc:
            return call, p
    return dist[-1]  # u landed in float round-off at the top


def rollout_return(
    task: Task,
    params: PolicyParams,
    state: State,
    rng: random.Random,
    call_cost: float = 0.0,
    max_calls: int = 1000,
) -> float:
    """One continuation from `state` under the policy; its total reward (cut after max_calls)."""
    total = 0.0
    for _ in range(max_calls):
        call, _ = sample_call(params, task, state, rng)
        step = transition(task, state, call)
        total += -call_cost + step.outcome
        if step.done:
            break
        state = step.next_state
    return total


def mc_value(
    task: Task,
    params: PolicyParams,
    state: State,
    n_rollouts: int,
    rng: random.Random,
    call_cost: float = 0.0,
) -> tuple[float, float]:
    """Monte Carlo value of `state` from `n_rollouts` continuations: (mean, standard error)."""
    g = np.array([rollout_return(task, params, state, rng, call_cost) for _ in range(n_rollouts)])
    se = float(g.std(ddof=1) / np.sqrt(n_rollouts)) if n_rollouts > 1 else float("inf")
    return float(g.mean()), se


def mc_turn_values(
    task: Task,
    params: PolicyParams,
    states: list[State],
    n_rollouts: int,
    seed: int = 0,
    call_cost: float = 0.0,
) -> list[float]:
    """VinePPO-style value of each turn-start state: the mean of `n_rollouts` continuations."""
    rng = random.Random(f"mc:{seed}:{task.name}")
    return [mc_value(task, params, s, n_rollouts, rng, call_cost)[0] for s in states]
