"""Ground truth: the exact values satisfy the Bellman identity, agree with Monte Carlo
continuations within their standard error, and hit hand-derivable limits."""

import random

import pytest

from app.sim.policy import ALL_STATES, FAIL, START, PolicyParams, State, call_distribution, transition
from app.sim.tasks import TASKS, TASKS_BY_NAME
from app.sim.truth import exact_values, mc_value, pass_rate, q_value

PARAMS = [PolicyParams(), PolicyParams(temperature=2.0, exploit_propensity=0.5, read_propensity=1.0)]


@pytest.mark.parametrize("params", PARAMS)
@pytest.mark.parametrize("call_cost", [0.0, 0.1])
@pytest.mark.parametrize("name", ["limit", "spread", "argmax", "has_prefix"])
def test_bellman_identity(params, call_cost, name):
    # V(s) = sum_c pi(c|s) [ -cost + outcome + (not done) V(s') ], checked state by state with an
    # explicit loop (the solver never runs this loop; it solves the linear system).
    task = TASKS_BY_NAME[name]
    v = exact_values(task, params, call_cost)
    for s in ALL_STATES:
        rhs = 0.0
        for call, p in call_distribution(params, task, s):
            step = transition(task, s, call)
            rhs += p * (-call_cost + step.outcome + (0.0 if step.done else v[step.next_state]))
        assert v[s] == pytest.approx(rhs, abs=1e-12)
        assert v[s] == pytest.approx(
            sum(p * q_value(task, params, s, c, call_cost) for c, p in call_distribution(params, task, s))
        )


def test_policy_distribution_sums_to_one():
    for task in TASKS[:5]:
        for s in ALL_STATES:
            assert sum(p for _, p in call_distribution(PolicyParams(), task, s)) == pytest.approx(
                1.0, abs=1e-12
            )


@pytest.mark.parametrize(
    "name,state",
    [
        ("spread", START),
        ("count_to", State(located=True, known=FAIL)),
        ("to_celsius", START),
        ("clamp", State(hacked=True)),
    ],
)
def test_exact_matches_monte_carlo(name, state):
    task = TASKS_BY_NAME[name]
    params = PolicyParams()
    exact = exact_values(task, params, 0.05)[state]
    mean, se = mc_value(task, params, state, 3000, random.Random(f"test:{name}"), call_cost=0.05)
    # 4 standard errors: a false alarm has probability ~6e-5 per case.
    assert abs(mean - exact) < 4 * se, (mean, exact, se)
    assert se < 0.02


def test_hand_derivable_limits():
    params = PolicyParams()
    for task in TASKS:
        v = exact_values(task, params, 0.0)
        # Once fixed the bug stays fixed and every path ends in a submit: V = 1 exactly.
        for s in ALL_STATES:
            if s.fixed:
                assert v[s] == pytest.approx(1.0, abs=1e-12)
    # An agent that never names the right op never passes.
    hopeless = PolicyParams(skill_shift=-50.0, read_bonus=0.0)
    assert pass_rate(TASKS_BY_NAME["limit"], hopeless) < 1e-15
    # Call costs lower every value of an unfinished episode.
    t = TASKS_BY_NAME["clamp"]
    assert all(exact_values(t, params, 0.1)[s] < exact_values(t, params, 0.0)[s] for s in ALL_STATES)


def test_pass_rates_range_from_never_to_always():
    default = [pass_rate(t, PolicyParams()) for t in TASKS]
    assert min(default) < 0.01 and max(default) > 0.8
    # The knobs reach "always": a skilled agent that never submits untested and never cheats.
    strong = PolicyParams(skill_shift=12.0, submit_propensity=-6.0, exploit_propensity=-20.0)
    assert min(pass_rate(t, strong) for t in TASKS) > 0.99


def test_mc_turn_values_of_sampled_episodes_agree_with_exact():
    from app.sim.env import sample_batch, with_mc_turn_values

    eps = sample_batch(6, 4, seed=2, call_cost=0.05)
    n = 200
    mc = with_mc_turn_values(eps, PolicyParams(), n, seed=2, call_cost=0.05)
    diffs = []
    for e, m in zip(eps, mc, strict=True):
        assert m.meta["turn_values_exact"] == e.meta["turn_values"]
        assert m.tokens == e.tokens and m.meta["n_rollouts"] == n
        diffs += [a - b for a, b in zip(m.meta["turn_values"], e.meta["turn_values"], strict=True)]
    # Returns lie in [-0.05 * calls, 1], so each MC mean has sd <= ~0.55 / sqrt(200) = 0.039:
    # 5 sd = 0.2 per value; the mean error over all turns is far tighter.
    assert max(abs(d) for d in diffs) < 0.2
    assert abs(sum(diffs) / len(diffs)) < 0.03
