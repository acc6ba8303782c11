"""``estimators.loss_weights(loss="skyrl:<policy_loss_type>")`` against SkyRL 0.3.0's own
``ppo_utils`` (``PolicyLossRegistry``'s functions and ``apply_loss_reduction_to_advantages_minibatch``,
called as its trainer calls them: the advantages reduced first, then the loss summed over the loss
mask): ``-d loss / d log_probs`` by autograd equals our closed form on batches with tool spans,
right padding and a fully masked row, for every loss, every ``loss_reduction`` and the off-policy
corrections. To 1e-12 in float64, except where SkyRL computes the ratio in float32
(``safe_exp_delta``: ``regular``, ``dual_clip``, ``cispo``, ``rollout_is``, ``dppo``), where the
gradient carries float32's rounding (1e-6 relative)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import estimators as E
from estimators.losses import BatchShape, TokenState
from tests.estimators.loss_refs import F64, autograd_weights, make_batch, skyrl_ppo_utils

LOSSES = (
    "regular", "dual_clip", "gspo", "cispo", "rollout_is", "clip_cov", "kl_cov", "sapo", "cross_entropy",
    "importance_sampling", "dppo",
)  # fmt: skip
FLOAT32_RATIO = {"regular", "dual_clip", "cispo", "rollout_is", "dppo"}
REDUCTIONS = ("token_mean", "token_mean_legacy", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean")
GROUP = 3  # rows per prompt (contiguous, as SkyRL's prompt_boundaries)
CORRECTION_DEFAULTS = dict(
    tis_ratio_type=None, token_tis_ratio_clip_high=2.0, sequence_tis_ratio_clip_high=5.0,
    sequence_mask_metric=None, geo_mask_high=1.01, geo_mask_low=0.99, product_mask_high=2.0,
    product_mask_low=0.5, outlier_token_is_threshold_low=None, outlier_token_is_threshold_high=None,
    token_mask_is_threshold_low=None, token_mask_is_threshold_high=None,
)  # fmt: skip


def config(loss: str, reduction: str, **kw):
    """SkyRL's AlgorithmConfig fields the loss functions read, at SkyRL's defaults (the config
    module itself is stood in: it imports skyrl_gym)."""
    correction = {k: kw.pop(k) for k in list(kw) if k in CORRECTION_DEFAULTS}
    return SimpleNamespace(
        policy_loss_type=loss,
        loss_reduction=reduction,
        eps_clip_low=kw.get("eps_clip_low", 0.2),
        eps_clip_high=kw.get("eps_clip_high", 0.2),
        clip_ratio_c=kw.get("clip_ratio_c", 3.0),
        sapo=SimpleNamespace(tau_pos=kw.get("tau_pos", 1.0), tau_neg=kw.get("tau_neg", 1.05)),
        cispo=SimpleNamespace(
            cispo_eps_clip_low=kw.get("cispo_eps_clip_low", 0.0), cispo_eps_clip_high=kw.get("cispo_eps_clip_high", 5.0)
        ),
        clip_cov=SimpleNamespace(
            clip_ratio=kw.get("clip_ratio", 0.0002), clip_cov_lb=kw.get("clip_cov_lb", 1.0),
            clip_cov_ub=kw.get("clip_cov_ub", 5.0),
        ),
        kl_cov=SimpleNamespace(kl_cov_frac=kw.get("kl_cov_frac", 0.2), ppo_kl_coef=kw.get("ppo_kl_coef", 1.0)),
        dppo=SimpleNamespace(
            dppo_type=kw.get("dppo_type", "binary_tv"), delta_low=kw.get("delta_low", 0.2),
            delta_high=kw.get("delta_high", 0.2),
        ),
        off_policy_correction=SimpleNamespace(**{**CORRECTION_DEFAULTS, **correction}),
    )  # fmt: skip


def theirs(adv, lp, old, rollout, mask, loss, reduction, mbs=2, max_seq_len=None, **kw):
    pu = skyrl_ppo_utils()
    B, T = adv.shape
    prompts = [(s, s + GROUP) for s in range(0, B, GROUP)]
    reduced = pu.apply_loss_reduction_to_advantages_minibatch(
        adv, mask, reduction, mbs, max_seq_len if max_seq_len is not None else T, prompts
    )
    fn = pu.PolicyLossRegistry.get(loss)
    cfg = config(loss, reduction, **kw)
    return autograd_weights(
        lambda x: fn(x, old, reduced, cfg, loss_mask=mask, rollout_logprobs=rollout)[0], lp
    )


def ours(adv, lp, old, rollout, mask, loss, reduction, mbs=2, **kw):
    B, T = adv.shape
    batch = BatchShape(mask.sum(-1), T, groups=torch.arange(B) // GROUP)
    params = {k: ("none" if v is None else v) for k, v in kw.items()}
    return E.loss_weights_and_states(
        adv, lp, old, mask, loss=f"skyrl:{loss}", rollout_log_prob=rollout, batch=batch,
        loss_reduction=reduction, micro_train_batch_size_per_gpu=mbs, **params,
    )  # fmt: skip


def close(loss, ours_w, theirs_w):
    tol = 1e-6 if loss in FLOAT32_RATIO else 1e-12
    torch.testing.assert_close(ours_w, theirs_w, rtol=tol, atol=tol * 1e-2)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("loss", LOSSES)
def test_against_skyrl(loss, reduction):
    for seed in (0, 1):
        adv, lp, old, rollout, mask = make_batch(seed)
        if loss == "clip_cov":  # zero no candidate at random: SkyRL draws them, ours is the expectation
            kw = {"clip_cov_lb": 1e6}
        else:
            kw = {}
        want = theirs(adv, lp, old, rollout, mask, loss, reduction, **kw)
        w, states = ours(adv, lp, old, rollout, mask, loss, reduction, **kw)
        close(loss, w, want)
        assert w[mask == 0].abs().max() == 0 and want.abs().max() > 0
        if loss in ("regular", "dual_clip"):
            clipped = (states & (TokenState.CLIPPED_HIGH | TokenState.CLIPPED_LOW)) != 0
            assert clipped.any() and want[clipped].abs().max() == 0


@pytest.mark.parametrize(
    "correction",
    [
        {"tis_ratio_type": "token"},
        {"tis_ratio_type": "sequence", "sequence_tis_ratio_clip_high": 1.5},
        {"sequence_mask_metric": "geometric", "geo_mask_low": 0.9, "geo_mask_high": 1.1},
        {"sequence_mask_metric": "product", "tis_ratio_type": "token"},
        {
            "token_mask_is_threshold_low": 0.6,
            "token_mask_is_threshold_high": 1.6,
            "tis_ratio_type": "sequence",
        },
    ],
)
@pytest.mark.parametrize("loss", ["regular", "dual_clip", "gspo", "cispo", "rollout_is", "sapo", "dppo"])
def test_off_policy_correction(loss, correction):
    adv, lp, old, rollout, mask = make_batch(2)
    want = theirs(adv, lp, old, rollout, mask, loss, "sequence_mean", **correction)
    w, states = ours(adv, lp, old, rollout, mask, loss, "sequence_mean", **correction)
    close(loss, w, want)
    dropped = (states & TokenState.ICEPOP_ZEROED) != 0
    assert want[dropped].abs().sum() == 0
    if "sequence_mask_metric" in correction or "token_mask_is_threshold_low" in correction:
        assert dropped.any()


@pytest.mark.parametrize(
    "loss,kw",
    [
        ("regular", {"eps_clip_low": 0.1, "eps_clip_high": 0.28}),
        ("dual_clip", {"clip_ratio_c": 1.5}),
        ("cispo", {"cispo_eps_clip_low": 0.2, "cispo_eps_clip_high": 0.2}),
        ("sapo", {"tau_pos": 2.0, "tau_neg": 0.5}),
        ("dppo", {"dppo_type": "binary_kl", "delta_low": 0.01, "delta_high": 0.01}),
        ("kl_cov", {"kl_cov_frac": 0.05, "ppo_kl_coef": 0.3}),
        ("clip_cov", {"clip_ratio": 0.5, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9}),  # every candidate: exact
    ],
)
def test_settings(loss, kw):
    adv, lp, old, rollout, mask = make_batch(3)
    want = theirs(adv, lp, old, rollout, mask, loss, "token_mean", **kw)
    w, states = ours(adv, lp, old, rollout, mask, loss, "token_mean", **kw)
    if loss == "clip_cov":  # k = int(0.5 N) of n candidates: SkyRL zeroes k at random, ours 1 - k / n each
        cand = (states & TokenState.COV_SELECTED) != 0
        n, k = int(cand.sum()), int(0.5 * mask.sum().item())
        assert n > k
        close(loss, w[~cand], want[~cand])
        zeroed = (want[cand] == 0) & (w[cand] != 0)
        assert int(zeroed.sum()) == k
        close(loss, want[cand][~zeroed], w[cand][~zeroed] / (1 - k / n))
    else:
        close(loss, w, want)
    if loss == "dual_clip":
        dual = (states & TokenState.DUAL_CLIPPED) != 0
        assert dual.any() and want[dual].abs().max() == 0


def test_max_seq_len_and_micro_batches():
    adv, lp, old, rollout, mask = make_batch(4)
    want = theirs(adv, lp, old, rollout, mask, "regular", "seq_mean_token_sum_norm", max_seq_len=100)
    w, _ = ours(adv, lp, old, rollout, mask, "regular", "seq_mean_token_sum_norm", max_seq_len=100)
    close("regular", w, want)
    # 12 rows in micro-batches of 5: two whole ones, the last 2 rows get nothing (SkyRL's legacy mode).
    want = theirs(adv, lp, old, rollout, mask, "regular", "token_mean_legacy", mbs=5)
    w, _ = ours(adv, lp, old, rollout, mask, "regular", "token_mean_legacy", mbs=5)
    close("regular", w, want)
    assert w[10:].abs().max() == 0 and want[10:].abs().max() == 0


def test_by_hand():
    """cross_entropy: weight 1 on every loss token whatever A and the reduction; cispo's default
    weight clip(r, 1, 6): r = 0.5 weighs 1."""
    mask = torch.tensor([[1.0, 1.0, 0.0]], dtype=F64)
    adv = torch.tensor([[2.0, -1.0, 5.0]], dtype=F64)
    old = torch.full_like(adv, -1.0)
    lp = old + torch.log(torch.tensor([[0.5, 2.0, 1.0]], dtype=F64))
    torch.testing.assert_close(E.loss_weights(adv, lp, old, mask, loss="skyrl:cross_entropy"), mask)
    w = E.loss_weights(adv, lp, old, mask, loss="skyrl:cispo")
    torch.testing.assert_close(
        w, torch.tensor([[2.0 * 1.0 / 2, -1.0 * 2.0 / 2, 0.0]], dtype=F64), rtol=1e-6, atol=0
    )
    with pytest.raises(ValueError, match="prompt_mean' needs the rows' prompt groups"):
        E.loss_weights(adv, lp, old, mask, loss="skyrl:regular", loss_reduction="prompt_mean")
    with pytest.raises(ValueError, match="needs rollout_log_prob"):
        E.loss_weights(adv, lp, old, mask, loss="skyrl:rollout_is")
