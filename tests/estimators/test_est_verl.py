"""Conformance with verl 0.9.1 itself (``verl.trainer.ppo.core_algos``), on random float64 batches
with right padding, holes in the mask, singleton and all-equal groups: 1e-12 in float64, 1e-5
relative in float32. verl's whitening computes its count (and N/(N-1)) in the mask's dtype, ours in
the data's: verl is given a mask of the data's dtype where it whitens, so both compute in float64. Where we choose differently from verl, both sides are tested."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import estimators as E
from estimators import EstimatorInput, compute
from tests.estimators.paths import GAE_PATHS, gae_path

pytestmark = pytest.mark.verl
F64 = torch.float64


@pytest.fixture(scope="session")
def verl():
    """verl's estimator module, imported once per session (it takes ~10 s)."""
    return pytest.importorskip("verl.trainer.ppo.core_algos")


@pytest.fixture(scope="session")
def verl_F():
    return pytest.importorskip("verl.utils.torch_functional")


def _config(**kw):
    from omegaconf import OmegaConf

    return OmegaConf.create({"gamma": 1.0, "norm_adv_by_std_in_grpo": True, **kw})


# Group layout: sizes 3, 4, 1 (singleton), 3 (all equal), 2, 5 (interleaved labels, not contiguous).
LABELS = [0, 1, 0, 1, 2, 1, 0, 3, 3, 1, 3, 4, 4, 5, 5, 5, 5, 5]
ALL_EQUAL = 3


def make_batch(seed: int, dtype=F64, T: int = 48, holes: bool = True):
    """(rewards, values, mask int64, labels np.array) with rewards only on policy positions."""
    g = torch.Generator().manual_seed(seed)
    B = len(LABELS)
    mask = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        L = int(torch.randint(2, T, (1,), generator=g))  # right padding after L
        mask[b, :L] = 1
        if holes:
            for _ in range(3):  # tool spans inside the response
                s = int(torch.randint(1, max(L - 1, 2), (1,), generator=g))
                mask[b, s : s + int(torch.randint(1, 5, (1,), generator=g))] = 0
            mask[b, 0] = 1
    rewards = torch.randn(B, T, generator=g, dtype=F64) * 0.1 * mask
    values = torch.randn(B, T, generator=g, dtype=F64)
    outcome = (torch.rand(B, generator=g) < 0.5).double()
    last = E.outcome_rewards(mask, outcome)
    rewards = rewards + last
    for b, lab in enumerate(LABELS):
        if lab == ALL_EQUAL:  # outcome-only rewards, same score for every member
            rewards[b] = E.outcome_rewards(mask[b : b + 1], torch.tensor([0.7], dtype=F64))[0]
    return rewards.to(dtype), values.to(dtype), mask, np.array(LABELS)


def _uids(labels):
    """verl's trainer passes uuid strings; loop-based estimators key a dict by them."""
    return np.array([f"uid-{x}" for x in labels], dtype=object)


def close(ours, theirs, mask=None, dtype=F64):
    ours, theirs = ours.double(), theirs.double()
    if mask is not None:
        m = mask != 0
        ours, theirs = ours[m], theirs[m]
    if dtype == F64:
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    else:
        scale = max(theirs.abs().max().item(), 1e-12)
        assert (ours - theirs).abs().max().item() <= 1e-5 * scale


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (1.0, 0.5)])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("path", GAE_PATHS)
def test_gae(verl, seed, gamma, lam, dtype, path):
    rewards, values, mask, _ = make_batch(seed, dtype)
    v_adv, v_ret = verl.compute_gae_advantage_return(rewards, values, mask.to(dtype), gamma, lam)
    inp = EstimatorInput(rewards=rewards, mask=mask, values=values, gamma=gamma, lam=lam)
    with gae_path(path):
        ours = compute("verl_gae", inp)
        # Raw GAE (no whitening) is verl's returns - values on policy positions.
        raw, _ = E.gae(rewards, values, mask, gamma, lam)
    close(ours.advantages, v_adv, mask, dtype)
    close(ours.value_targets, v_ret, mask, dtype)
    close(raw, v_ret - values, mask, dtype)
    # Documented difference: verl leaves nonzero numbers on mask-0 positions, we put 0.
    off = mask == 0
    assert ours.advantages[off].abs().max().item() == 0.0
    assert v_adv[off].abs().max().item() > 0.0


def test_gae_bool_mask_breaks_verl_not_us(verl):
    rewards, values, mask, _ = make_batch(0)
    with pytest.raises(RuntimeError, match="bool"):
        verl.compute_gae_advantage_return(rewards, values, mask.bool(), 1.0, 1.0)
    a_bool, _ = E.gae(rewards, values, mask.bool(), 1.0, 1.0)
    assert torch.equal(a_bool, E.gae(rewards, values, mask, 1.0, 1.0)[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_grpo_family(verl, seed, dtype):
    rewards, _, mask, labels = make_batch(seed, dtype)
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=torch.tensor(labels))
    ne = torch.tensor(labels != ALL_EQUAL)
    for norm, name in ((True, "grpo"), (False, "dr_grpo")):
        v, _ = verl.compute_grpo_outcome_advantage(rewards, mask, _uids(labels), norm_adv_by_std_in_grpo=norm)
        # verl's all-equal group keeps its rounding residue (divided by std + 1e-6 ~ 1e-6 when
        # normalised: up to ~1e-10); ours is exactly 0 there (asserted below).
        close(compute(name, inp).advantages[ne], v[ne], None, dtype)
        assert v[~ne].abs().max().item() < (1e-9 if dtype == F64 else 0.1)
        vv, _ = verl.compute_grpo_vectorized_outcome_advantage(
            rewards, mask, labels, norm_adv_by_std_in_grpo=norm
        )
        # grpo_vectorized computes its statistics in float32: compare at float32 precision, except
        # on the all-equal group, where its float32 std is ~1e-8 instead of 0 and divides a ~1e-8
        # residue by 1e-6 (verl gives ~0.01 there; we give exactly 0).
        close(compute(name, inp).advantages[ne], vv[ne], None, torch.float32)
    # All-equal group: exactly 0 here.
    eq = torch.tensor(labels == ALL_EQUAL)
    assert compute("grpo", inp).advantages[eq].abs().max().item() == 0.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rloo(verl, seed):
    rewards, _, mask, labels = make_batch(seed)
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=torch.tensor(labels))
    v, _ = verl.compute_rloo_outcome_advantage(rewards, mask, _uids(labels))
    close(compute("rloo", inp).advantages, v)
    vv, _ = verl.compute_rloo_vectorized_outcome_advantage(rewards, mask, labels)
    close(compute("rloo", inp, singleton="zero").advantages, vv)
    # The two verl variants differ exactly on the singleton row (label 2).
    single = torch.tensor(labels == 2)
    assert v[single].abs().sum() > 0 and vv[single].abs().sum() == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_plus_plus_baseline_opo_gpg(verl, seed):
    rewards, _, mask, labels = make_batch(seed)
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=torch.tensor(labels))
    v, _ = verl.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask.double(), _uids(labels))
    close(compute("reinforce_plus_plus_baseline", inp).advantages, v)
    v, _ = verl.compute_opo_outcome_advantage(rewards, mask, _uids(labels))
    close(compute("opo", inp).advantages, v)
    v, _ = verl.compute_gpg_outcome_advantage(rewards, mask, _uids(labels))
    close(compute("gpg", inp).advantages, v)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk(verl, seed, norm):
    rewards, _, mask, labels = make_batch(seed)
    keep = torch.tensor(labels != 2)  # passk rejects singletons (both verl and us)
    r, m, lab = rewards[keep], mask[keep], labels[keep.numpy()]
    # Distinct top scores in every group, plus one tied top (group 5's two best equal).
    v, _ = verl.compute_grpo_passk_outcome_advantage(
        r, m, _uids(lab), config=_config(norm_adv_by_std_in_grpo=norm)
    )
    inp = EstimatorInput(rewards=r, mask=m, groups=torch.tensor(lab))
    close(compute("grpo_passk", inp, norm=norm).advantages, v)
    with pytest.raises(ValueError):
        verl.compute_grpo_passk_outcome_advantage(rewards, mask, _uids(labels), config=_config())
    with pytest.raises(ValueError):
        compute("grpo_passk", EstimatorInput(rewards=rewards, mask=mask, groups=torch.tensor(labels)))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_reinforce_plus_plus(verl, seed, gamma, dtype):
    rewards, _, mask, _ = make_batch(seed, dtype)
    v_adv, v_ret = verl.compute_reinforce_plus_plus_outcome_advantage(
        rewards, mask.to(dtype), config=_config(gamma=gamma)
    )
    ours = compute("reinforce_plus_plus", EstimatorInput(rewards=rewards, mask=mask, gamma=gamma))
    close(ours.advantages, v_adv, None, dtype)
    close(ours.value_targets, v_ret, None, dtype)


@pytest.mark.parametrize("seed", [0, 1])
def test_remax(verl, seed):
    rewards, _, mask, _ = make_batch(seed)
    b = torch.randn(rewards.shape[0], generator=torch.Generator().manual_seed(seed), dtype=F64)
    v_adv, v_ret = verl.compute_remax_outcome_advantage(rewards, b, mask)
    ours = compute("remax", EstimatorInput(rewards=rewards, mask=mask, reward_baselines=b))
    close(ours.advantages, v_adv, mask)
    close(ours.value_targets, v_ret, mask)
    # Documented difference: verl keeps the suffix sum on interior holes; we put 0.
    holes = (mask == 0) & (torch.cumsum(mask.flip(1), 1).flip(1) > 0)
    assert v_adv[holes].abs().max() > 0 and ours.advantages[holes].abs().max() == 0


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("with_is", [False, True])
@pytest.mark.parametrize("zero_tail", [True, False])
def test_optimal_token_baselines(verl, seed, holes, with_is, zero_tail):
    rewards, _, mask, labels = make_batch(seed, holes=holes)
    g = torch.Generator().manual_seed(seed + 10)
    logp = -torch.rand(rewards.shape, generator=g, dtype=F64) * 3
    spp = torch.exp(2 * logp) + torch.rand(rewards.shape, generator=g, dtype=F64) * 0.2
    isw = torch.rand(rewards.shape, generator=g, dtype=F64) + 0.5 if with_is else None
    if not holes:
        mask[5, 3:] = 0  # a unique longest row needs a clear winner sometimes: vary lengths
    for ours_fn, theirs_fn in (
        (E.optimal_token_baseline, verl.compute_optimal_token_baseline_advantage),
        (E.tir_optimal_token_baseline, verl.compute_multi_turn_optimal_token_baseline_advantage),
    ):
        v_adv, v_ret = theirs_fn(rewards, mask, _uids(labels), logp, spp, isw, handle_zero_tail=zero_tail)
        a, ret = ours_fn(rewards, mask, torch.tensor(labels), logp, spp, isw, handle_zero_tail=zero_tail)
        close(a, v_adv)
        close(ret, v_ret, mask)
    # Registry path (no IS weights).
    inp = EstimatorInput(
        rewards=rewards, mask=mask, groups=torch.tensor(labels), logprobs=logp, sum_pi_squared=spp
    )
    v_adv, _ = verl.compute_multi_turn_optimal_token_baseline_advantage(
        rewards, mask, _uids(labels), logp, spp
    )
    close(compute("tir_optimal_token_baseline", inp).advantages, v_adv)


@pytest.mark.usefixtures("verl")
def test_otb_and_tir_differ_with_holes():
    rewards, _, mask, labels = make_batch(3, holes=True)
    logp = -torch.rand(rewards.shape, generator=torch.Generator().manual_seed(0), dtype=F64)
    spp = torch.exp(2 * logp)
    a, _ = E.optimal_token_baseline(rewards, mask, torch.tensor(labels), logp, spp)
    b, _ = E.tir_optimal_token_baseline(rewards, mask, torch.tensor(labels), logp, spp)
    assert (a - b).abs().max() > 1e-3


def test_scores_masked_vs_unmasked(verl):
    """verl sums rewards over the whole row (no mask); our default sums policy positions only."""
    rewards, _, mask, labels = make_batch(0)
    stray = rewards.clone()
    stray[0, -1] = 5.0 if mask[0, -1] == 0 else stray[0, -1]  # a reward on a padding position
    assert mask[0, -1] == 0
    v, _ = verl.compute_grpo_outcome_advantage(stray, mask, _uids(labels))
    inp = EstimatorInput(rewards=stray, mask=mask, groups=torch.tensor(labels))
    ne = torch.tensor(labels != ALL_EQUAL)  # verl's all-equal group keeps a ~1e-10 residue
    close(compute("grpo", inp, score="unmasked").advantages[ne], v[ne])
    clean = compute("grpo", EstimatorInput(rewards=rewards, mask=mask, groups=torch.tensor(labels)))
    torch.testing.assert_close(
        compute("grpo", inp).advantages, clean.advantages
    )  # the stray reward is ignored
    assert (compute("grpo", inp).advantages - v).abs().max() > 0.1


def test_whiten_matches_verl(verl_F):
    # verl's documented example: mu = 3, unbiased var 2.5.
    x = torch.tensor([[1.0, 2, 3, 100], [4, 5, -7, -7]], dtype=F64)
    m = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    close(E.whiten(x, m), verl_F.masked_whiten(x, m.double()))
    # With an integer mask verl's count and N/(N-1) are float32 (a ~1e-8 relative gap on float64
    # data); ours stay in the data's dtype whatever the mask's.
    assert torch.equal(E.whiten(x, m), E.whiten(x, m.double()))
    gap = (E.whiten(x, m) - verl_F.masked_whiten(x, m))[m.bool()].abs().max().item()
    assert 1e-10 < gap < 1e-6
    assert E.whiten(x, m)[0].tolist() == pytest.approx([-1.2649, -0.6325, 0, 61.348], abs=1e-3)
    rewards, _, mask, _ = make_batch(1)
    close(E.whiten(rewards, mask), verl_F.masked_whiten(rewards, mask.double()))
    close(
        E.whiten(rewards, mask, shift_mean=False),
        verl_F.masked_whiten(rewards, mask.double(), shift_mean=False),
    )
