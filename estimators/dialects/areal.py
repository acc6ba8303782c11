"""AReaL 1.0.4's credit (``areal/trainer/ppo/actor.py``, ``PPOActor._compute_advantages``) on our layout.

AReaL has one advantage computation for every recipe: a scalar reward per sequence (bias, scaling,
clip, then the optional ``reward_norm``), placed on the sequence's last token; GAE over the loss
tokens with carry-forward masking (a non-loss token passes ``nextvalues`` and ``lastgaelam`` through
unchanged, so tool spans are skipped, not stepped through); then the optional ``adv_norm`` over the
loss tokens. Both normalisations are ``areal.utils.data.Normalization`` with a ``NormConfig``
(``mean_level``, ``std_level`` each ``batch | group | None``).

Quirks reproduced (docs/conventions.md, "AReaL"):

- The reward is one number per sequence: here the sum of the row's rewards at every position.
- The rewards tensor is float32 (it starts as ``-kl_ctl * KL`` of float32 log-probs), so the
  reward is rounded to float32; without a critic the values are ``zeros_like(rewards)`` and the
  whole recursion runs in float32. Both normalisations return float32.
- ``adv_norm`` works on tokens, not sequences: its means and stds are token-weighted (a long answer
  weighs more), its leave-one-out mean leaves out one token, and its ``group`` level takes every
  loss token of the group's rows. ``mean_level=None`` with a std divides by the root mean square
  (the std is taken about 0). ``std_unbiased`` with a single element gives std 1.
- A sequence with no EOS (AReaL 1.0.4: one that fills the padded width; here: a row with a finite
  ``last_value``) bootstraps from the critic's value after its last token; ``mask_no_eos_with_zero``
  drops its reward.

The reference policy's KL term is left out (``kl_ctl = 0``, as AReaL's recipes set it; we have no
reference log-probs). Groups come from ``EstimatorInput.groups`` (AReaL takes contiguous slices of
``group_size`` rows; any labels work here).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from .. import token as T
from ..groups import group_ids
from ..registry import EstimatorInput, EstimatorOutput
from ._common import Dialects

__all__ = ["normalize"]

_TRAINER = "areal"
_VERSION = "1.0.4"
_reg = Dialects(_TRAINER, _VERSION)
_LEVELS = ("batch", "group", None)
F64 = torch.float64


def _check_level(name: str, level: str | None) -> None:
    if level not in _LEVELS:
        raise ValueError(f"{name} must be 'batch', 'group' or None, got {level!r}")


def _sums(x: Tensor, inv: Tensor, G: int) -> Tensor:
    """[G] float64 sums of the rows of ``x`` ([B] or [B, T]) per group id ``inv`` [B]."""
    rows = x.reshape(x.shape[0], -1).sum(-1)
    return torch.zeros(G, dtype=F64, device=x.device).index_add_(0, inv, rows)


def normalize(
    x: Tensor,
    mask: Tensor | None,
    inv: Tensor,
    G: int,
    *,
    mean_level: str | None,
    std_level: str | None,
    mean_leave1out: bool = False,
    std_unbiased: bool = True,
    eps: float = 1e-5,
) -> Tensor:
    """AReaL's ``Normalization`` (``areal/utils/data.py``) of ``x`` ([B] scores with ``mask=None``, or
    [B, T] advantages with the loss mask), groups given as ids ``inv`` [B] in ``[0, G)``.

    Statistics in float64 over the masked elements; the result is float32 (AReaL's ``.float()``).
    A group of one row is AReaL's ``group_size == 1``: its leave-one-out mean is 0 and its
    unbiased std is 1.
    """
    _check_level("mean_level", mean_level)
    _check_level("std_level", std_level)
    m = None if mask is None else (mask != 0).to(F64)
    if x.numel() == 0 or (m is not None and not bool(m.any())):
        return x.float()  # AReaL returns early when no element is active
    x64 = x.to(F64)
    xm = x64 if m is None else x64 * m
    count = torch.ones_like(x64) if m is None else m
    shape = (-1,) + (1,) * (x.dim() - 1)
    rows_per_group = torch.zeros(G, dtype=F64, device=x.device).index_add_(
        0, inv, torch.ones(x.shape[0], dtype=F64, device=x.device)
    )
    singleton_row = (rows_per_group[inv] == 1).reshape(shape)

    def level_stats(level: str) -> tuple[Tensor, Tensor]:
        """(sum, count) of the masked elements in each element's batch or group, broadcast."""
        if level == "batch":  # 0-dim: broadcast where used, never a [B, T] copy
            return xm.sum(), count.sum()
        s = _sums(xm, inv, G)[inv].reshape(shape).expand_as(x64)
        n = _sums(count, inv, G)[inv].reshape(shape).expand_as(x64)
        return s, n

    if mean_level is None:
        mean = torch.zeros_like(x64)
    else:
        s, n = level_stats(mean_level)
        if mean_leave1out:
            # Leave out this element (a token, for [B, T] input); the plain mean off-mask.
            own = count
            loo = (s - xm) / torch.clamp(n - own, min=1.0)
            mean = torch.where(own > 0, loo, s / n) if m is not None else loo
            mean = torch.where(n <= 1, torch.zeros_like(mean), mean)
            if mean_level == "group":
                mean = torch.where(singleton_row, torch.zeros_like(mean), mean)
        else:
            mean = torch.where(n == 0, torch.zeros_like(s), s / torch.where(n == 0, 1.0, n))
    centered = x64 - mean
    if m is not None:
        centered = centered * m
    if std_level is None:
        return centered.float()  # std = 1 and eps = 0
    dev = (xm - mean * count) ** 2
    if std_level == "batch":
        ss, n = dev.sum(), count.sum()
    else:
        ss = _sums(dev, inv, G)[inv].reshape(shape).expand_as(x64)
        n = _sums(count, inv, G)[inv].reshape(shape).expand_as(x64)
    if std_unbiased:
        std = torch.where(n <= 1, torch.ones_like(ss), (ss / torch.clamp(n - 1, min=1.0)).sqrt())
        if std_level == "group":
            std = torch.where(singleton_row, torch.ones_like(std), std)
    else:
        std = torch.where(n == 0, torch.ones_like(ss), (ss / torch.where(n == 0, 1.0, n)).sqrt())
    return (centered / (std + eps)).float()


def _truncated(inp: EstimatorInput) -> Tensor:
    """[B] bool: rows AReaL treats as having no EOS (a finite ``last_value``)."""
    B = inp.mask.shape[0]
    if inp.last_value is None:
        return torch.zeros(B, dtype=torch.bool, device=inp.mask.device)
    lv = torch.as_tensor(inp.last_value, device=inp.mask.device).reshape(-1)
    return torch.isfinite(lv)


def _advantages(
    inp: EstimatorInput,
    values: Tensor | None,
    *,
    mean_level: str | None,
    std_level: str | None,
    mean_leave1out: bool,
    std_unbiased: bool,
    eps: float,
    adv_norm: str | None,
    reward_scaling: float,
    reward_bias: float,
    reward_clip: float,
    mask_no_eos_with_zero: bool,
) -> EstimatorOutput:
    _check_level("adv_norm", adv_norm)
    m = inp.mask != 0
    B = m.shape[0]
    out_dtype = inp.rewards.dtype if inp.rewards.is_floating_point() else torch.get_default_dtype()
    inv, G = group_ids(inp.groups, B, m.device)
    score = inp.rewards.to(out_dtype).sum(-1)
    score = torch.clip((score + reward_bias) * reward_scaling, max=reward_clip, min=-reward_clip)
    if mean_level is not None or std_level is not None:
        score = normalize(
            score,
            None,
            inv,
            G,
            mean_level=mean_level,
            std_level=std_level,
            mean_leave1out=mean_leave1out,
            std_unbiased=std_unbiased,
            eps=eps,
        )
    no_eos = _truncated(inp)
    if mask_no_eos_with_zero:
        score = torch.where(no_eos, torch.zeros_like(score), score)
    score32 = score.to(torch.float32)  # added into AReaL's float32 rewards tensor
    # Without a critic AReaL's values are zeros_like(rewards): the recursion runs in float32.
    dtype = torch.float32 if values is None else torch.promote_types(torch.float32, values.dtype)
    v = torch.zeros(m.shape, dtype=dtype, device=m.device) if values is None else values.to(dtype)
    rewards = T.outcome_rewards(m, score32.to(dtype))
    last_value = None
    if values is not None and bool(no_eos.any()):
        lv = torch.as_tensor(inp.last_value, device=m.device).reshape(-1).to(dtype)
        last_value = torch.where(no_eos, lv, torch.full_like(lv, math.nan))
    adv, targets = T.gae(rewards, v, m, float(inp.gamma), float(inp.lam), last_value)
    if adv_norm is not None:
        adv = normalize(adv, m, inv, G, mean_level=adv_norm, std_level=adv_norm)
    adv = torch.where(m, adv.to(out_dtype), 0)
    extras: dict[str, Any] = {"episode_rewards": score32.to(out_dtype), "no_eos": no_eos}
    return EstimatorOutput(advantages=adv, value_targets=targets.to(out_dtype), extras=extras)


_COMMON: dict[str, Any] = {
    "mean_leave1out": False,
    "std_unbiased": True,
    "eps": 1e-5,
    "reward_scaling": 1.0,
    "reward_bias": 0.0,
    "reward_clip": 20.0,
    "mask_no_eos_with_zero": False,
}


@_reg(
    "grpo",
    label="GRPO",
    description=(
        "AReaL's PPOActor without a critic: the row's reward, group-normalised (reward_norm: "
        "mean_level, std_level, eps 1e-5), broadcast by a float32 GAE over the loss tokens (tool "
        "spans skipped), then adv_norm over tokens (token-weighted, 'batch' as in AReaL's GRPO recipe)."
    ),
    kind="token",
    reads=("rewards", "groups"),
    may_read=("last_value",),
    params={"mean_level": "group", "std_level": "group", "adv_norm": "batch", **_COMMON},
    reference="grpo",
)
def _grpo(
    inp: EstimatorInput,
    mean_level: str | None = "group",
    std_level: str | None = "group",
    adv_norm: str | None = "batch",
    **kw: Any,
) -> EstimatorOutput:
    return _advantages(
        inp, None, mean_level=mean_level, std_level=std_level, adv_norm=adv_norm, **{**_COMMON, **kw}
    )


@_reg(
    "gae",
    label="PPO GAE",
    description=(
        "AReaL's PPOActor with a critic: the row's reward (float32) on its last policy token, GAE with "
        "carry-forward masking (tool spans skipped, values read on policy tokens only), bootstrap from "
        "last_value for rows with no EOS; reward_norm / adv_norm off by default (AReaL's defaults)."
    ),
    kind="token",
    reads=("rewards", "values"),
    may_read=("groups", "last_value"),
    params={"mean_level": None, "std_level": None, "adv_norm": None, **_COMMON},
    reference="token_gae",
)
def _gae(
    inp: EstimatorInput,
    mean_level: str | None = None,
    std_level: str | None = None,
    adv_norm: str | None = None,
    **kw: Any,
) -> EstimatorOutput:
    if inp.values is None:
        raise ValueError("areal:gae needs values (a critic)")
    return _advantages(
        inp, inp.values, mean_level=mean_level, std_level=std_level, adv_norm=adv_norm, **{**_COMMON, **kw}
    )
