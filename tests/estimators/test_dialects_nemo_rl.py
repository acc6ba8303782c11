"""The NeMo-RL dialects on hand-computed cases (NeMo-RL is not on PyPI: read, not run).

Code reproduced, registered as NeMo-RL 0.7.0 (NVIDIA-NeMo/RL, the stored copies read):
``nemo_rl/algorithms/advantage_estimator.py`` at 00925dd1e44b816b5cb6afa27d23d7bd7af2b957
(``GRPOAdvantageEstimator``, ``ReinforcePlusPlusAdvantageEstimator``,
``RawRewardAdvantageEstimator``, ``GeneralizedAdvantageEstimator``) and
``nemo_rl/algorithms/utils.py`` at 004395398158769ab93f3f693983f1db6a239273
(``calculate_baseline_and_std_per_prompt``, ``masked_mean``).
"""

from __future__ import annotations

import math

import pytest
import torch

from estimators import EstimatorInput, compute, get
from estimators.dialects import nemo_rl as N

F64 = torch.float64

# Row 0: prompt, two policy tokens, a tool span of two tokens (values 5 and 7 there), a last policy
# token. Row 1: prompt, three policy tokens, padding.
MASK = torch.tensor([[0, 1, 1, 0, 0, 1], [0, 1, 1, 1, 0, 0]])
VALUES = torch.tensor([[9, 0.5, 0.6, 5, 7, 0.8], [9, 0.1, 0.2, 0.3, 0, 0]], dtype=F64)


def _token_rows(scores: list[float], mask: torch.Tensor | None = None) -> EstimatorInput:
    """One row per score: three policy tokens, the score on the last."""
    B = len(scores)
    m = torch.ones(B, 3, dtype=torch.long) if mask is None else mask
    r = torch.zeros(B, 3, dtype=F64)
    r[:, 2] = torch.tensor(scores, dtype=F64)
    return EstimatorInput(rewards=r, mask=m)


def _gae_inp(**kw) -> EstimatorInput:
    r = torch.zeros(2, 6, dtype=F64)
    r[0, 5] = 1.0
    r[1, 3] = 0.5
    base = {"rewards": r, "mask": MASK, "values": VALUES, "gamma": 0.9, "lam": 0.8}
    return EstimatorInput(**{**base, **kw})


def test_registered_with_trainer_and_version():
    for name in ("nemo_rl:grpo", "nemo_rl:reinforce_plus_plus", "nemo_rl:raw_reward", "nemo_rl:gae"):
        assert (get(name).trainer, get(name).version) == ("nemo_rl", "0.7.0")
    assert get("nemo_rl:gae").params["gae_lambda_value"] is None


def test_grpo_leave_one_out_baseline_and_std():
    """Group {1, 0, 0.5, 0.25}. Row 0: the others 0, 0.5, 0.25 have mean 0.25 and
    E[r^2] = (0 + 0.25 + 0.0625) / 3 = 0.1041667, so std = sqrt((0.1041667 - 0.0625) * 3 / 2) = 0.25:
    (1 - 0.25) / (0.25 + 1e-6) = 2.999988. Row 1: the others 1, 0.5, 0.25 have mean 0.5833333,
    E[r^2] = 1.3125 / 3 = 0.4375, std = sqrt((0.4375 - 0.3402778) * 1.5) = 0.3818813:
    -0.5833333 / 0.3818823 = -1.527521.
    Group {3, 2} (two members): baselines 2 and 3, std = sqrt(0 * 1/0) -> NaN -> 0: not divided, +1 / -1.
    Group {2} (one member): baseline = its reward, advantage 0."""
    inp = _token_rows([1.0, 0.0, 0.5, 0.25, 3.0, 2.0, 2.0])
    inp.groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    out = compute("nemo_rl:grpo", inp)
    ep = out.extras["episode_advantages"]
    assert abs(float(ep[0]) - 0.75 / (0.25 + 1e-6)) < 1e-12
    std1 = math.sqrt((0.4375 - (1.75 / 3) ** 2) * 1.5)
    assert abs(float(ep[1]) - (-(1.75 / 3) / (std1 + 1e-6))) < 1e-12
    assert float(ep[4]) == 1.0 and float(ep[5]) == -1.0 and float(ep[6]) == 0.0
    assert torch.all(out.advantages[4] == 1.0)  # broadcast on every policy token


def test_grpo_plain_mean_and_all_equal_group():
    """use_leave_one_out_baseline=False: group {1, 0, 0.5, 0.25} has mean 0.4375 and sample std
    sqrt((1.3125 / 4 - 0.4375^2) * 4 / 3) = 0.4269563: (1 - 0.4375) / (0.4269563 + 1e-6) = 1.317464.
    An all-equal group {0.7, 0.7, 0.7} gets 0 up to rounding (NeMo-RL has no exact-zero guard)."""
    inp = _token_rows([1.0, 0.0, 0.5, 0.25, 0.7, 0.7, 0.7])
    inp.groups = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    ep = compute("nemo_rl:grpo", inp, use_leave_one_out_baseline=False).extras["episode_advantages"]
    std = math.sqrt((1.3125 / 4 - 0.4375**2) * 4 / 3)
    assert abs(float(ep[0]) - 0.5625 / (std + 1e-6)) < 1e-12
    assert float(ep[4:].abs().max()) < 1e-9
    ep_loo = compute("nemo_rl:grpo", inp).extras["episode_advantages"]
    assert float(ep_loo[4:].abs().max()) < 1e-9


def test_grpo_without_normalization_is_rloo():
    inp = _token_rows([1.0, 0.0, 0.5])
    inp.groups = torch.tensor([0, 0, 0])
    ep = compute("nemo_rl:grpo", inp, normalize_rewards=False).extras["episode_advantages"]
    # 1 - (0 + 0.5) / 2 = 0.75; 0 - 0.75 = -0.75; 0.5 - 0.5 = 0.
    torch.testing.assert_close(ep, torch.tensor([0.75, -0.75, 0.0], dtype=F64), rtol=0, atol=1e-15)


def test_reward_on_a_tool_token_counts():
    """NeMo-RL's reward is one number per sample: 0.5 on row 0's tool token (position 3) adds to it.
    Rows 1 and 0.5 + 0.5 = 1 in one group of two: LOO baselines 1 and 1, advantages 0 and 0."""
    r = torch.zeros(2, 6, dtype=F64)
    r[0, 5] = 0.5
    r[0, 3] = 0.5  # a tool token
    r[1, 3] = 1.0
    out = compute("nemo_rl:grpo", EstimatorInput(rewards=r, mask=MASK, groups=[0, 0]))
    assert torch.all(out.advantages == 0)


def test_reinforce_plus_plus_whitens_group_centred_rewards_over_tokens():
    """Groups {1, 0}, {0.5, 0.5} and {9}: centred +0.5, -0.5, 0, 0 and 0 (a group of one), each on
    3 tokens; token mean 0, population variance 6 * 0.25 / 15 = 0.1: 0.5 / sqrt(0.1) = 1.5811388."""
    inp = _token_rows([1.0, 0.0, 0.5, 0.5, 9.0])
    inp.groups = torch.tensor([0, 0, 1, 1, 2])
    adv = compute("nemo_rl:reinforce_plus_plus", inp, minus_baseline=True).advantages
    a = 0.5 / math.sqrt(0.1)
    expected = torch.tensor([a, -a, 0.0, 0.0, 0.0], dtype=F64)
    torch.testing.assert_close(adv[:, 0], expected, rtol=0, atol=1e-12)
    # gamma is not read: the same on every token of the row.
    assert torch.all(adv == adv[:, :1])


def test_raw_reward_whitened_over_tokens():
    """Rewards 1 and 0.5 on 3 policy tokens each: token mean 0.75, population variance 0.0625:
    +-0.25 / 0.25 = +-1 (ours 0 on the tool tokens and prompt)."""
    out = compute("nemo_rl:raw_reward", _gae_inp())
    torch.testing.assert_close(
        out.advantages[0], torch.tensor([0, 1, 1, 0, 0, 1], dtype=F64), rtol=0, atol=1e-7
    )
    torch.testing.assert_close(
        out.advantages[1], torch.tensor([0, -1, -1, -1, 0, 0], dtype=F64), rtol=0, atol=1e-7
    )


def test_gae_carries_across_tool_spans():
    """gamma 0.9, lambda 0.8 on row 0 (policy tokens 1, 2, 5; values 0.5, 0.6, 0.8; reward 1 on 5):
      A5 = 1 - 0.8 = 0.2
      A2 = 0.9 * 0.8 - 0.6 + 0.72 * 0.2 = 0.264       (the tool span's values 5 and 7 are not read)
      A1 = 0.9 * 0.6 - 0.5 + 0.72 * 0.264 = 0.23008
    value targets A + V: 0.73008, 0.864, 1.0."""
    out = compute("nemo_rl:gae", _gae_inp(), normalize_advantages=False)
    torch.testing.assert_close(
        out.advantages[0], torch.tensor([0, 0.23008, 0.264, 0, 0, 0.2], dtype=F64), rtol=0, atol=1e-12
    )
    assert out.value_targets is not None
    torch.testing.assert_close(
        out.value_targets[0, [1, 2, 5]], torch.tensor([0.73008, 0.864, 1.0], dtype=F64)
    )
    poked = VALUES.clone()
    poked[0, 3:5] = -100.0
    again = compute("nemo_rl:gae", _gae_inp(values=poked), normalize_advantages=False).advantages
    torch.testing.assert_close(again, out.advantages, rtol=0, atol=0)


def test_gae_decoupled_lambdas():
    """gae_lambda_policy 0.5 (gamma lambda 0.45): A2 = 0.12 + 0.45 * 0.2 = 0.21,
    A1 = 0.04 + 0.45 * 0.21 = 0.1345. gae_lambda_value 1: targets are the discounted returns
    1, 0.9, 0.81 (A + V with lambda 1)."""
    out = compute(
        "nemo_rl:gae", _gae_inp(), normalize_advantages=False, gae_lambda_value=1.0, gae_lambda_policy=0.5
    )
    torch.testing.assert_close(out.advantages[0, [1, 2, 5]], torch.tensor([0.1345, 0.21, 0.2], dtype=F64))
    assert out.value_targets is not None
    torch.testing.assert_close(out.value_targets[0, [1, 2, 5]], torch.tensor([0.81, 0.9, 1.0], dtype=F64))
    # Only one of them set: the other falls back to inp.lam (NeMo-RL's gae_lambda).
    only_value = compute("nemo_rl:gae", _gae_inp(), normalize_advantages=False, gae_lambda_value=1.0)
    plain = compute("nemo_rl:gae", _gae_inp(), normalize_advantages=False)
    torch.testing.assert_close(only_value.advantages, plain.advantages, rtol=0, atol=1e-15)


def test_gae_length_adaptive_lambda():
    """alpha 0.5, 3 policy tokens per row: lambda = 1 - 1 / max(0.5 * 3, 1) = 1/3 (float32), gamma
    lambda = 0.3: A2 = 0.12 + 0.3 * 0.2 = 0.18, A1 = 0.04 + 0.3 * 0.18 = 0.094."""
    adv = compute("nemo_rl:gae", _gae_inp(), normalize_advantages=False, length_adaptive_alpha=0.5).advantages
    torch.testing.assert_close(
        adv[0, [1, 2, 5]], torch.tensor([0.094, 0.18, 0.2], dtype=F64), rtol=1e-6, atol=0
    )


def test_gae_no_bootstrap_for_truncated_rows():
    a = compute("nemo_rl:gae", _gae_inp(), normalize_advantages=False).advantages
    b = compute(
        "nemo_rl:gae", _gae_inp(last_value=torch.tensor([5.0, 5.0], dtype=F64)), normalize_advantages=False
    ).advantages
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_gae_whitening_over_policy_tokens():
    """normalize_advantages (the default): (A - mean) * rsqrt(var + 1e-8) over the policy tokens,
    mean and population variance with masked_mean's denominator n + 1e-8."""
    raw = compute("nemo_rl:gae", _gae_inp(), normalize_advantages=False).advantages[MASK != 0]
    n = raw.numel() + 1e-8
    mean = raw.sum() / n
    var = ((raw - mean) ** 2).sum() / n
    adv = compute("nemo_rl:gae", _gae_inp()).advantages
    torch.testing.assert_close(adv[MASK != 0], (raw - mean) / torch.sqrt(var + 1e-8), rtol=0, atol=1e-12)
    assert torch.all(adv[MASK == 0] == 0)


def test_baseline_and_std_group_of_one():
    b, s = N.baseline_and_std(torch.tensor([0.3], dtype=F64), None)
    assert float(b[0]) == 0.3 and float(s[0]) == 0.0


@pytest.mark.parametrize("name", ["nemo_rl:grpo", "nemo_rl:reinforce_plus_plus"])
def test_float32_in_float32_out(name):
    inp = _token_rows([1.0, 0.0, 0.5, 0.25])
    inp.rewards = inp.rewards.float()
    assert compute(name, inp).advantages.dtype == torch.float32
