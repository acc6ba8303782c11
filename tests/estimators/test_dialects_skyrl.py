"""The ``skyrl:*`` dialects against SkyRL 0.3.0's own code: ``compute_advantages_and_returns`` of
``skyrl/backends/skyrl_train/utils/ppo_utils.py`` (the installed file, through SkyRL's estimator
registry) on SkyRL's view of our batches: the response span (first to last policy token) as its
``response_mask``, float32 rewards as its batch holds them, V = 0 after the response; with tool
spans, an all-equal group, truncated rows and rewards on tool tokens. Plus hand-computed cases.

SkyRL's rewards are float32: outcome estimators and REINFORCE++ compute in float32 (compared to
float32 precision); GAE with float64 values computes in float64 (compared to 1e-12)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from estimators import EstimatorInput, available, compute, native
from estimators.dialects._common import response_span
from tests.estimators.paths import GAE_PATHS, gae_path
from tests.estimators.trainer_refs import (
    F64,
    agent_rows,
    close,
    close_f32,
    skyrl_ppo_utils,
    truncated_last_value,
)


def skyrl(estimator, rewards, mask, groups, values=None, gamma=1.0, lam=1.0, grpo_norm_by_std=True):
    """(advantages, returns) [B, T] from SkyRL 0.3.0's ``compute_advantages_and_returns``."""
    p = skyrl_ppo_utils()
    span = response_span(mask.bool())
    r = torch.where(span, rewards.to(torch.float32), 0.0)  # SkyRL's float32 reward tensor
    v = None if values is None else torch.where(span, values, 0.0)  # nothing after the response
    uids = np.array([f"uid-{int(g)}" for g in groups], dtype=object)
    return p.compute_advantages_and_returns(
        token_level_rewards=r,
        response_mask=span.long(),
        index=uids,
        adv_estimator=estimator,
        config=None,
        values=v,
        grpo_norm_by_std=grpo_norm_by_std,
        gamma=gamma,
        lambd=lam,
    )


def _inp(rewards, mask, groups, values=None, gamma=1.0, lam=1.0):
    return EstimatorInput(
        rewards=rewards,
        mask=mask,
        values=values,
        groups=groups,
        gamma=gamma,
        lam=lam,
        last_value=truncated_last_value(mask.shape[0]),
    )


def test_the_five_names_are_registered():
    names = {n for n, s in available().items() if s.trainer == "skyrl"}
    assert names == {"skyrl:gae", "skyrl:grpo", "skyrl:rloo", "skyrl:reinforce++", "skyrl:maxrl"}
    assert {available()[n].version for n in names} == {"0.3.0"}
    assert available()["skyrl:grpo"].params == {"grpo_norm_by_std": True}


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_against_skyrl(seed, gamma, lam):
    rewards, values, mask, groups = agent_rows(seed=seed)
    adv, ret = skyrl("gae", rewards, mask, groups, values, gamma, lam)
    ours = compute("skyrl:gae", _inp(rewards, mask, groups, values, gamma, lam))
    close(ours.advantages, adv, mask)
    close(ours.value_targets, ret, mask)
    assert ours.advantages[mask == 0].abs().max().item() == 0.0


def test_gae_float32_against_skyrl():
    rewards, values, mask, groups = agent_rows(seed=2, dtype=torch.float32)
    adv, _ = skyrl("gae", rewards, mask, groups, values, 0.99, 0.95)
    close_f32(compute("skyrl:gae", _inp(rewards, mask, groups, values, 0.99, 0.95)).advantages, adv, mask)


@pytest.mark.parametrize("gamma", [1.0, 0.95])
@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_pp_against_skyrl(gamma, seed):
    rewards, _, mask, groups = agent_rows(seed=seed)
    adv, ret = skyrl("reinforce++", rewards, mask, groups, gamma=gamma)
    ours = compute("skyrl:reinforce++", _inp(rewards, mask, groups, gamma=gamma))
    close_f32(ours.value_targets, ret, mask)
    close_f32(ours.advantages, adv, mask)


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "maxrl"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outcome_estimators_against_skyrl(estimator, seed):
    rewards, _, mask, groups = agent_rows(seed=seed)
    rewards = rewards + 0.001 * mask  # on every policy token: no group mean is 0 (maxrl divides by it)
    adv, _ = skyrl(estimator, rewards, mask, groups)
    ours = compute(f"skyrl:{estimator}", _inp(rewards, mask, groups))
    close_f32(ours.advantages, adv, mask)
    assert ours.advantages[mask == 0].abs().max().item() == 0.0


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_singleton_and_interleaved_groups_against_skyrl(norm):
    """SkyRL groups by a dict of uids: any order, any sizes, a group of one included."""
    rewards, _, mask, groups = agent_rows(seed=4)
    groups = groups[torch.randperm(len(groups), generator=torch.Generator().manual_seed(2))].clone()
    groups[0] = 99  # a group of one
    for est in ("grpo", "rloo", "maxrl"):
        adv, _ = skyrl(est, rewards, mask, groups, grpo_norm_by_std=norm)
        params = {"grpo_norm_by_std": norm} if est == "grpo" else {}
        ours = compute(f"skyrl:{est}", _inp(rewards, mask, groups), **params)
        close_f32(ours.advantages, adv, mask)
    # A group of one: rloo gives 0, grpo s / (1 + 1e-6) (s without norm), maxrl s.
    s = float(torch.where(response_span(mask.bool()), rewards, 0.0)[0].sum())
    row0 = mask[0].bool()
    a_rloo = compute("skyrl:rloo", _inp(rewards, mask, groups)).advantages[0, row0]
    assert a_rloo.abs().max().item() == 0.0
    a_maxrl = compute("skyrl:maxrl", _inp(rewards, mask, groups)).advantages[0, row0]
    assert a_maxrl[0].item() == pytest.approx(s, rel=1e-6)


def test_gae_reads_the_critic_on_tool_tokens_hand_computed():
    """[A, tool, B], gamma = lambda = 1, the outcome 1 on B, V(A) = 0.2, V(B) = 0.5, V(tool) = x.
    SkyRL: A_B = 1 - 0.5 = 0.5; tool: delta = 0 + 0.5 - x, A = 1 - x; A_A = (0 + x - 0.2) + (1 - x)
    = 0.8 whatever x is (lambda = 1 telescopes); at lambda = 0 A_A = x - 0.2, so the tool token's
    value moves it: x = 0.9 -> 0.7, x = 0.3 -> 0.1. Skipping the span (token_gae): 0.5 - 0.2 = 0.3.
    The raw advantages are value_targets - V (SkyRL whitens the advantages themselves)."""
    mask = torch.tensor([[1, 0, 1]])
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=F64)
    for x, want in ((0.9, 0.7), (0.3, 0.1)):
        values = torch.tensor([[0.2, x, 0.5]], dtype=F64)
        inp = EstimatorInput(rewards=rewards, mask=mask, values=values, gamma=1.0, lam=0.0)
        raw = compute("skyrl:gae", inp).value_targets - values
        assert raw[0, 0].item() == pytest.approx(want, abs=1e-12)
        _, ret = skyrl("gae", rewards, mask, torch.zeros(1), values, 1.0, 0.0)
        assert (ret - values)[0, 0].item() == pytest.approx(want, abs=1e-12)
        assert compute("token_gae", inp).advantages[0, 0].item() == pytest.approx(0.3, abs=1e-12)


def test_rloo_group_of_one_gives_zero_where_verl_rloo_keeps_0_7():
    """A group of one with score 0.7: SkyRL's rloo -> 0 ("setting advantage to 0"); verl's rloo -> 0.7."""
    mask = torch.tensor([[1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 1, 1]])
    rewards = torch.zeros(3, 4, dtype=F64)
    rewards[0, 3], rewards[1, 3], rewards[2, 3] = 1.0, 0.0, 0.7
    inp = EstimatorInput(rewards=rewards, mask=mask, groups=torch.tensor([0, 0, 1]))
    assert compute("skyrl:rloo", inp).advantages[2].abs().max().item() == 0.0
    assert compute("rloo", inp).advantages[2, 0].item() == pytest.approx(0.7)
    close(
        compute("skyrl:rloo", inp).advantages,
        skyrl("rloo", rewards, mask, inp.groups)[0].double(),
        mask,
        1e-7,
    )


# ---- the compiled span kernel (estimators/_native.c: span_gae) and its torch fallback ---------


def _edge_rows(dtype: torch.dtype = F64, T: int = 40):
    """agent_rows (tool spans, rewards on tool tokens, truncated rows 10 and 11) plus two rows
    with no policy token at all (rewards and values still there: SkyRL's span is empty, nothing
    of theirs counts) and a row whose only policy token is its first column."""
    rewards, values, mask, groups = agent_rows(seed=5, T=T, dtype=dtype)
    mask[4] = 0
    mask[17] = 0
    mask[6] = 0
    mask[6, 0] = 1
    return rewards, values, mask, groups


@pytest.mark.parametrize("path", GAE_PATHS)
@pytest.mark.parametrize("dtype", [F64, torch.float32])
def test_span_kernel_against_skyrl_with_empty_and_truncated_rows(path, dtype):
    rewards, values, mask, groups = _edge_rows(dtype)
    with gae_path(path):
        for gamma, lam in ((0.99, 0.95), (1.0, 1.0), (0.9, 0.0)):
            adv, ret = skyrl("gae", rewards, mask, groups, values, gamma, lam)
            ours = compute("skyrl:gae", _inp(rewards, mask, groups, values, gamma, lam))
            check = close if dtype == F64 else close_f32
            check(ours.advantages, adv, mask)
            check(ours.value_targets, ret, mask)
            assert ours.advantages[mask == 0].abs().max().item() == 0.0
            assert ours.value_targets[mask == 0].abs().max().item() == 0.0
            assert ours.advantages.dtype == dtype
        adv, ret = skyrl("reinforce++", rewards, mask, groups, gamma=0.95)
        ours = compute("skyrl:reinforce++", _inp(rewards, mask, groups, gamma=0.95))
        close_f32(ours.advantages, adv, mask)
        close_f32(ours.value_targets, ret, mask)
        assert ours.value_targets[mask == 0].abs().max().item() == 0.0


@pytest.mark.parametrize("path", GAE_PATHS)
def test_span_kernel_one_column_against_skyrl(path):
    """T = 1: every span is one token (or empty); SkyRL whitens over the rows that have one."""
    mask = torch.tensor([[1], [0], [1], [1]])
    rewards = torch.tensor([[0.5], [2.0], [-1.0], [0.25]], dtype=F64)
    values = torch.tensor([[0.1], [0.3], [0.2], [-0.4]], dtype=F64)
    groups = torch.tensor([0, 0, 1, 1])
    with gae_path(path):
        adv, ret = skyrl("gae", rewards, mask, groups, values, 0.99, 0.95)
        ours = compute("skyrl:gae", _inp(rewards, mask, groups, values, 0.99, 0.95))
        close(ours.advantages, adv, mask)
        # A = r - V on each row (nothing after it): 0.4, -1.2, 0.65; mean -0.05
        close(ours.value_targets, torch.tensor([[0.5], [0.0], [-1.0], [0.25]], dtype=F64), None)
        adv, ret = skyrl("reinforce++", rewards, mask, groups, gamma=0.99)
        ours = compute("skyrl:reinforce++", _inp(rewards, mask, groups, gamma=0.99))
        close_f32(ours.advantages, adv, mask)


@pytest.mark.parametrize("path", GAE_PATHS)
def test_span_kernel_one_span_position_gives_zero_advantages(path):
    """One policy token in the whole batch: nothing to whiten against (SkyRL raises on a mask sum
    of 1); the advantages are 0 and the value target is r - V + V = r (no next value), r as
    SkyRL's float32 reward tensor holds it."""
    mask = torch.tensor([[0, 1, 0], [0, 0, 0]])
    rewards = torch.tensor([[0.0, 0.7, 0.0], [0.0, 0.0, 0.0]], dtype=F64)
    values = torch.full((2, 3), 0.2, dtype=F64)
    with gae_path(path):
        out = compute(
            "skyrl:gae", EstimatorInput(rewards=rewards, mask=mask, values=values, gamma=0.9, lam=0.9)
        )
    assert out.advantages.abs().max().item() == 0.0
    assert out.value_targets[0, 1].item() == pytest.approx(
        float(torch.tensor(0.7, dtype=torch.float32)), abs=1e-15
    )


MASK_DTYPES = [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float32, torch.float64]


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
@pytest.mark.parametrize("dtype", [F64, torch.float32])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_span_kernel_and_torch_path_agree(mask_dtype, dtype, threads):
    """The kernel and the torch fallback (CREDITLENS_NATIVE=0) are the same arithmetic: the
    recursion in double, sums in double, the whitening in the storage dtype. On a batch big enough
    for the kernel to use threads (66 x 1100 >= 2^16 positions), every mask dtype, lambda = 0 (the c = 0 branch)."""
    rewards, values, mask, _ = agent_rows(n_groups=11, n=6, T=1100, seed=7, dtype=dtype)
    mask[5] = 0
    mask = mask.to(mask_dtype)
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for gamma, lam, vals in ((0.99, 0.95, values), (0.97, 0.0, values), (0.99, 1.0, None)):
            r32 = rewards.to(torch.float32)
            native_out = native.span_gae(r32, vals, mask, gamma, lam)
            assert native_out is not None
            with native.disabled():
                assert native.span_gae(r32, vals, mask, gamma, lam) is None
                name = "skyrl:reinforce++" if vals is None else "skyrl:gae"
                ref = compute(
                    name, EstimatorInput(rewards=rewards, mask=mask, values=vals, gamma=gamma, lam=lam)
                )
            out = compute(name, EstimatorInput(rewards=rewards, mask=mask, values=vals, gamma=gamma, lam=lam))
            for a, b in ((out.advantages, ref.advantages), (out.value_targets, ref.value_targets)):
                assert a.dtype == b.dtype == dtype
                # float32: at most one rounding apart (the mean's float64 sum in another order)
                ulp = 1e-13 if dtype == F64 and vals is not None else 2.4e-7
                assert (a.double() - b.double()).abs().max().item() <= ulp * max(b.abs().max().item(), 1.0)
    finally:
        torch.set_num_threads(old)


def test_span_kernel_empty_shapes():
    for B, T in ((0, 5), (3, 0), (0, 0)):
        r = torch.zeros(B, T)
        adv, tgt = native.span_gae(r, r, torch.ones(B, T), 0.9, 0.9)
        assert adv.shape == tgt.shape == (B, T)


@pytest.mark.parametrize("path", GAE_PATHS)
def test_span_kernel_a_nan_value_stays_on_the_policy_tokens(path):
    """A NaN critic value makes the batch's whitening mean NaN: every policy token's advantage is
    NaN, every other position still 0; the value targets are NaN in the NaN's row alone, both
    paths alike (how far along the row differs: the kernel carries it backwards only, the torch
    scan's chunks both ways)."""
    rewards, values, mask, groups = agent_rows(seed=3)
    values[2, 5] = float("nan")
    with gae_path(path):
        out = compute("skyrl:gae", _inp(rewards, mask, groups, values, 0.99, 0.95))
    on = mask != 0
    assert out.advantages[on].isnan().all()
    assert out.advantages[~on].eq(0).all()
    assert out.value_targets[~on].eq(0).all()
    nan_rows = out.value_targets.isnan().any(1)
    assert nan_rows.tolist() == [b == 2 for b in range(mask.shape[0])]
