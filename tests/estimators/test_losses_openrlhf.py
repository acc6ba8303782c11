"""``estimators.loss_weights(loss="openrlhf:<policy_loss_type>")`` against OpenRLHF 0.11.2's own
``PolicyLoss`` (``openrlhf/models/loss.py``), built as ``ppo_actor.py`` builds it from the
command line's ``--actor.*`` and ``--algo.advantage.is_correction_*``: ``-d loss / d log_probs``
by autograd equals our closed form to 1e-12 in float64 on batches with tool spans, right padding
and a fully masked row, for each aggregation, clip setting and train/rollout correction."""

from __future__ import annotations

import pytest
import torch

import estimators as E
from estimators.losses import TokenState
from tests.estimators.loss_refs import F64, autograd_weights, make_batch, openrlhf_loss

CORRECTIONS = [  # (level, mode, gating, threshold)
    ("off", "mask", "ratio", (0.5, 5.0)),
    ("token", "mask", "ratio", (0.5, 1.5)),  # IcePop
    ("token", "clip", "ratio", (0.5, 1.5)),  # TIS
    ("seq", "mask", "ratio", (0.9, 1.1)),  # seq-mask-TIS
    ("token", "mask", "binary_kl", (0.0, 0.05)),
    ("seq", "mask", "tv", (0.0, 0.1)),
]


def theirs(adv, lp, old, rollout, mask, loss_type, agg, correction, **clip):
    level, mode, gating, threshold = correction
    lo_hi = clip.get("eps_clip_low_high") or (clip.get("eps_clip", 0.2),) * 2
    fn = openrlhf_loss().PolicyLoss(
        clip_eps_low=lo_hi[0],
        clip_eps_high=lo_hi[1],
        dual_clip=clip.get("dual_clip"),
        token_level_loss=agg == "token-mean",  # as ppo_actor.py: loss_agg_mode == "token-mean"
        policy_loss_type=loss_type,
        is_correction_level=level,
        is_correction_mode=mode,
        is_correction_gating=gating,
        is_correction_threshold=list(threshold),
    )
    return autograd_weights(lambda x: fn(x, old, adv, action_mask=mask, rollout_log_probs=rollout)[0], lp)


def ours(adv, lp, old, rollout, mask, loss_type, agg, correction, **clip):
    level, mode, gating, threshold = correction
    params = {"is_correction_level": level, **clip}
    if loss_type == "ppo":
        params.update(
            loss_agg_mode=agg, is_correction_mode=mode, is_correction_gating=gating,
            is_correction_threshold=threshold,
        )  # fmt: skip
    return E.loss_weights_and_states(
        adv, lp, old, mask, loss=f"openrlhf:{loss_type}", rollout_log_prob=rollout, **params
    )


@pytest.mark.parametrize("correction", CORRECTIONS, ids=lambda c: "-".join(map(str, c[:3])))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_ppo_against_openrlhf(agg, correction):
    for seed in (0, 1):
        adv, lp, old, rollout, mask = make_batch(seed)
        want = theirs(adv, lp, old, rollout, mask, "ppo", agg, correction)
        w, states = ours(adv, lp, old, rollout, mask, "ppo", agg, correction)
        torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)
        assert w[mask == 0].abs().max() == 0 and want.abs().max() > 0
        clipped = (states & (TokenState.CLIPPED_HIGH | TokenState.CLIPPED_LOW)) != 0
        assert clipped.any() and want[clipped].abs().max() == 0
        if correction[1] == "mask" and correction[0] != "off":
            dropped = (states & TokenState.ICEPOP_ZEROED) != 0
            assert dropped.any() and want[dropped].abs().max() == 0


@pytest.mark.parametrize(
    "clip",
    [
        {"eps_clip": 0.1},
        {"eps_clip_low_high": (0.2, 0.28)},  # clip-higher
        {"dual_clip": 1.5},
        {"eps_clip_low_high": (0.1, 0.3), "dual_clip": 2.0},
    ],
)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_ppo_clip_settings(agg, clip):
    adv, lp, old, rollout, mask = make_batch(2)
    lp = lp + torch.where(torch.arange(lp.shape[1]) % 7 == 0, 0.9, 0.0)  # ratios past the dual clip
    lp[5, 1] = old[5, 1] + 25.0  # past the +-20 clamp: no gradient
    correction = CORRECTIONS[0]
    want = theirs(adv, lp, old, rollout, mask, "ppo", agg, correction, **clip)
    w, states = ours(adv, lp, old, rollout, mask, "ppo", agg, correction, **clip)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)
    if "dual_clip" in clip:
        dual = (states & TokenState.DUAL_CLIPPED) != 0
        assert dual.any() and want[dual].abs().max() == 0


@pytest.mark.parametrize("clip", [{}, {"eps_clip": 0.05}, {"dual_clip": 1.2}])
@pytest.mark.parametrize("level", ["off", "token"])
def test_gspo_against_openrlhf(level, clip):
    """GSPO: one ratio per row (against the rollout when the correction is on), seq-mean-token-mean."""
    for seed in (3, 4):
        adv, lp, old, rollout, mask = make_batch(seed)
        lp = old + 0.3 * (lp - old)  # row ratios around the clip window
        correction = (level, "mask", "ratio", (0.5, 5.0))
        want = theirs(adv, lp, old, rollout, mask, "gspo", "token-mean", correction, **clip)
        w, _ = ours(adv, lp, old, rollout, mask, "gspo", "token-mean", correction, **clip)
        torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)
        assert want.abs().max() > 0


def test_by_hand():
    """One row, A = (1, -1), ratios (1.5, 1.0), clip 0.2: token-mean w = (0 (clipped), -1 / 2)."""
    old = torch.tensor([[-1.0, -1.0]], dtype=F64)
    lp = old + torch.log(torch.tensor([[1.5, 1.0]], dtype=F64))
    adv = torch.tensor([[1.0, -1.0]], dtype=F64)
    w = E.loss_weights(adv, lp, old, torch.ones_like(adv), loss="openrlhf:ppo")
    torch.testing.assert_close(w, torch.tensor([[0.0, -0.5]], dtype=F64))


def test_errors_name_what_is_known():
    z = torch.zeros(1, 3, dtype=F64)
    with pytest.raises(TypeError, match="takes no parameter.*loss_agg_mode"):
        E.loss_weights(z, z, z, z + 1, loss="openrlhf:gspo", loss_agg_mode="token-mean")
    with pytest.raises(ValueError, match="needs rollout_log_prob"):
        E.loss_weights(z, z, z, z + 1, loss="openrlhf:ppo", is_correction_level="token")
    with pytest.raises(ValueError, match="unknown loss_agg_mode"):
        E.loss_weights(z, z, z, z + 1, loss="openrlhf:ppo", loss_agg_mode="token-sum")
