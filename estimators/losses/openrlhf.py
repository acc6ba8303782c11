"""OpenRLHF 0.11.2's policy losses (``openrlhf/models/loss.py``, ``PolicyLoss``, as
``openrlhf/trainer/ray/ppo_actor.py`` builds it from the command line) as
``openrlhf:<--actor.policy_loss_type>``: ``ppo`` (the default) and ``gspo``.

``ppo``: with ``d = log_prob - old_log_prob`` clamped to +-20 and ``r = exp(d)``, the token loss is
``-min(r A, clip(r, 1 - lo, 1 + hi) A)`` (``eps_clip_low_high`` = (lo, hi), default ``(eps_clip,
eps_clip)``); with ``dual_clip`` set, ``A < 0`` tokens take ``-max(min(...), dual_clip A)``. A
tie passes half the gradient through each side, as torch does. The train/rollout correction
(``--algo.advantage.is_correction_*``) multiplies the token loss by a stop-gradient weight from
``old_log_prob - rollout_log_prob``: ``is_correction_level`` ``off`` (default), ``token`` or
``seq``; the gated statistic (``is_correction_gating``) is the ratio (at ``seq`` level
exp of the row's mean log-ratio), or the sampled token's ``binary_kl`` or ``tv`` between the two
policies (at ``seq`` the row's mean); ``is_correction_mode`` ``mask`` keeps a unit's per-token
ratio when the statistic is in ``is_correction_threshold`` = [low, high] and zeroes it otherwise
(IcePop, seq-mask-TIS), ``clip`` clamps the token ratio into [low, high] (TIS; token level and the
ratio only). The token losses are aggregated by ``loss_agg_mode``: ``token-mean`` (sum over the
batch's N loss tokens / N) or ``seq-mean-token-mean`` (each row's sum / (L_i + 1e-8), averaged over
the S rows with tokens).

``gspo``: the ratio is one per row, ``exp(mean over the row of (log_prob - old_log_prob))`` (of
``log_prob - rollout_log_prob`` when the correction is on; no clamp, and no correction weight),
on every token of the row; the same clipped surrogate; always ``seq-mean-token-mean``. Its
gradient reaches each token of row i as ``r_i / max(L_i, 1)`` times the row's summed factor.

One data-parallel rank, the whole batch as one micro-batch (``batch_num_tokens`` and
``global_batch_size`` None, as ``aggregate_loss`` then takes the batch's own counts).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .core import SAFETY_BOUND, LossInput, TokenState, flag
from .registry import LossParam, register_loss

VERSION = "0.11.2"
AGG_MODES = ("token-mean", "seq-mean-token-mean")

_CLIP = (
    LossParam("eps_clip", 0.2, "float", "PPO's clip range (--actor.eps_clip)"),
    LossParam(
        "eps_clip_low_high",
        None,
        "threshold_pair",
        "lo_hi: the clip ranges below and above 1 (None: eps_clip)",
    ),
    LossParam("dual_clip", None, "optional_float", "dual-clip bound for A < 0 (None: off)"),
)
_LEVEL = LossParam(
    "is_correction_level", "off", "choice", "train/rollout correction: off, per token, per sequence",
    ("off", "token", "seq"), True,
)  # fmt: skip
_IS = (
    LossParam(
        "is_correction_mode", "mask", "choice", "out of band: drop the unit (mask) or clamp the ratio (clip)",
        ("mask", "clip"), True,
    ),
    LossParam(
        "is_correction_gating", "ratio", "choice", "the statistic gated: the ratio, binary_kl or tv",
        ("ratio", "binary_kl", "tv"),
    ),
    LossParam(
        "is_correction_threshold", (0.5, 5.0), "threshold_pair", "lo_hi band of the statistic (hi alone: 0 to hi)",
        control=True,
    ),
)  # fmt: skip


def _clip_bounds(p: dict[str, Any]) -> tuple[float, float]:
    lo, hi = p["eps_clip_low_high"] or (p["eps_clip"], p["eps_clip"])
    if p["dual_clip"] is not None and not p["dual_clip"] > 1.0:
        raise ValueError(f"dual_clip must be > 1.0, got {p['dual_clip']}")
    return 1.0 - lo, 1.0 + hi


def _d_surrogate(a: Tensor, r: Tensor, lo: float, hi: float, dual: float | None) -> Tensor:
    """d/dr of ``min(r A, clip(r) A)`` (and of the dual clip's max), as torch passes it: clamp's
    bounds inclusive, a tie half through each side."""
    s1, s2 = r * a, r.clamp(lo, hi) * a
    g2 = torch.where((r >= lo) & (r <= hi), a, 0.0)
    mn = torch.where(s1 < s2, a, torch.where(s2 < s1, g2, (a + g2) / 2))
    if dual is None:
        return mn
    v, floor = torch.minimum(s1, s2), dual * a
    dual_g = torch.where(v > floor, mn, torch.where(v < floor, 0.0, mn / 2))
    return torch.where(a < 0, dual_g, mn)


def _states(a: Tensor, r: Tensor, mb: Tensor, lo: float, hi: float, dual: float | None) -> Tensor:
    state = flag(mb & (a > 0) & (r > hi), TokenState.CLIPPED_HIGH) | flag(
        mb & (a < 0) & (r < lo), TokenState.CLIPPED_LOW
    )
    if dual is not None:
        state = state | flag(mb & (a < 0) & (r > dual), TokenState.DUAL_CLIPPED)
    return state


def _agg(x: LossInput, counts: Tensor, mode: str) -> Tensor:
    """[B] the aggregation's per-row factor (token factor ``m_ij s_i``) over the batch."""
    batch = x.shape(counts)
    lengths = batch.lengths.to(x.dtype)
    if mode == "token-mean":
        n = lengths.sum()
        return torch.where(n > 0, 1.0 / torch.where(n > 0, n, 1.0), 0.0).expand_as(batch.take(lengths))
    s = (lengths > 0).sum().to(x.dtype)
    inv = torch.where(s > 0, 1.0 / torch.where(s > 0, s, 1.0), 0.0)
    return inv / (batch.take(lengths) + 1e-8)


def _correction(x: LossInput, m: Tensor, mb: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    """(the stop-gradient correction weight [B, T], its flags): OpenRLHF's is_correction_*."""
    low, high = p["is_correction_threshold"]
    seq = p["is_correction_level"] == "seq"
    rollout = x.rollout()
    is_log_ratio = torch.where(mb, x.old_log_prob - rollout, 0.0)
    token_is = is_log_ratio.exp()

    def row_mean(v: Tensor) -> Tensor:
        return ((v * m).sum(dim=-1) / m.sum(dim=-1))[:, None]  # 0/0 on an empty row: it has no loss

    if p["is_correction_gating"] == "ratio":
        stat = (row_mean(is_log_ratio) if seq else is_log_ratio).exp()
    else:
        pr = torch.where(mb, rollout, -1.0).exp().clamp(1e-6, 1 - 1e-6)
        q = torch.where(mb, x.old_log_prob, -1.0).exp().clamp(1e-6, 1 - 1e-6)
        if p["is_correction_gating"] == "binary_kl":
            stat = pr * (pr / q).log() + (1 - pr) * ((1 - pr) / (1 - q)).log()
        else:
            stat = (pr - q).abs()
        if seq:
            stat = row_mean(stat)
    stat = stat.expand_as(token_is)
    out = (stat < low) | (stat > high)
    if p["is_correction_mode"] == "clip":
        if seq or p["is_correction_gating"] != "ratio":
            raise ValueError("is_correction_mode=clip requires is_correction_level=token and gating=ratio")
        return stat.clamp(min=low, max=high), flag(out & mb, TokenState.TIS_TRUNCATED)
    keep = (stat >= low) & (stat <= high)
    return torch.where(keep, token_is, 0.0), flag(~keep & mb, TokenState.ICEPOP_ZEROED)


@register_loss(
    "openrlhf:ppo",
    label="OpenRLHF PPO",
    description="PPO's clipped surrogate (dual clip optional), the train/rollout correction, token or sequence mean.",
    params=(
        LossParam(
            "loss_agg_mode", "token-mean", "choice", "token-mean or seq-mean-token-mean", AGG_MODES, True
        ),
        *_CLIP,
        _LEVEL,
        *_IS,
    ),
    trainer="openrlhf",
    version=VERSION,
    needs_rollout=lambda p: p["is_correction_level"] != "off",
)
def _ppo(x: LossInput, **p: Any) -> tuple[Tensor, Tensor]:
    a, m, mb = x.advantages, x.m, x.mb
    lo, hi = _clip_bounds(p)
    d = torch.where(mb, x.log_prob - x.old_log_prob, 0.0)
    r = d.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    big = d.abs() > SAFETY_BOUND  # past the clamp: no gradient
    g = torch.where(big, 0.0, _d_surrogate(a, r, lo, hi, p["dual_clip"]) * r)
    state = _states(a, r, mb, lo, hi, p["dual_clip"]) | flag(big & mb, TokenState.STABILITY_CLAMPED)
    if p["is_correction_level"] != "off":
        coef, cstate = _correction(x, m, mb, p)
        g, state = coef * g, state | cstate
    c = _agg(x, m.sum(dim=-1), p["loss_agg_mode"])[:, None] * m
    return torch.where(mb, c * g, 0.0), torch.where(mb, state, 0)


@register_loss(
    "openrlhf:gspo",
    label="OpenRLHF GSPO",
    description="PPO's clip on the row's geometric-mean ratio (against the rollout with the correction on); "
    "always seq-mean-token-mean.",
    params=(
        *_CLIP,
        LossParam(_LEVEL.name, "off", "choice", "off, or against the rollout", _LEVEL.choices, True),
    ),
    trainer="openrlhf",
    version=VERSION,
    needs_rollout=lambda p: p["is_correction_level"] != "off",
)
def _gspo(x: LossInput, **p: Any) -> tuple[Tensor, Tensor]:
    a, m, mb = x.advantages, x.m, x.mb
    lo, hi = _clip_bounds(p)
    base = x.old_log_prob if p["is_correction_level"] == "off" else x.rollout()
    d = torch.where(mb, x.log_prob - base, 0.0)
    L = m.sum(dim=-1, keepdim=True)
    r = ((d * m).sum(dim=-1, keepdim=True) / L.clamp(min=1.0)).exp()
    ratio = r * m
    c = _agg(x, m.sum(dim=-1), "seq-mean-token-mean")[:, None] * m
    total = (c * _d_surrogate(a, ratio, lo, hi, p["dual_clip"])).sum(dim=-1, keepdim=True)
    w = torch.where(mb, m * r * total / L.clamp(min=1.0), 0.0)
    return w, torch.where(mb, _states(a, ratio, mb, lo, hi, p["dual_clip"]), 0)
