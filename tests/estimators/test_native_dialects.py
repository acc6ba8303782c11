"""The compiled passes behind the dialects' helpers (estimators/dialects/_common.py), each against
what it replaces: ``row_broadcast`` (``broadcast``, ``on_policy``) bit for bit the torch
expressions ``adv.unsqueeze(-1) * mask`` and ``torch.where(mask, adv[:, None], 0)``, signed zeros
and NaNs included; ``row_counts``; ``masked_returns`` (``returns_over``, ReMax) bit for bit the
masked GAE kernel with V = 0, lambda = 1; ``whiten_rows`` against whitening the broadcast [B, T]
tensor. Every mask and value dtype, strided inputs, empty shapes, threads."""

from __future__ import annotations

import pytest
import torch

from estimators import native
from estimators import token as tok
from estimators.dialects._common import broadcast, on_policy, returns_over, whiten_rows, whiten_unbiased
from tests.estimators.trainer_refs import agent_rows

MASK_DTYPES = [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float32, torch.float64]


def _same(x: torch.Tensor, y: torch.Tensor) -> None:
    """Equal values, NaNs in the same places, the same signs (a -0.0 stays -0.0)."""
    assert x.dtype == y.dtype and x.shape == y.shape
    assert torch.equal(x.isnan(), y.isnan())
    assert torch.equal(x.nan_to_num(), y.nan_to_num())
    assert torch.equal(torch.signbit(x), torch.signbit(y))


def _rows(B: int, T: int, dtype: torch.dtype, mask_dtype: torch.dtype):
    g = torch.Generator().manual_seed(B + T)
    a = torch.randn(B, generator=g, dtype=torch.float64).to(dtype)
    a[0] = float("nan")
    a[1] = float("-inf")
    a[2] = -0.5  # a negative times a 0 mask: -0.0
    m = (torch.rand(B, T, generator=g) < 0.4).to(mask_dtype)
    return a, m


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("threads", [1, 2])
def test_broadcast_is_the_torch_expression_bit_for_bit(mask_dtype, dtype, threads):
    a, m = _rows(70, 1000, dtype, mask_dtype)  # 70 000 >= 2^16 positions: the kernel uses threads
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours, sel = broadcast(a, m), on_policy(a, m != 0)
        with native.disabled():
            ref, ref_sel = broadcast(a, m), on_policy(a, m != 0)
    finally:
        torch.set_num_threads(old)
    want = torch.where(m, a[:, None], 0.0) if mask_dtype == torch.bool else (a[:, None] * m).to(dtype)
    _same(ref, want)
    _same(ours, want)
    _same(sel, ref_sel)
    assert torch.signbit(ours[2][m[2] == 0]).all() == (mask_dtype != torch.bool)


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.float32, torch.float64])
def test_a_mask_that_is_not_0_1_multiplies(mask_dtype):
    """EstimatorInput.mask is 0/1 by contract; anything else is still multiplied as torch would:
    float32 x float64 in float64, rounded once (0.3 is not a float32)."""
    a = torch.tensor([0.7, -1.1], dtype=torch.float32)
    m = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]]).to(mask_dtype)
    if mask_dtype.is_floating_point:
        m = m * 0.3
    ours = broadcast(a, m)
    with native.disabled():
        ref = broadcast(a, m)
    _same(ours, ref)


def test_strided_and_empty():
    a, m = _rows(8, 30, torch.float32, torch.int64)
    _same(broadcast(a[::2], m[::2, ::3]), (a[::2, None] * m[::2, ::3]).float())
    for B, T in ((0, 4), (3, 0), (0, 0)):
        out = broadcast(torch.zeros(B), torch.ones(B, T, dtype=torch.int64))
        assert out.shape == (B, T) and out.dtype == torch.float32


def test_kernel_applies():
    assert native.row_broadcast(torch.ones(2), torch.ones(2, 3, dtype=torch.int64)) is not None
    with native.disabled():
        assert native.row_broadcast(torch.ones(2), torch.ones(2, 3, dtype=torch.int64)) is None


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
def test_row_counts(mask_dtype):
    _, m = _rows(9, 301, torch.float32, mask_dtype)
    assert torch.equal(native.row_counts(m), (m != 0).sum(-1))
    assert torch.equal(native.row_counts(m[:, ::2]), (m[:, ::2] != 0).sum(-1))
    assert native.row_counts(torch.ones(0, 3)).shape == (0,)


@pytest.mark.parametrize("mask_dtype", MASK_DTYPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_masked_returns_is_the_gae_kernel_with_zero_values(mask_dtype, dtype):
    rewards, _, mask, _ = agent_rows(n_groups=12, n=6, T=1000, seed=3, dtype=dtype)  # threads
    rewards[0, 5] = -0.0
    m = mask.to(mask_dtype)
    base = torch.randn(72, dtype=torch.float64)
    for gamma in (1.0, 0.97, 0.0):
        want = tok.gae(rewards, torch.zeros_like(rewards), m, gamma, 1.0)[0]
        ret, adv = native.masked_returns(rewards, m, gamma, base)
        _same(ret, want)
        _same(returns_over(rewards, m, gamma), want)
        _same(adv, torch.where(m != 0, want - base.to(dtype)[:, None], torch.zeros((), dtype=dtype)))
        assert native.masked_returns(rewards, m, gamma)[1] is None
    with pytest.raises(ValueError, match="gamma"):
        returns_over(rewards, m, 1.5)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_whiten_rows_is_whitening_the_broadcast(mask_dtype, dtype):
    """The per-row closed form against ``whiten_unbiased`` of the [B, T] broadcast: float64 to
    1e-12; float32 within two roundings (its float32 sums against our float64 ones)."""
    a, m = _rows(40, 700, dtype, mask_dtype)
    a = a.nan_to_num(0.0, 0.0, 0.0)
    for path in ("native", "torch"):
        if path == "torch":
            with native.disabled():
                ours = whiten_rows(a, m)
        else:
            ours = whiten_rows(a, m)
        ref = whiten_unbiased(broadcast(a, m), m != 0, zero_off=True)
        tol = 1e-12 if dtype == torch.float64 else 5e-6
        torch.testing.assert_close(ours, ref, rtol=0, atol=tol)
        assert ours[m == 0].abs().max().item() == 0.0
    one = torch.zeros(2, 3, dtype=mask_dtype)
    one[1, 2] = 1  # a single policy token: nothing to whiten against
    assert whiten_rows(torch.tensor([1.0, 2.0], dtype=dtype), one).abs().max().item() == 0.0


def _otb_batches():
    """test_dialects_verl's batches (tool spans, a group of one, float32) plus edge rows: a row
    with no policy token (the multi-turn baseline leaves it out of its group), a group whose
    longest row is unique (the zero tail), a group of two equal lengths (no tail)."""
    from tests.estimators.test_dialects_verl import batch

    out = [batch(0), batch(1, singleton=True), batch(2, dtype=torch.float32)]
    edge = batch(3)
    edge.mask = edge.mask.clone()
    edge.mask[5] = 0
    edge.mask[8:12, 30:] = 0
    edge.mask[9, 20:] = 1  # row 9 the unique longest of its group
    out.append(edge)
    return out


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_otb_kernel_is_the_torch_path_bit_for_bit(name, monkeypatch):
    import estimators.dialects.verl as verl_dialects
    from estimators import compute

    for inp in _otb_batches():
        ours = compute(f"verl:{name}", inp)
        with monkeypatch.context() as mp:
            mp.setattr(verl_dialects, "_otb_native", lambda *_: None)  # the torch passes
            ref = compute(f"verl:{name}", inp)
        _same(ours.advantages, ref.advantages)
        _same(ours.value_targets, ref.value_targets)


@pytest.mark.verl
@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_otb_kernel_against_verl_on_edge_rows(name):
    """The installed verl 0.9.1 functions on the edge batch (float64: to 1e-12 on policy tokens)."""
    import numpy as np

    from estimators import compute
    from tests.estimators.trainer_refs import close

    v = pytest.importorskip("verl.trainer.ppo.core_algos")
    fn = {
        "optimal_token_baseline": v.compute_optimal_token_baseline_advantage,
        "tir_optimal_token_baseline": v.compute_multi_turn_optimal_token_baseline_advantage,
    }[name]
    inp = _otb_batches()[3]
    uid = np.array([f"uid-{int(g)}" for g in inp.groups], dtype=object)
    want, _ = fn(inp.rewards, inp.mask, uid, inp.logprobs, inp.sum_pi_squared)
    close(compute(f"verl:{name}", inp).advantages, want, inp.mask)
