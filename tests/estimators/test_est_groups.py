"""Group estimators: hand-computed numbers, and the documented singleton / all-equal behaviour of
every one of them (see the table in estimators/groups.py)."""

from __future__ import annotations

import math

import pytest
import torch

from estimators import (
    EstimatorInput,
    batch_whiten,
    compute,
    dr_grpo,
    explained_variance,
    gpg,
    group_center_batch_scale,
    group_mean,
    group_stats,
    grpo,
    grpo_passk,
    opo,
    rloo,
)

F64 = torch.float64
S = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0], dtype=F64)
TWO_GROUPS = torch.tensor([7, 7, 7, 7, 3, 3, 3, 3])


def test_batch_whiten_ignores_groups():
    # Batch mean 0.5; sample variance 8 * 0.25 / 7 = 0.285714, std 0.534522; 0.5 / 0.534522 = 0.935414.
    a = batch_whiten(S, TWO_GROUPS)
    assert a.tolist() == pytest.approx(
        [0.935414, -0.935414, -0.935414, -0.935414] + [0.935414] * 3 + [-0.935414], abs=1e-5
    )
    assert torch.equal(a, batch_whiten(S))


def test_group_center_batch_scale():
    # Group means 0.25 and 0.75: centred [0.75, -0.25 x3 | 0.25 x3, -0.75]; batch std of the scores
    # 0.534522 (see above): 0.75 / 0.534522 = 1.403113, -0.25 / 0.534522 = -0.467707.
    a = group_center_batch_scale(S, TWO_GROUPS)
    assert a[:2].tolist() == pytest.approx([1.403113, -0.467707], abs=1e-5)
    assert a[4:].tolist() == pytest.approx([0.467707] * 3 + [-1.403113], abs=1e-5)
    # Same ratio between groups as plain group centring: no per-group std weighting.
    gm = group_mean(S, TWO_GROUPS)
    torch.testing.assert_close(a / gm, torch.full_like(a, a[0].item() / gm[0].item()))
    # "centered": std of the centred scores, mean 0, sample var (2 * 0.5625 + 6 * 0.0625) / 7 = 0.214286.
    c = group_center_batch_scale(S, TWO_GROUPS, scale_of="centered")
    assert c[0].item() == pytest.approx(0.75 / math.sqrt(1.5 / 7), abs=1e-5)


def test_explained_variance():
    target = torch.tensor([[1.0, 2, 9, 3, 4]])
    pred = torch.tensor([[1.0, 2, -5, 3, 3]])
    mask = torch.tensor([[1, 1, 0, 1, 1]])
    # On the mask: residual [0, 0, 0, 1], population var 0.1875; var(target) 1.25; 1 - 0.15 = 0.85.
    assert explained_variance(pred, target, mask).item() == pytest.approx(0.85)
    assert explained_variance(target, target, mask).item() == 1.0
    assert math.isnan(explained_variance(pred, torch.ones_like(target), mask).item())


def test_group_stats_any_labels():
    st = group_stats(torch.tensor([1.0, 2.0, 10.0, 4.0]), ["b", "a", "c", "a"])
    assert st.count.tolist() == [1, 2, 1, 2]
    assert st.mean.tolist() == [1.0, 3.0, 10.0, 3.0]
    assert st.std("sample")[1].item() == pytest.approx(math.sqrt(2))
    assert st.std("population")[1].item() == pytest.approx(1.0)


def test_opo_and_gpg_hand():
    s = torch.tensor([1.0, 0.0, 0.0, 2.0], dtype=F64)
    groups = torch.tensor([0, 0, 0, 1])
    lengths = torch.tensor([1, 3, 0, 5])
    # Group 0: b = (1 * 1 + 3 * 0 + 0 * 0) / 4 = 0.25; singleton group 1: b = 0.
    assert opo(s, groups, lengths).tolist() == pytest.approx([0.75, -0.25, -0.25, 2.0])
    # alpha = 4 / 2 nonzero scores = 2; group 0 mean 1/3: 2 * (1 - 1/3) = 4/3; singleton: 2 * 2 = 4.
    assert gpg(s, groups).tolist() == pytest.approx([4 / 3, -2 / 3, -2 / 3, 4.0])


def test_grpo_passk_hand():
    s = torch.tensor([0.2, 0.9, 0.5, 1.0, 1.0, 0.0], dtype=F64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    # Group 0: best 0.9, second 0.5: 0.4 on row 1 only. Group 1: tied top: 0 everywhere.
    assert grpo_passk(s, groups, norm=False).tolist() == pytest.approx([0, 0.4, 0, 0, 0, 0])
    # Normalised: sample std of [0.2, 0.9, 0.5] = 0.351188; 0.4 / (0.351188 + 1e-6) = 1.138982.
    assert grpo_passk(s, groups)[1].item() == pytest.approx(0.4 / (0.3511884584 + 1e-6), rel=1e-8)


# Singleton (row 0, alone in its group) and all-equal (rows 1-3) behaviour of every group estimator.
SCORES = torch.tensor([0.7, 0.3, 0.3, 0.3, 1.0, 0.0], dtype=F64)
LABELS = torch.tensor([0, 1, 1, 1, 2, 2])


@pytest.mark.parametrize(
    "fn, singleton",
    [
        (group_mean, 0.0),
        (lambda s, g: grpo(s, g), 0.7 / 1.0000009536743164),  # verl: mean 0, std 1 (1 + 1e-6 in float32)
        (lambda s, g: grpo(s, g, norm=False), 0.7),
        (dr_grpo, 0.7),
        (rloo, 0.7),  # verl's rloo keeps the score
        (lambda s, g: rloo(s, g, singleton="zero"), 0.0),  # verl's rloo_vectorized
        (lambda s, g: group_center_batch_scale(s, g), 0.0),
        (lambda s, g: opo(s, g, torch.ones(6)), 0.7),
        (lambda s, g: gpg(s, g), 0.7 * 6 / 5),  # alpha = 6 rows / 5 nonzero scores
    ],
)
def test_singleton_and_all_equal(fn, singleton):
    a = fn(SCORES, LABELS)
    assert a[0].item() == pytest.approx(singleton, abs=1e-15)
    assert a[1:4].tolist() == [0.0, 0.0, 0.0]  # exactly, for every estimator


def test_passk_rejects_singletons_and_batch_whiten_single_row():
    with pytest.raises(ValueError, match="at least 2"):
        grpo_passk(SCORES, LABELS)
    assert batch_whiten(torch.tensor([3.0])).tolist() == [0.0]


def test_registry_outcome_broadcast_and_episode_advantages():
    mask = torch.tensor([[0, 1, 1, 0, 1], [1, 0, 0, 0, 0], [0, 0, 1, 1, 0]])
    rewards = torch.tensor([[5.0, 0, 0, 0, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0.5, 0]])  # 5.0 sits on a prompt
    out = compute("group_mean", EstimatorInput(rewards=rewards, mask=mask))
    # Scores on policy positions: [1, 0, 0.5]; mean 0.5 -> [0.5, -0.5, 0].
    assert out.extras["episode_advantages"].tolist() == pytest.approx([0.5, -0.5, 0.0])
    expected = torch.tensor([[0, 0.5, 0.5, 0, 0.5], [-0.5, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
    torch.testing.assert_close(out.advantages, expected)
    # verl's unmasked sum counts the 5.0: scores [6, 0, 0.5], mean 13/6.
    un = compute("group_mean", EstimatorInput(rewards=rewards, mask=mask), score="unmasked")
    assert un.extras["episode_advantages"][0].item() == pytest.approx(6 - 6.5 / 3)


@pytest.mark.parametrize("name", ["verl_gae", "reinforce_plus_plus", "reinforce_plus_plus_baseline"])
def test_whitening_estimators_with_one_policy_token_give_zero(name):
    # verl raises ValueError (unbiased variance of one token); the registry returns 0 instead.
    inp = EstimatorInput(
        rewards=torch.tensor([[0.0, 1.0]]), mask=torch.tensor([[0, 1]]), values=torch.tensor([[0.0, 0.5]])
    )
    assert compute(name, inp).advantages.tolist() == [[0.0, 0.0]]
    with pytest.raises(ValueError):
        E_whiten(inp.rewards, inp.mask)


def E_whiten(x, m):
    from estimators import whiten

    return whiten(x, m)
