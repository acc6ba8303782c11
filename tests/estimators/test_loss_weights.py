"""``estimators.loss_weights`` against verl 0.9.1's own policy losses through torch autograd.

For every loss x aggregation x rollout correction, verl's ``get_policy_loss_fn(loss)`` is called
with a real ``ActorConfig`` (its ``global_batch_info`` set as ``verl/workers/utils/losses.py``
sets it for one data-parallel rank) and the rollout weights of verl's
``compute_rollout_correction_weights``; ``-d loss / d log_prob`` from ``backward()`` must equal
our closed form to 1e-10 (float64), on random batches where clipping, dual clipping, TIS
truncation and IcePop bite, with right padding, holes, a fully masked row and finite garbage
off-mask. The token states are checked against verl's own metrics and hand-made examples.
"""

from __future__ import annotations

import pytest
import torch

import estimators as E
from estimators import native
from estimators.losses import AGGS, LOSSES, ZEROING, TokenState
from tests.estimators.paths import GAE_PATHS, gae_path

pytestmark = pytest.mark.verl
F64 = torch.float64
ROLLOUTS = [
    (None, 2.0),
    ("token", 2.0),  # TIS
    ("sequence", 2.0),  # sequence-level TIS
    ("token", "0.5_2.0"),  # IcePop
    ("sequence", "0.2_5.0"),
]


@pytest.fixture(scope="session")
def verl():
    core = pytest.importorskip("verl.trainer.ppo.core_algos")
    rch = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")
    from verl.workers.config import ActorConfig, PolicyLossConfig

    return core, rch, ActorConfig, PolicyLossConfig


def make_batch(seed: int, B: int = 14, T: int = 40):
    """(advantages, log_prob, old_log_prob, rollout_log_prob, mask float64)."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        L = int(torch.randint(3, T, (1,), generator=g))
        mask[b, :L] = 1
        for _ in range(2):  # tool spans
            s = int(torch.randint(1, L, (1,), generator=g))
            mask[b, s : s + int(torch.randint(1, 4, (1,), generator=g))] = 0
    mask[3] = 0  # a fully masked row
    adv = torch.randn(B, T, generator=g, dtype=F64)
    adv[0] = 0.8  # outcome-style rows: one advantage per row
    adv[1] = -1.3
    adv[2, ::5] = 0.0  # exact zeros
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    lp = old + torch.randn(B, T, generator=g, dtype=F64) * 0.45  # clipping and dual clipping bite
    lp[4, 1], lp[5, 2] = old[4, 1] + 25.0, old[5, 2] - 25.0  # past verl's +-20 clamp
    rollout = old + torch.randn(B, T, generator=g, dtype=F64) * 0.5  # TIS and IcePop bite
    off = mask == 0  # finite garbage off-mask
    adv = torch.where(off, 7.0, adv)
    lp = torch.where(off, -40.0, lp)
    return adv, lp, old, rollout, mask


def verl_weights(verl, adv, lp, old, mask, loss, agg, rollout_is, threshold, rollout, lsf=None, **kw):
    core, rch, ActorConfig, PolicyLossConfig = verl
    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=agg,
        loss_scale_factor=lsf,
        policy_loss=PolicyLossConfig(loss_mode=loss),
        **kw,
    )
    config.global_batch_info.update(
        dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=lsf
    )
    rw = None
    if rollout_is is not None:
        rw, _ = rch.compute_rollout_correction_weights(
            old - rollout, mask, rollout_is=rollout_is, rollout_is_threshold=threshold
        )
    x = lp.clone().requires_grad_(True)
    value, metrics = core.get_policy_loss_fn(loss)(old, x, adv, mask, agg, config, rw)
    value.backward()
    return -x.grad, metrics


def close(ours, theirs):
    torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rollout_is,threshold", ROLLOUTS)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("loss", [x for x in LOSSES if x != "clip_cov"])
def test_against_verl_autograd(verl, loss, agg, rollout_is, threshold):
    for seed in (0, 1):
        adv, lp, old, rollout, mask = make_batch(seed)
        theirs, _ = verl_weights(verl, adv, lp, old, mask, loss, agg, rollout_is, threshold, rollout)
        ours = E.loss_weights(
            adv, lp, old, mask, loss=loss, agg=agg, rollout_log_prob=rollout, rollout_is=rollout_is,
            rollout_is_threshold=threshold,
        )  # fmt: skip
        assert ours.dtype == F64
        close(ours, theirs)
        assert ours[mask == 0].abs().max() == 0
        assert ours[3].abs().max() == 0  # the fully masked row
        if loss not in ("gpg", "kl_cov"):  # clipping bites somewhere in the batch
            states = E.loss_token_states(
                adv, lp, old, mask, loss=loss, agg=agg, rollout_log_prob=rollout, rollout_is=rollout_is,
                rollout_is_threshold=threshold,
            )  # fmt: skip
            assert (states & (TokenState.CLIPPED_HIGH | TokenState.CLIPPED_LOW)).any() or loss == "sapo"


@pytest.mark.parametrize(
    "kw",
    [
        dict(clip_ratio=0.2, clip_ratio_low=0.1, clip_ratio_high=0.28, clip_ratio_c=2.0),
        dict(clip_ratio=0.3, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=10.0),
        dict(tau_pos=2.0, tau_neg=0.5),
    ],
)
@pytest.mark.parametrize("loss", ["vanilla", "gspo", "cispo", "geo_mean", "sapo"])
def test_settings(verl, loss, kw):
    adv, lp, old, rollout, mask = make_batch(2)
    theirs, _ = verl_weights(verl, adv, lp, old, mask, loss, "token-mean", "token", 2.0, rollout, **kw)
    ours = E.loss_weights(adv, lp, old, mask, loss=loss, rollout_log_prob=rollout, rollout_is="token", **kw)
    close(ours, theirs)


@pytest.mark.parametrize("lsf", [None, 64, 4096])
def test_loss_scale_factor(verl, lsf):
    adv, lp, old, rollout, mask = make_batch(3)
    agg = "seq-mean-token-sum-norm"
    theirs, _ = verl_weights(verl, adv, lp, old, mask, "vanilla", agg, None, 2.0, rollout, lsf=lsf)
    close(E.loss_weights(adv, lp, old, mask, agg=agg, loss_scale_factor=lsf), theirs)


@pytest.mark.parametrize("mask_dtype", [torch.int64, torch.bool, torch.float32])
def test_mask_dtypes(verl, mask_dtype):
    adv, lp, old, rollout, mask = make_batch(4)
    theirs, _ = verl_weights(
        verl, adv, lp, old, mask, "vanilla", "seq-mean-token-mean", "token", 2.0, rollout
    )
    m = mask.to(mask_dtype)
    ours = E.loss_weights(
        adv, lp, old, m, agg="seq-mean-token-mean", rollout_log_prob=rollout, rollout_is="token"
    )
    close(ours, theirs)


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("rollout_is,threshold", ROLLOUTS[:4])
def test_clip_cov(verl, agg, rollout_is, threshold):
    """verl zeroes k = max(1, int(0.0002 N)) of n > k candidates at random: every verl draw zeroes
    exactly k of our candidates and leaves every other token at our unclipped weight; ours is the
    expectation (1 - k / n) times that."""
    kwargs = dict(rollout_is=rollout_is, rollout_is_threshold=threshold)
    for seed in (0, 1, 5):
        adv, lp, old, rollout, mask = make_batch(seed)
        ours, states = E.loss_weights_and_states(
            adv, lp, old, mask, loss="clip_cov", agg=agg, rollout_log_prob=rollout, **kwargs
        )
        cand = (states & TokenState.COV_SELECTED) != 0
        n, k = int(cand.sum()), max(int(0.0002 * mask.sum().item()), 1)
        assert n > k  # the random case (the deterministic one is the next test)
        torch.manual_seed(seed)
        theirs, _ = verl_weights(verl, adv, lp, old, mask, "clip_cov", agg, rollout_is, threshold, rollout)
        close(ours[~cand], theirs[~cand])
        unclipped = ours[cand] / (1 - k / n)
        zeroed = (theirs[cand] == 0) & (unclipped != 0)
        assert int(zeroed.sum()) == k
        close(theirs[cand][~zeroed], unclipped[~zeroed])


def test_clip_cov_deterministic_case(verl):
    """One candidate: verl's draw has no choice; its weight is 0 in both."""
    adv, lp, old, rollout, mask = make_batch(6)
    adv = torch.where(mask != 0, adv * 0.05, adv)
    mask[7, 2] = 1
    lp_mean = lp[mask != 0].mean()
    adv[7, 2], lp[7, 2], old[7, 2] = 6.0, lp_mean + 0.4, lp_mean + 0.4  # cov ~ 2.4, ratio 1
    ours, states = E.loss_weights_and_states(adv, lp, old, mask, loss="clip_cov")
    assert int(((states & TokenState.COV_SELECTED) != 0).sum()) == 1
    assert ours[7, 2] == 0
    theirs, _ = verl_weights(verl, adv, lp, old, mask, "clip_cov", "token-mean", None, 2.0, rollout)
    close(ours, theirs)


def test_states_match_verl_metrics(verl):
    adv, lp, old, rollout, mask = make_batch(7)
    m = mask != 0
    n = m.sum().item()
    _, metrics = verl_weights(verl, adv, lp, old, mask, "vanilla", "token-mean", None, 2.0, rollout)
    s = E.loss_token_states(adv, lp, old, mask)
    clip = ((s & (TokenState.CLIPPED_HIGH | TokenState.CLIPPED_LOW)) != 0) & m
    dual = ((s & TokenState.DUAL_CLIPPED) != 0) & m
    assert clip.sum().item() / n == pytest.approx(metrics["actor/pg_clipfrac"], abs=1e-9)  # verl: N + 1e-8
    assert dual.sum().item() / n == pytest.approx(metrics["actor/pg_clipfrac_lower"], abs=1e-9)
    assert clip.any() and dual.any()
    core, rch, *_ = verl
    _, is_metrics = rch.compute_rollout_correction_weights(old - rollout, mask, "token", "0.5_2.0")
    s = E.loss_token_states(
        adv, lp, old, mask, rollout_log_prob=rollout, rollout_is="token", rollout_is_threshold="0.5_2.0"
    )
    ice = ((s & TokenState.ICEPOP_ZEROED) != 0) & m
    assert ice.sum().item() / n == pytest.approx(is_metrics["rollout_is_oob_ratio"], abs=1e-6)
    s = E.loss_token_states(adv, lp, old, mask, rollout_log_prob=rollout, rollout_is="token")
    tis = ((s & TokenState.TIS_TRUNCATED) != 0) & m
    _, is_metrics = rch.compute_rollout_correction_weights(old - rollout, mask, "token", 2.0)
    assert tis.sum().item() / n == pytest.approx(is_metrics["rollout_is_ratio_fraction_high"], abs=1e-6)


@pytest.mark.parametrize("loss", [x for x in LOSSES if x != "cispo"])
def test_zeroing_states_have_zero_weight(verl, loss):
    """Every token flagged as zeroed gets no gradient in verl's autograd either."""
    adv, lp, old, rollout, mask = make_batch(8)
    seen = 0
    for rollout_is, threshold in ROLLOUTS:
        kw = dict(rollout_log_prob=rollout, rollout_is=rollout_is, rollout_is_threshold=threshold)
        s = E.loss_token_states(adv, lp, old, mask, loss=loss, **kw)
        zeroed = (s & ZEROING) != 0
        if loss == "geo_mean":  # IcePop enters as the row's geometric mean, not per token
            zeroed = ((s & (ZEROING & ~TokenState.ICEPOP_ZEROED)) != 0) & (mask != 0)
        torch.manual_seed(0)
        theirs, _ = verl_weights(verl, adv, lp, old, mask, loss, "token-mean", rollout_is, threshold, rollout)
        seen += int(zeroed.sum())
        assert theirs[zeroed].abs().sum() == 0
    assert seen > 0


def test_states_by_hand():
    """One row, clip 0.2 (ratio window [0.8, 1.2]), dual clip 3, token TIS at 2; ratios
    e^d: 1.0, 1.5, 1.5, 0.5, 0.5, 4.0 and rollout ratios e^(old - rollout): 1, 1, 3, 1, 1, 1."""
    import math

    r = torch.tensor([[1.0, 1.5, 1.5, 0.5, 0.5, 4.0]], dtype=F64)
    adv = torch.tensor([[1.0, 1.0, -1.0, 1.0, -1.0, -1.0]], dtype=F64)
    old = torch.full_like(r, -1.0)
    lp = old + torch.log(r)
    rollout = old - torch.tensor([[0.0, 0.0, math.log(3.0), 0.0, 0.0, 0.0]], dtype=F64)
    mask = torch.ones_like(r)
    w, s = E.loss_weights_and_states(adv, lp, old, mask, rollout_log_prob=rollout, rollout_is="token")
    S = TokenState
    assert s.tolist() == [[0, S.CLIPPED_HIGH, S.TIS_TRUNCATED, 0, S.CLIPPED_LOW, S.DUAL_CLIPPED]]
    # token-mean over 6 tokens: w = A * r * rho / 6; token 2 is unclipped (A < 0, r in (1.2, 3]).
    expected = [[1.0 / 6, 0.0, -1.5 * 2.0 / 6, 0.5 / 6, 0.0, 0.0]]
    torch.testing.assert_close(w, torch.tensor(expected, dtype=F64), rtol=0, atol=1e-15)
    # CISPO truncates the ratio instead: 1, 1.2, -1.2 * 2 (TIS), 0.8, -0.8, -1.2.
    w, s = E.loss_weights_and_states(
        adv, lp, old, mask, loss="cispo", rollout_log_prob=rollout, rollout_is="token"
    )
    torch.testing.assert_close(w * 6, torch.tensor([[1.0, 1.2, -2.4, 0.8, -0.8, -1.2]], dtype=F64))
    assert s.tolist() == [
        [0, S.CLIPPED_HIGH, S.CLIPPED_HIGH | S.TIS_TRUNCATED, S.CLIPPED_LOW, S.CLIPPED_LOW, S.CLIPPED_HIGH]
    ]


def test_length_bias_by_hand():
    """seq-mean-token-mean: a token of a 2-token answer weighs 1/(2 * 2 rows), one of a 4-token
    answer 1/(4 * 2); token-mean gives both 1/6; seq-mean-token-sum gives both 1/2."""
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]], dtype=F64)
    adv = torch.ones(2, 4, dtype=F64)
    lp = torch.zeros(2, 4, dtype=F64)
    w = E.loss_weights(adv, lp, lp, mask, agg="seq-mean-token-mean")
    torch.testing.assert_close(w, torch.tensor([[0.25, 0.25, 0, 0], [0.125] * 4], dtype=F64))
    torch.testing.assert_close(E.loss_weights(adv, lp, lp, mask), mask / 6)
    torch.testing.assert_close(E.loss_weights(adv, lp, lp, mask, agg="seq-mean-token-sum"), mask / 2)
    torch.testing.assert_close(E.loss_weights(adv, lp, lp, mask, agg="seq-mean-token-sum-norm"), mask / 8)


def test_empty_batch_and_errors():
    z = torch.zeros(2, 3, dtype=F64)
    for agg in AGGS:
        assert E.loss_weights(z + 1, z, z, z, agg=agg).abs().max() == 0
    with pytest.raises(ValueError, match="unknown loss"):
        E.loss_weights(z, z, z, z, loss="ppo")
    with pytest.raises(ValueError, match="unknown agg"):
        E.loss_weights(z, z, z, z, agg="mean")
    with pytest.raises(ValueError, match="needs rollout_log_prob"):
        E.loss_weights(z, z, z, z, rollout_is="token")
    with pytest.raises(ValueError, match="lo <= hi"):
        E.loss_weights(z, z, z, z, rollout_log_prob=z, rollout_is="token", rollout_is_threshold="3_2")
    with pytest.raises(ValueError, match="shape"):
        E.loss_weights(z, z[:1], z, z)


def test_no_autograd_and_dtype():
    adv, lp, old, rollout, mask = make_batch(9)
    x = lp.clone().requires_grad_(True)
    w = E.loss_weights(adv, x, old, mask)
    assert not w.requires_grad and w.dtype == F64
    w32 = E.loss_weights(adv.float(), lp.float(), old.float(), mask)
    assert w32.dtype == torch.float32
    torch.testing.assert_close(w32.double(), w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("path", GAE_PATHS)
@pytest.mark.parametrize("loss", ["vanilla", "gpg", "cispo"])
@pytest.mark.parametrize("rollout_is,threshold", ROLLOUTS)
def test_kernel_equals_torch_path(loss, rollout_is, threshold, path):
    """The compiled kernel (when built) and the torch path give the same weights and states."""
    if path == "native":
        assert native.loss_kernel() is not None, "the loss kernel is not built (make install)"
    adv, lp, old, rollout, mask = make_batch(10, B=40, T=300)
    kw = dict(loss=loss, rollout_log_prob=rollout, rollout_is=rollout_is, rollout_is_threshold=threshold)
    for agg in AGGS:
        with gae_path(path):
            w, s = E.loss_weights_and_states(adv, lp, old, mask, agg=agg, **kw)
        with gae_path("torch"):
            w0, s0 = E.loss_weights_and_states(adv, lp, old, mask, agg=agg, **kw)
        torch.testing.assert_close(w, w0, rtol=1e-13, atol=1e-18)
        assert torch.equal(s, s0)
