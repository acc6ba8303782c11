"""The slime dialects on hand-computed cases (slime is not on PyPI: read, not run).

Code reproduced, registered as slime 0.3.1 (THUDM/slime, the stored copies read):
``slime/ray/rollout.py`` ``_post_process_rewards`` at 00de6b00714ea329e8f82a24340ac7f27ea63087,
``slime/backends/megatron_utils/loss.py`` ``compute_advantages_and_returns`` at
00c2d6db0f23a4900be6e80a8eb81eebf9e1ebff, ``slime/utils/ppo_utils.py`` (``get_grpo_returns``,
``get_reinforce_plus_plus_returns``, ``get_advantages_and_returns_batch``, ``chunked_gae``) at
06787cf5798525d9af068135ade88dc795d75821, ``slime/utils/distributed_utils.py``
``distributed_masked_whiten`` at 768b838c91ea05df974b18e8716662d9cb877dd1.
"""

from __future__ import annotations

import math

import pytest
import torch

from estimators import EstimatorInput, compute, get
from estimators.dialects import slime as S

F64 = torch.float64

# Row 0: prompt, two policy tokens, a tool span of two tokens, a last policy token.
# Row 1: prompt, three policy tokens, padding. Row 2: prompt, one policy token, padding.
MASK = torch.tensor([[0, 1, 1, 0, 0, 1], [0, 1, 1, 1, 0, 0], [0, 1, 0, 0, 0, 0]])
# The critic's values; 5 and 7 sit on row 0's tool tokens, 9 on the prompts.
VALUES = torch.tensor([[9, 0.5, 0.6, 5, 7, 0.8], [9, 0.1, 0.2, 0.3, 0, 0], [9, 0.4, 0, 0, 0, 0]], dtype=F64)


def _rewards() -> torch.Tensor:
    r = torch.zeros(3, 6, dtype=F64)
    r[0, 5] = 1.0
    r[1, 3] = 0.5
    r[2, 1] = 0.25
    return r


def _inp(**kw) -> EstimatorInput:
    base = {
        "rewards": _rewards(),
        "mask": MASK,
        "values": VALUES,
        "groups": [0, 0, 1],
        "gamma": 0.9,
        "lam": 0.8,
    }
    return EstimatorInput(**{**base, **kw})


def test_registered_with_trainer_and_version():
    for name in (
        "slime:grpo",
        "slime:reinforce_plus_plus",
        "slime:reinforce_plus_plus_baseline",
        "slime:ppo",
    ):
        assert (get(name).trainer, get(name).version) == ("slime", "0.3.1")
    assert get("slime:grpo").params == {
        "rewards_normalization": True,
        "grpo_std_normalization": True,
        "normalize_advantages": False,
    }


def test_grpo_group_of_two_and_singleton_nan():
    """Group {0, 1}: rewards 1 and 0.5, mean 0.75, centred +-0.25, unbiased std
    sqrt((0.25^2 + 0.25^2) / 1) = 0.353553; 0.25 / (0.353553 + 1e-6) = 0.707105 (float32).
    Group {2} has one member: torch.std of one element is NaN, so slime's advantage is NaN."""
    adv = compute("slime:grpo", _inp()).advantages
    a = 0.25 / (math.sqrt(0.125) + 1e-6)
    torch.testing.assert_close(adv[0, [1, 2, 5]], torch.full((3,), a, dtype=F64), rtol=1e-6, atol=0)
    torch.testing.assert_close(adv[1, [1, 2, 3]], torch.full((3,), -a, dtype=F64), rtol=1e-6, atol=0)
    assert math.isnan(float(adv[2, 1]))
    assert torch.all(adv[0, [0, 3, 4]] == 0)  # 0 off the policy mask (tool tokens, prompt)


def test_grpo_without_std_is_dr_grpo():
    """--disable-grpo-std-normalization: reward minus group mean; the singleton gets 0.25 - 0.25 = 0."""
    adv = compute("slime:grpo", _inp(), grpo_std_normalization=False).advantages
    assert float(adv[0, 1]) == 0.25 and float(adv[1, 1]) == -0.25 and float(adv[2, 1]) == 0.0


def test_grpo_all_equal_group_is_zero_and_raw_without_normalization():
    r = torch.zeros(3, 6, dtype=F64)
    r[0, 5] = r[1, 3] = 0.7  # an all-equal group: 0 / (0 + 1e-6) = 0
    r[2, 1] = 0.7
    adv = compute("slime:grpo", _inp(rewards=r, groups=[0, 0, 0])).advantages
    assert torch.all(adv == 0)
    # --disable-rewards-normalization: the raw reward (float32: 0.7 -> 0.699999988).
    raw = compute("slime:grpo", _inp(rewards=r), rewards_normalization=False).advantages
    assert float(raw[1, 2]) == float(torch.tensor(0.7, dtype=torch.float32))


def test_grpo_labels_and_contiguous_blocks_agree():
    """Contiguous blocks run slime's own reshape(-1, n); interleaved labels the same statistics."""
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(8, generator=g, dtype=F64)
    r = torch.zeros(8, 3, dtype=F64)
    r[:, 2] = scores
    m = torch.ones(8, 3, dtype=torch.long)
    block = compute(
        "slime:grpo", EstimatorInput(rewards=r, mask=m, groups=[0, 0, 0, 0, 1, 1, 1, 1])
    ).advantages
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
    labels = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])[perm]
    mixed = compute("slime:grpo", EstimatorInput(rewards=r[perm], mask=m, groups=labels)).advantages
    torch.testing.assert_close(mixed, block[perm], rtol=1e-6, atol=1e-7)


def test_reward_on_a_tool_token_counts():
    """slime's reward is one number per sample: 0.5 uploaded on row 0's tool token (position 3)
    makes its reward 1.5. REINFORCE++ baseline: group {0, 1} mean (1.5 + 0.5) / 2 = 1, so +0.5 / -0.5."""
    r = _rewards()
    r[0, 3] = 0.5
    adv = compute("slime:reinforce_plus_plus_baseline", _inp(rewards=r)).advantages
    assert float(adv[0, 1]) == 0.5 and float(adv[1, 2]) == -0.5
    assert float(adv[2, 1]) == 0.0  # a group of one: r - r


def test_reinforce_plus_plus_steps_through_tool_tokens():
    """Raw reward 1 on row 0's last policy token (position 5); G_t = r_t + 0.9 G_{t+1} over every
    response position: G5 = 1, G4 = 0.9, G3 = 0.81 (tool tokens), G2 = 0.729, G1 = 0.6561. With our
    conventions (one discount per policy token) position 1 would get 0.81."""
    adv = compute("slime:reinforce_plus_plus", _inp()).advantages
    torch.testing.assert_close(
        adv[0], torch.tensor([0, 0.6561, 0.729, 0, 0, 1.0], dtype=F64), rtol=1e-6, atol=0
    )
    # Row 1: 0.5 at position 3: 0.5, 0.45, 0.405. Row 2: 0.25.
    torch.testing.assert_close(adv[1, 1:4], torch.tensor([0.405, 0.45, 0.5], dtype=F64), rtol=1e-6, atol=0)
    assert float(adv[2, 1]) == 0.25


def test_ppo_gae_reads_tool_values_and_decays_per_tool_token():
    """gamma 0.9, lambda 0.8 (gamma lambda 0.72) on row 0, response positions 1..5 with values
    0.5, 0.6, 5, 7, 0.8 (5 and 7 on tool tokens), reward 1 at position 5, V after the end 0:
      d5 = 1 - 0.8 = 0.2                       A5 = 0.2
      d4 = 0.9 * 0.8 - 7 = -6.28               A4 = -6.28 + 0.72 * 0.2 = -6.136
      d3 = 0.9 * 7 - 5 = 1.3                   A3 = 1.3 + 0.72 * -6.136 = -3.11792
      d2 = 0.9 * 5 - 0.6 = 3.9                 A2 = 3.9 + 0.72 * -3.11792 = 1.6550976
      d1 = 0.9 * 0.6 - 0.5 = 0.04              A1 = 0.04 + 0.72 * 1.6550976 = 1.231670272
    (skipping the span, as our token_gae does, position 2 would get 0.9 * 0.8 - 0.6 + 0.72 * 0.2 = 0.264)."""
    out = compute("slime:ppo", _inp())
    torch.testing.assert_close(
        out.advantages[0], torch.tensor([0, 1.231670272, 1.6550976, 0, 0, 0.2], dtype=F64), rtol=0, atol=1e-12
    )
    # Row 2, one policy token: 0.25 - 0.4 = -0.15; returns = A + V = 0.25.
    assert abs(float(out.advantages[2, 1]) + 0.15) < 1e-12
    assert out.value_targets is not None and abs(float(out.value_targets[2, 1]) - 0.25) < 1e-12
    # The values on the tool tokens move the advantage of the policy token before them.
    poked = VALUES.clone()
    poked[0, 3] = 0.0
    assert float(compute("slime:ppo", _inp(values=poked)).advantages[0, 2]) != float(out.advantages[0, 2])


def test_ppo_ignores_truncation():
    """slime bootstraps 0 after the response whether the sample was truncated or not."""
    a = compute("slime:ppo", _inp()).advantages
    b = compute("slime:ppo", _inp(last_value=torch.tensor([3.0, 3.0, 3.0], dtype=F64))).advantages
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_normalize_advantages_whitens_over_policy_tokens():
    """--normalize-advantages on REINFORCE++ baseline: advantages +0.25 (3 tokens of row 0), -0.25
    (3 tokens of row 1), 0 (row 2): mean 0, E[x^2] = 6 * 0.0625 / 7 = 0.0535714, times 7/6 = 0.0625,
    so 0.25 * rsqrt(0.0625 + 1e-8) = 0.99999992."""
    adv = compute("slime:reinforce_plus_plus_baseline", _inp(), normalize_advantages=True).advantages
    expected = 0.25 / math.sqrt(0.0625 + 1e-8)
    torch.testing.assert_close(adv[0, 1], torch.tensor(expected, dtype=F64), rtol=1e-6, atol=0)
    assert float(adv[2, 1]) == 0.0 and float(adv[0, 3]) == 0.0


def test_masked_whiten_one_pass_float32():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=F64)
    m = torch.tensor([[1, 1, 1, 0]])
    # mean 2, E[x^2] = 14 / 3, var = 14/3 - 4 = 2/3, times 3/2 = 1: (x - 2) * rsqrt(1 + 1e-8).
    out = S.masked_whiten(x, m)
    torch.testing.assert_close(out[0, :3], torch.tensor([-1.0, 0.0, 1.0], dtype=F64), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="at least one policy token"):
        S.masked_whiten(x, torch.zeros_like(m))
