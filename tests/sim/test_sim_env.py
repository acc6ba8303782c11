"""Episodes: deterministic, token/kind/reward-consistent, and the outcome is what running the
hidden tests on the episode's final code says."""

import math

import pytest

from app.core.domain import policy_mask, turn_spans
from app.sim.diagnostics import sim_diagnostics
from app.sim.env import episode_states, sample_batch, tokenize
from app.sim.policy import PolicyParams, call_distribution, transition
from app.sim.tasks import TASKS, TASKS_BY_NAME, run_tests
from app.sim.truth import exact_values


@pytest.fixture(scope="module")
def batch():
    return sample_batch(20, 8, seed=3, call_cost=0.1, max_calls=6)


def test_same_seed_same_episodes_other_seed_other_episodes():
    a = [e.model_dump() for e in sample_batch(6, 4, seed=11)]
    b = [e.model_dump() for e in sample_batch(6, 4, seed=11)]
    c = [e.model_dump() for e in sample_batch(6, 4, seed=12)]
    assert a == b
    assert a != c
    # A group depends only on (seed, task): asking for fewer tasks keeps the first groups.
    assert [e.model_dump() for e in sample_batch(2, 4, seed=11)] == a[:8]


def test_groups_are_consecutive_and_labelled_by_task(batch):
    assert len(batch) == 160
    for i, e in enumerate(batch):
        assert e.group == TASKS[i // 8].name == e.meta["task"]


def test_tokens_kinds_rewards_consistent(batch):
    for e in batch:
        n = len(e.tokens)
        assert len(e.kinds) == len(e.rewards) == len(e.logprobs) == n
        spans = turn_spans(policy_mask(e.kinds))
        calls = e.meta["calls"]
        assert len(spans) == len(calls) == len(e.meta["turn_values"])
        for (a, b), c in zip(spans, calls, strict=True):
            # The policy writes "<call> KIND [OP] </call>" and nothing else.
            assert e.tokens[a:b] == ["<call>", *c["action"].split(" "), "</call>"]
            # The call cost sits on the call's last token only.
            assert e.rewards[a:b] == [0.0] * (b - a - 1) + [-0.1]
            # Log-probabilities of the call's tokens add up to log pi(call | state).
            assert math.isfinite(sum(e.logprobs[a:b]))
        policy_positions = {i for a, b in spans for i in range(a, b)}
        assert all(e.rewards[i] == 0.0 for i in range(n) if i not in policy_positions)
        # Every observation is a tool span "<obs> ... </obs>" right after a call.
        for (_, b), nxt in zip(spans, [*spans[1:], (n, n)], strict=True):
            obs = e.tokens[b : nxt[0]]
            assert all(k == "tool" for k in e.kinds[b : nxt[0]])
            if obs:
                assert obs[0] == "<obs>" and obs[-1] == "</obs>"
        assert e.kinds[0] == "prompt" and e.tokens[0] == "<task>"
        ended = calls[-1]["action"] == "submit"
        assert e.truncated == (not ended)
        # A submitted episode ends on its last policy token; a truncated one on an observation.
        assert (e.kinds[-1] == "policy") == ended


def test_replayed_dynamics_effects_values_and_bootstrap(batch):
    params = PolicyParams()
    n_trunc = 0
    for e in batch:
        task = TASKS_BY_NAME[e.meta["task"]]
        v = exact_values(task, params, 0.1)
        states = episode_states(task, e)
        for s, c, tv, (a, b) in zip(
            states, e.meta["calls"], e.meta["turn_values"], turn_spans(policy_mask(e.kinds)), strict=True
        ):
            assert transition(task, s, c["action"]).effect == c["effect"]
            assert tv == pytest.approx(v[s], abs=1e-6)
            p = dict(call_distribution(params, task, s))[c["action"]]
            assert sum(e.logprobs[a:b]) == pytest.approx(math.log(p), abs=1e-5)
            assert e.logprobs[a] == 0.0 and e.logprobs[b - 1] == 0.0  # the forced tags
        if e.truncated:
            n_trunc += 1
            last = transition(task, states[-1], e.meta["calls"][-1]["action"]).next_state
            assert e.bootstrap_value == pytest.approx(v[last], abs=1e-6)
        else:
            assert e.bootstrap_value is None
    assert n_trunc > 0  # max_calls=6 truncates some attempts at hard tasks


def test_outcome_is_the_hidden_tests_on_the_final_code(batch):
    """Rebuild each submitted episode's final code from its calls and run the hidden tests."""
    seen_exploit_fail = 0
    for e in batch:
        if e.truncated:
            assert e.reward == 0.0
            continue
        task = TASKS_BY_NAME[e.meta["task"]]
        effects = [c["effect"] for c in e.meta["calls"]]
        src = task.hardcoded_source() if "exploit" in effects else task.source
        if "decisive_edit" in effects:
            src = src.replace(task.old, task.new, 1)
        hidden_pass = all(run_tests(src, task.hidden))
        assert e.reward == (1.0 if hidden_pass else 0.0)
        if "exploit" in effects and "decisive_edit" not in effects:
            assert all(run_tests(src, task.visible)) and e.reward == 0.0  # the exploit never passes
            seen_exploit_fail += 1
    assert seen_exploit_fail >= 1


def test_test_output_is_real(batch):
    # The `test` observation reports what the code actually returns.
    e = next(
        e for e in batch if e.meta["task"] == "clamp" and any(c["action"] == "test" for c in e.meta["calls"])
    )
    text = " ".join(e.tokens)
    assert "running 2 visible tests" in text
    assert "PASSED" in text or "FAILED" in text


def test_tokenize_is_deterministic_and_keeps_tags():
    assert tokenize("<call> edit swap_minmax </call> x[: n + 1]") == [
        "<call>",
        "edit",
        "swap_minmax",
        "</call>",
        "x",
        "[",
        ":",
        "n",
        "+",
        "1",
        "]",
    ]


def test_demo_seed_gives_the_designed_batch_shape():
    # The demo's design: at G = 8, 6 of 20 groups (30% of episodes) have zero variance, all
    # all-fail; about 30% of positive outcome credit goes to useless calls.
    d = sim_diagnostics(sample_batch(20, 8, seed=8))
    assert d["zero_variance_share"] == 0.3
    assert [z["all"] for z in d["zero_variance_groups"]] == ["fail"] * 6
    assert 0.2 < d["useless_credit_share"] < 0.4
    pass_rates = [
        sum(e.reward for e in g) / 8
        for g in (sample_batch(20, 8, seed=8)[i : i + 8] for i in range(0, 160, 8))
    ]
    assert min(pass_rates) == 0.0 and max(pass_rates) >= 0.875
