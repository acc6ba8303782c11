"""The compiled GAE kernels (estimators/_native.c, token- and turn-level) against the plain-loop
references and against the vectorised torch path, on every mask and value dtype it takes, strided inputs, empty shapes and
any thread count. verl conformance and the worked numbers run through both paths in their own
files (``paths.GAE_PATHS``)."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from estimators import gae, native, turn_gae
from tests.estimators.reference import gae_ref, turn_gae_ref

F64 = torch.float64
MASK_DTYPES = [torch.bool, torch.int64, torch.int32, torch.uint8, torch.float32, torch.float64]


def test_kernel_is_built_and_used():
    """The install builds the kernel (a C compiler is part of the machine); `make bench`'s GAE
    figure depends on it, so a missing build must fail here rather than pass silently."""
    assert native.available()
    assert native.enabled()
    r = torch.zeros(1, 3, dtype=F64)
    assert native.gae(r, r, torch.ones(1, 3), 1.0, 1.0, None) is not None
    with native.disabled():
        assert not native.enabled()
        assert native.gae(r, r, torch.ones(1, 3), 1.0, 1.0, None) is None
    assert native.enabled()


@pytest.fixture
def default_restored():
    yield
    native.set_default(None)


@pytest.mark.usefixtures("default_restored")
def test_env_switch(monkeypatch):
    native.set_default(None)  # follow the environment
    for word in ("0", "false", "OFF", "no", "f", "n"):
        monkeypatch.setenv("CREDITLENS_NATIVE", word)
        assert not native.enabled(), word
    monkeypatch.setenv("CREDITLENS_NATIVE", "1")
    assert native.enabled()
    monkeypatch.delenv("CREDITLENS_NATIVE")
    assert native.enabled()


@pytest.mark.usefixtures("default_restored")
def test_process_default_wins_over_environment(monkeypatch):
    monkeypatch.setenv("CREDITLENS_NATIVE", "0")
    native.set_default(True)
    assert native.enabled()
    native.set_default(False)
    assert not native.enabled()
    r = torch.zeros(1, 3, dtype=F64)
    assert native.gae(r, r, torch.ones(1, 3), 1.0, 1.0, None) is None


def test_disabled_is_per_thread():
    seen = []
    with native.disabled():
        t = threading.Thread(target=lambda: seen.append(native.enabled()))
        t.start()
        t.join()
        assert not native.enabled()
    assert seen == [True]


@st.composite
def cases(draw):
    B = draw(st.integers(1, 6))
    T = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    policy = torch.rand(B, T, generator=g) < draw(st.sampled_from([0.0, 0.3, 0.7, 1.0]))
    mdtype = draw(st.sampled_from(MASK_DTYPES))
    if mdtype.is_floating_point:
        # Any nonzero value is a policy token, fractions and negatives included.
        mask = torch.where(policy, torch.randn(B, T, generator=g), 0.0).to(mdtype)
        mask[policy & (mask == 0)] = 1
    elif mdtype == torch.bool:
        mask = policy
    else:
        mask = policy.to(mdtype) * (1 if mdtype == torch.uint8 else draw(st.sampled_from([1, 2, -1])))
    rdtype, vdtype = draw(st.sampled_from([(F64, F64), (torch.float32, torch.float32), (torch.float32, F64)]))
    rewards = (torch.randn(B, T, generator=g, dtype=F64) * 3).to(rdtype)
    values = torch.randn(B, T, generator=g, dtype=F64).to(vdtype)
    last = None
    if draw(st.booleans()):
        last = torch.randn(B, generator=g, dtype=F64)
        last[torch.rand(B, generator=g) < 0.4] = float("nan")
    gamma = draw(st.sampled_from([0.0, 0.5, 0.9, 0.99, 1.0]))
    lam = draw(st.sampled_from([0.0, 0.3, 0.95, 1.0]))
    return rewards, values, mask, last, gamma, lam


@settings(max_examples=200, deadline=None)
@given(cases())
def test_matches_reference_and_torch_path(case):
    rewards, values, mask, last, gamma, lam = case
    adv, tgt = gae(rewards, values, mask, gamma, lam, last)
    with native.disabled():
        adv_t, tgt_t = gae(rewards, values, mask, gamma, lam, last)
    ref_adv, ref_tgt = gae_ref(rewards, values, mask != 0, gamma, lam, last)
    assert adv.dtype == adv_t.dtype == tgt.dtype == torch.promote_types(rewards.dtype, values.dtype)
    if adv.dtype == F64:
        tol = dict(rtol=1e-12, atol=1e-12)
    else:  # the reference sees float32 inputs exactly; only the storage rounding differs
        tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv.double(), ref_adv, **tol)
    torch.testing.assert_close(tgt.double(), ref_tgt, **tol)
    torch.testing.assert_close(adv, adv_t, **tol)
    torch.testing.assert_close(tgt, tgt_t, **tol)
    off = mask == 0
    assert adv[off].abs().sum().item() == 0 and tgt[off].abs().sum().item() == 0


@settings(max_examples=200, deadline=None)
@given(cases(), st.sampled_from([None, "runs", "merge", "split"]))
def test_turn_matches_reference_and_torch_path(case, ids_kind):
    rewards, values, mask, last, gamma, lam = case
    B, T = mask.shape
    turn_ids = None
    if ids_kind == "merge":  # few distinct ids: turns spanning tool outputs
        turn_ids = torch.arange(T).expand(B, T) // 7
    elif ids_kind == "split":  # ids changing inside runs of policy tokens, as int32
        turn_ids = (torch.arange(T).expand(B, T) // 2).to(torch.int32)
    elif ids_kind == "runs":  # arbitrary ids, equal to neighbours by chance
        turn_ids = torch.randint(0, 3, (B, T), generator=torch.Generator().manual_seed(B * T))
    adv, tgt = turn_gae(rewards, values, mask, gamma, lam, turn_ids, last)
    with native.disabled():
        adv_t, tgt_t = turn_gae(rewards, values, mask, gamma, lam, turn_ids, last)
    ref_adv, ref_tgt = turn_gae_ref(rewards, values, mask != 0, gamma, lam, turn_ids, last)
    tol = dict(rtol=1e-12, atol=1e-12) if adv.dtype == F64 else dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(adv.double(), ref_adv, **tol)
    torch.testing.assert_close(tgt.double(), ref_tgt, **tol)
    torch.testing.assert_close(adv, adv_t, **tol)
    torch.testing.assert_close(tgt, tgt_t, **tol)


def test_strided_inputs():
    g = torch.Generator().manual_seed(3)
    big_r = torch.randn(8, 60, generator=g, dtype=F64)
    big_v = torch.randn(60, 8, generator=g, dtype=F64)
    big_m = torch.rand(8, 120, generator=g) < 0.6
    r, v, m = big_r[::2, ::2], big_v.T[1::2, 1::2], big_m[::2, ::4]  # all [4, 30], none contiguous
    assert not (r.is_contiguous() or v.is_contiguous() or m.is_contiguous())
    adv, tgt = gae(r, v, m, 0.97, 0.9)
    ref_adv, ref_tgt = gae_ref(r, v, m, 0.97, 0.9)
    torch.testing.assert_close(adv, ref_adv, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tgt, ref_tgt, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fn", [gae, turn_gae])
@pytest.mark.parametrize("shape", [(0, 5), (3, 0), (0, 0)])
def test_empty(shape, fn):
    z = torch.zeros(shape)
    adv, tgt = fn(z, z, z, 0.9, 0.9)
    with native.disabled():
        adv_t, _ = fn(z, z, z, 0.9, 0.9)
    assert adv.shape == tgt.shape == adv_t.shape == shape and adv.dtype == adv_t.dtype


def test_turn_ids_shape_is_checked_on_both_paths():
    z = torch.zeros(2, 4)
    for ctx in (native.disabled, _enabled):
        with ctx(), pytest.raises(ValueError, match="turn_ids"):
            turn_gae(z, z, torch.ones(2, 4), 1.0, 1.0, torch.zeros(2, 3))


@contextmanager
def _enabled():
    yield


def test_rows_split_over_threads_give_the_same_bits():
    """Large enough to use threads; B = 7 does not divide evenly."""
    g = torch.Generator().manual_seed(5)
    B, T = 7, 20000
    r, v = torch.randn(B, T, generator=g), torch.randn(B, T, generator=g)
    m = torch.rand(B, T, generator=g) < 0.4
    last = torch.randn(B, generator=g)
    before = torch.get_num_threads()
    try:
        outs, turns = [], []
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            outs.append(gae(r, v, m, 0.99, 0.95, last))
            turns.append(turn_gae(r, v, m, 0.99, 0.95, None, last))
    finally:
        torch.set_num_threads(before)
    for res in (outs, turns):
        for adv, tgt in res[1:]:
            assert torch.equal(adv, res[0][0]) and torch.equal(tgt, res[0][1])
    ref_adv, _ = gae_ref(r[:2], v[:2], m[:2], 0.99, 0.95, last[:2])
    torch.testing.assert_close(outs[0][0][:2].double(), ref_adv, rtol=1e-5, atol=1e-5)
