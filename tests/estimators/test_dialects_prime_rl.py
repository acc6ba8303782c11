"""The prime-rl dialects on hand-computed cases (prime-rl is not on PyPI: read, not run).

Code reproduced, registered as prime-rl 0.8.1.dev (PrimeIntellect-ai/prime-rl, the stored copies
read): ``src/prime_rl/orchestrator/algo/grpo.py`` at 10d8af3467181d58f1f665b30f10881c8132cb72,
``src/prime_rl/orchestrator/algo/advantage.py`` (``default_advantage_fn``, ``max_rl_advantage_fn``,
``AdvantageInputs.broadcast``) at 039b4009f84aa9996a5cca4ae6ab257de094ff81 and
``src/prime_rl/orchestrator/algo/max_rl.py`` at 0d6738ff505ae6ee810394a6d8124a069f84a6b4.
"""

from __future__ import annotations

import torch

from estimators import EstimatorInput, compute, get

F64 = torch.float64
F32 = torch.float32

# Row 0: prompt, two policy tokens, a tool span of two tokens, a last policy token.
MASK = torch.tensor(
    [
        [0, 1, 1, 0, 0, 1],
        [0, 1, 1, 1, 0, 0],
        [0, 1, 1, 0, 0, 0],
        [0, 1, 1, 1, 1, 0],
        [0, 1, 0, 0, 0, 0],
    ]
)


def _inp(scores: list[float], groups: list[int]) -> EstimatorInput:
    """Each score on its row's last policy token."""
    mask = MASK[: len(scores)]
    r = torch.zeros(mask.shape, dtype=F64)
    last = torch.where(mask != 0, torch.arange(6), -1).amax(1)
    r[torch.arange(len(scores)), last] = torch.tensor(scores, dtype=F64)
    return EstimatorInput(rewards=r, mask=mask, groups=groups)


def test_registered_with_trainer_and_version():
    for name in ("prime_rl:grpo", "prime_rl:max_rl"):
        assert (get(name).trainer, get(name).version) == ("prime_rl", "0.8.1.dev")
        assert get(name).params == {}


def test_grpo_is_reward_minus_group_mean_without_std():
    """Group {1, 0, 0.5}: mean 0.5, advantages 0.5, -0.5, 0 (no division by the std 0.5).
    Group {0.25, 0.25} (all equal): 0. A group of one is not used here; see below."""
    out = compute("prime_rl:grpo", _inp([1.0, 0.0, 0.5, 0.25, 0.25], [0, 0, 0, 1, 1]))
    torch.testing.assert_close(
        out.extras["episode_advantages"], torch.tensor([0.5, -0.5, 0.0, 0.0, 0.0], dtype=F64), rtol=0, atol=0
    )
    # Broadcast on every policy token, 0 on the tool span and the prompt.
    torch.testing.assert_close(out.advantages[0], torch.tensor([0, 0.5, 0.5, 0, 0, 0.5], dtype=F64))


def test_grpo_float32_and_singleton():
    """Rewards enter as a float32 tensor: group {0.1, 0.2}: mean 0.15000000596 (float32),
    0.1f - mean = -0.05000000447. A group of one gets r - r = 0."""
    out = compute("prime_rl:grpo", _inp([0.1, 0.2, 0.7], [0, 0, 1]))
    ep = out.extras["episode_advantages"]
    mean = (torch.tensor(0.1, dtype=F32) + torch.tensor(0.2, dtype=F32)) / 2
    assert float(ep[0]) == float(torch.tensor(0.1, dtype=F32) - mean)
    assert float(ep[0]) != -0.05  # float32 steps, not float64
    assert float(ep[2]) == 0.0


def test_reward_on_a_tool_token_counts():
    """A rollout's reward is one number: 0.5 on row 0's tool token (position 3) makes it 1.5;
    group {1.5, 0.5}: mean 1, advantages +0.5 and -0.5."""
    inp = _inp([1.0, 0.5], [0, 0])
    inp.rewards[0, 3] = 0.5
    ep = compute("prime_rl:grpo", inp).extras["episode_advantages"]
    assert ep.tolist() == [0.5, -0.5]


def test_max_rl_divides_by_the_group_mean():
    """Group {1, 0, 0, 0} (binary, pass rate 0.25): (1 - 0.25) / 0.25 = 3, (0 - 0.25) / 0.25 = -1.
    Group {0} (mean 0): 0, not a division by zero."""
    out = compute("prime_rl:max_rl", _inp([1.0, 0.0, 0.0, 0.0, 0.0], [0, 0, 0, 0, 1]))
    torch.testing.assert_close(
        out.extras["episode_advantages"],
        torch.tensor([3.0, -1.0, -1.0, -1.0, 0.0], dtype=F64),
        rtol=0,
        atol=0,
    )


def test_max_rl_negative_mean_and_all_equal_group():
    """Group {-1, 0.5} has mean -0.25 <= 0: zeros. An all-equal group {0.6, 0.6, 0.6}:
    (0.6f - mean) / mean = 0 when the float32 mean is exactly 0.6f."""
    out = compute("prime_rl:max_rl", _inp([-1.0, 0.5, 0.6, 0.6, 0.6], [0, 0, 1, 1, 1]))
    ep = out.extras["episode_advantages"]
    assert ep[:2].tolist() == [0.0, 0.0]
    three = torch.tensor([0.6, 0.6, 0.6], dtype=F32)
    m = three.sum() / 3
    assert float(ep[2]) == float((three[0] - m) / m)
    assert abs(float(ep[2])) < 1e-6


def test_gamma_is_not_read():
    a = compute("prime_rl:grpo", _inp([1.0, 0.0], [0, 0]))
    inp = _inp([1.0, 0.0], [0, 0])
    inp.gamma = 0.5
    b = compute("prime_rl:grpo", inp)
    torch.testing.assert_close(a.advantages, b.advantages, rtol=0, atol=0)


def test_truncated_rows_are_scored_like_the_others():
    """prime-rl's advantage reads only the rollout's reward: a truncated row (a finite last_value)
    gets the same number as a terminated one."""
    a = compute("prime_rl:grpo", _inp([1.0, 0.0], [0, 0]))
    inp = _inp([1.0, 0.0], [0, 0])
    inp.last_value = torch.tensor([2.0, float("nan")], dtype=F64)
    b = compute("prime_rl:grpo", inp)
    torch.testing.assert_close(a.advantages, b.advantages, rtol=0, atol=0)
