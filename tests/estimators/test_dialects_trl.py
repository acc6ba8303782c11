"""``trl:grpo`` against TRL 1.16.0's own code: ``GRPOTrainer._generate_and_score_completions``
(``trl/trainer/grpo_trainer.py``) on a tiny CPU model, given the row totals of our batches (tool
spans, an all-equal group, truncated rows, rewards on tool tokens) as its reward. TRL computes in
float32 and so does the dialect, with the same reductions on TRL's contiguous layout: equal to
float32 rounding. Plus hand-computed cases, among them the 0.47x of verl's advantages."""

from __future__ import annotations

import pytest
import torch

from estimators import EstimatorInput, available, compute
from tests.estimators.trainer_refs import F64, agent_rows, close, trl_advantages, truncated_last_value


def _inp(rewards, mask, groups):
    return EstimatorInput(
        rewards=rewards, mask=mask, groups=groups, last_value=truncated_last_value(mask.shape[0])
    )


def test_registered_with_trainer_version_and_param():
    spec = available()["trl:grpo"]
    assert (spec.trainer, spec.version, spec.params) == ("trl", "1.16.0", {"scale_rewards": "group"})


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_against_trl(scale_rewards, seed):
    rewards, _, mask, groups = agent_rows(seed=seed)
    theirs = trl_advantages(rewards.sum(-1), 4, scale_rewards)
    ours = compute("trl:grpo", _inp(rewards, mask, groups), scale_rewards=scale_rewards)
    # The same float32 ops on the same float32 rewards: equal to the last bit or so.
    close(ours.extras["episode_advantages"], theirs, atol=1e-6)
    m = mask.bool()
    close(ours.advantages, theirs[:, None].expand_as(rewards), mask, atol=1e-6)
    assert ours.advantages[~m].abs().max().item() == 0.0
    # The all-equal group (0.75 each) gets exactly 0 in both.
    assert theirs[groups == 1].abs().max().item() == 0.0


def test_a_reward_on_a_tool_token_counts():
    rewards, _, mask, groups = agent_rows(seed=2)
    tool = (mask[0] == 0).nonzero()[0].item()  # a tool token of row 0 (first one left of its end)
    moved = rewards.clone()
    moved[0, tool] += 0.5
    a = compute("trl:grpo", _inp(rewards, mask, groups)).extras["episode_advantages"]
    b = compute("trl:grpo", _inp(moved, mask, groups)).extras["episode_advantages"]
    theirs = trl_advantages(moved.sum(-1), 4)
    close(b, theirs, atol=1e-6)
    assert b[0] > a[0]


def test_interleaved_groups_give_what_trl_gives_the_reordered_batch():
    rewards, _, mask, groups = agent_rows(seed=3)
    perm = torch.randperm(len(groups), generator=torch.Generator().manual_seed(1))
    theirs = trl_advantages(rewards.sum(-1), 4)
    ours = compute("trl:grpo", _inp(rewards[perm], mask[perm], groups[perm])).extras["episode_advantages"]
    close(ours, theirs[perm], atol=2e-6)  # float32 sums in another order


def test_group_of_one_gets_zero():
    """TRL's nanstd of one value is NaN (n - 1 = 0): (r - r) / NaN = NaN -> nan_to_num -> 0."""
    rewards, _, mask, groups = agent_rows(seed=0)
    groups = groups.clone()
    groups[0] = 99
    for scale in ("group", "batch", "none"):
        out = compute("trl:grpo", _inp(rewards, mask, groups), scale_rewards=scale)
        assert out.extras["episode_advantages"][0].item() == 0.0


def test_hand_computed_group():
    """Rewards 1, 0, 0.5, 0.5: mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0 + 0)/3) = 0.408248;
    (1 - 0.5)/(0.408248 + 1e-4) = 1.224445 (TRL printed 1.2244 for these)."""
    mask = torch.ones(4, 3, dtype=torch.long)
    rewards = torch.tensor([[0, 0, 1.0], [0, 0, 0], [0, 0, 0.5], [0, 0, 0.5]], dtype=F64)
    out = compute("trl:grpo", EstimatorInput(rewards=rewards, mask=mask, groups=torch.zeros(4)))
    want = 0.5 / ((0.5 / 3) ** 0.5 + 1e-4)
    assert out.advantages[0, 0].item() == pytest.approx(want, abs=1e-6)
    close(out.extras["episode_advantages"], trl_advantages(rewards.sum(-1), 4), atol=1e-6)


def test_epsilon_makes_trl_047_of_verl_on_a_low_variance_group():
    """Scores 0.5 + k a (k = 0..3) with a = 6.584e-5: unbiased std = a sqrt(5/3) = 8.5e-5.
    TRL: (r - mean)/(8.5e-5 + 1e-4); verl: (r - mean)/(8.5e-5 + 1e-6); ratio
    (8.5e-5 + 1e-6)/(8.5e-5 + 1e-4) = 8.6e-5/1.85e-4 = 0.4649 (0.47x). TRL's float32 rewards move
    the centred values by up to ~1e-3 of themselves."""
    a = 6.584e-5
    s = torch.tensor([0.5 + k * a for k in range(4)], dtype=F64)
    rewards = torch.zeros(4, 3, dtype=F64)
    rewards[:, -1] = s
    inp = EstimatorInput(rewards=rewards, mask=torch.ones(4, 3, dtype=torch.long), groups=torch.zeros(4))
    trl = compute("trl:grpo", inp).extras["episode_advantages"]
    verl = compute("grpo", inp).extras["episode_advantages"]
    ratio = (trl / verl).tolist()
    assert ratio == pytest.approx([8.6e-5 / 1.85e-4] * 4, rel=3e-3)
    close(trl, trl_advantages(s, 4), atol=1e-6)
