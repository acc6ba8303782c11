"""The loss registry itself (estimators/losses/registry.py): every registered loss answers the same
call shape with 0 off the mask, zeros for an empty batch, the input's dtype, no NaN from a fully
masked row; each parameter's text reads back to its value; names, aliases, trainers and versions;
the errors list what is known. The numbers of each loss are checked against its trainer's code in
test_loss_weights.py (verl) and test_losses_{trl,openrlhf,skyrl}.py."""

from __future__ import annotations

import pytest
import torch

import estimators as E
from estimators.losses import BatchShape, LossParam, available_losses, get_loss, register_loss
from estimators.registry import TRAINERS
from tests.estimators.loss_refs import make_batch

F64 = torch.float64
ALL = list(available_losses())


def _groups(B: int) -> torch.Tensor:
    return torch.arange(B) // 3


@pytest.mark.parametrize("name", ALL)
def test_every_loss_answers_the_same_shape(name):
    adv, lp, old, rollout, mask = make_batch(11)
    B, T = adv.shape
    batch = BatchShape(mask.sum(-1), T, groups=_groups(B))
    w, s = E.loss_weights_and_states(adv, lp, old, mask, loss=name, rollout_log_prob=rollout, batch=batch)
    assert w.shape == s.shape == (B, T) and w.dtype == F64 and s.dtype == torch.uint8
    assert torch.isfinite(w).all()
    assert w[mask == 0].abs().max() == 0 and s[mask == 0].max() == 0
    assert w[3].abs().max() == 0  # the fully masked row
    # float32 in, float32 out, the same numbers to float32's precision
    w32 = E.loss_weights(
        adv.float(), lp.float(), old.float(), mask, loss=name, rollout_log_prob=rollout.float(), batch=batch
    )
    assert w32.dtype == torch.float32
    if not name.endswith(("clip_cov", "kl_cov")):  # their selections may differ at float32's ties
        torch.testing.assert_close(w32.double(), w, rtol=2e-4, atol=1e-6)
    # an empty batch (no loss token anywhere) gives zeros, not NaN
    z = torch.zeros_like(mask)
    e = E.loss_weights(
        adv, lp, old, z, loss=name, rollout_log_prob=rollout, batch=BatchShape(z.sum(-1), T, _groups(B))
    )
    assert e.abs().max() == 0


@pytest.mark.parametrize("name", ALL)
def test_the_rows_of_a_batch_alone_with_its_shape(name):
    """One row computed alone with the batch's shape (BatchShape rows) is that row of the whole
    batch: what the episode page's row and the batch view rely on (not for the losses whose
    selection is batch-wide: clip_cov, kl_cov)."""
    if name.endswith(("clip_cov", "kl_cov")):
        pytest.skip("batch-wide selection")
    adv, lp, old, rollout, mask = make_batch(12)
    B, T = adv.shape
    whole = E.loss_weights(
        adv, lp, old, mask, loss=name, rollout_log_prob=rollout, batch=BatchShape(mask.sum(-1), T, _groups(B))
    )
    for i in (0, 5, B - 1):
        shape = BatchShape(mask.sum(-1), T, groups=_groups(B), rows=torch.tensor([i]))
        one = E.loss_weights(
            adv[i : i + 1], lp[i : i + 1], old[i : i + 1], mask[i : i + 1], loss=name,
            rollout_log_prob=rollout[i : i + 1], batch=shape,
        )  # fmt: skip
        torch.testing.assert_close(one[0], whole[i], rtol=1e-12, atol=1e-15)


def test_names_trainers_and_aliases():
    specs = available_losses()
    verl = ["vanilla", "gspo", "cispo", "geo_mean", "gpg", "sapo", "clip_cov", "kl_cov"]
    assert list(available_losses(aliases=False))[:8] == verl
    for name, spec in specs.items():
        assert spec.trainer in TRAINERS and spec.version == TRAINERS[spec.trainer][1]
        assert name.startswith(f"{spec.trainer}:") or (spec.trainer == "verl" and ":" not in name)
    assert get_loss("verl:gspo").alias_of == "gspo" and get_loss("verl:gspo").fn is get_loss("gspo").fn
    assert "verl:gspo" not in available_losses(aliases=False)
    assert {n.split(":")[0] for n in specs if ":" in n} == {"verl", "trl", "openrlhf", "skyrl"}


@pytest.mark.parametrize("name", ALL)
def test_parameter_texts_read_back(name):
    for p in get_loss(name).params.values():
        assert p.parse(p.text(p.default)) == p.check(p.default), (name, p.name)


def test_errors_list_what_is_known():
    z = torch.zeros(1, 2, dtype=F64)
    with pytest.raises(ValueError, match="unknown loss 'nope'; one of vanilla, .*trl:dapo"):
        E.loss_weights(z, z, z, z + 1, loss="nope")
    with pytest.raises(TypeError, match=r"takes no parameter\(s\) \['loss_reduction'\]; it takes agg, "):
        E.loss_weights(z, z, z, z + 1, loss="vanilla", loss_reduction="token_mean")
    with pytest.raises(ValueError, match="0 <= lo <= hi"):
        E.loss_weights(z, z, z, z + 1, rollout_log_prob=z, loss="openrlhf:ppo", is_correction_level="token",
                       is_correction_threshold="3_1")  # fmt: skip
    with pytest.raises(ValueError, match="only verl's losses have plain names"):
        register_loss("mine", label="", description="", params=(), trainer="trl", version="1")
    with pytest.raises(ValueError, match="named 'trl:<name>'"):
        register_loss("verl:x", label="", description="", params=(), trainer="trl", version="1")
    with pytest.raises(ValueError, match="unknown trainer"):
        register_loss("x:y", label="", description="", params=(), trainer="x", version="1")
    with pytest.raises(ValueError, match="unknown p"):
        register_loss(
            "trl:bad", label="", description="", trainer="trl", version="1",
            params=(LossParam("p", "c", "choice", "", ("a", "b")),),
        )  # fmt: skip
    assert "trl:bad" not in available_losses()
