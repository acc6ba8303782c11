"""What every policy loss shares: the token states, the rollout-correction threshold, the batch a
loss's aggregation is taken over, and the input a loss function reads.

A loss's weight ``w = -dL/d log_prob`` of a token is its share of the policy gradient: the
gradient of the loss with respect to the model's parameters is ``-sum_ij w_ij * d log_prob_ij /
d theta``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "CLIPPING",
    "ZEROING",
    "BatchShape",
    "LossInput",
    "TokenState",
    "flag",
    "parse_threshold",
]

SAFETY_BOUND = 20.0  # the log-ratio clamp (+-20) every trainer applies before exp


class TokenState(enum.IntFlag):
    """Why a token's weight differs from ``c * A * r`` (bit flags; several may be set; 0 off-mask).

    ``CLIPPED_HIGH`` (1): the ratio is above ``1 + clip_ratio_high`` with ``A > 0`` (the weight is
    0; a CISPO-style loss: the ratio weight is truncated there, any sign of A; ``geo_mean``: the
    log-ratio above ``clip_ratio_high``). ``CLIPPED_LOW`` (2): below ``1 - clip_ratio_low`` with
    ``A < 0`` (likewise). ``DUAL_CLIPPED`` (4): ``A < 0`` and the ratio above the dual-clip bound
    (0). ``TIS_TRUNCATED`` (8): the rollout-correction weight was truncated at the threshold (the
    whole row for a sequence-level correction). ``ICEPOP_ZEROED`` (16): the rollout-correction
    weight was outside its window and set to 0. ``COV_SELECTED`` (32): Clip-Cov zeroed it (or may
    have: see ``verl``'s ``clip_cov``) / KL-Cov added its KL penalty. ``STABILITY_CLAMPED`` (64):
    the log-ratio was outside the trainer's clamp (+-20; GSPO's cap of 10), so no gradient flows.
    """

    NONE = 0
    CLIPPED_HIGH = 1
    CLIPPED_LOW = 2
    DUAL_CLIPPED = 4
    TIS_TRUNCATED = 8
    ICEPOP_ZEROED = 16
    COV_SELECTED = 32
    STABILITY_CLAMPED = 64


# The flags that set a weight to 0 (for every loss but the CISPO-style ones, where clipping only
# truncates).
ZEROING = (
    TokenState.CLIPPED_HIGH
    | TokenState.CLIPPED_LOW
    | TokenState.DUAL_CLIPPED
    | TokenState.ICEPOP_ZEROED
    | TokenState.STABILITY_CLAMPED
)

# The flags whose zero weight is the policy loss's own clipping (PPO's clip and dual clip,
# Clip-Cov, the stability clamp), as against rollout-correction masking (ICEPOP_ZEROED).
CLIPPING = (
    TokenState.CLIPPED_HIGH
    | TokenState.CLIPPED_LOW
    | TokenState.DUAL_CLIPPED
    | TokenState.COV_SELECTED
    | TokenState.STABILITY_CLAMPED
)


def flag(cond: Tensor, state: TokenState) -> Tensor:
    """[B, T] uint8: ``state`` where ``cond``, else 0."""
    return cond.to(torch.uint8) * int(state)


def parse_threshold(spec: float | str) -> tuple[float, float | None]:
    """(upper, lower) of a rollout-correction threshold: a number or number-like string is an upper
    bound (truncation, TIS); ``"lo_hi"`` a window (zero outside, IcePop), as verl's
    ``rollout_corr_helper`` reads it. The one reading of the threshold (the pages' and the API's
    too); ValueError (TypeError for a non-number) saying what is allowed."""
    if isinstance(spec, bool) or not isinstance(spec, int | float | str):
        raise TypeError("rollout_is_threshold must be a number or a 'lo_hi' string")
    lower: float | None = None
    if isinstance(spec, str):
        s = spec.strip()
        try:
            if "_" in s:
                lo_s, hi_s = s.split("_", 1)
                lower, upper = float(lo_s), float(hi_s)
            else:
                upper = float(s)
        except ValueError as exc:
            raise ValueError(f"invalid rollout_is_threshold {spec!r}: a positive number or 'lo_hi'") from exc
    else:
        upper = float(spec)
    if not upper > 0:
        raise ValueError(f"rollout_is_threshold upper bound must be positive, got {spec!r}")
    if lower is not None and not (math.isfinite(lower) and 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold {spec!r}: write lo_hi with 0 < lo <= hi")
    return upper, lower


@dataclass(frozen=True)
class BatchShape:
    """The batch a loss's aggregation is taken over, when the rows given are part of it.

    lengths: [N] policy tokens of every row of the batch. horizon: its padded length T (verl's
    ``seq-mean-token-sum-norm`` and Dr. GRPO-style constants). groups: [N] integer prompt-group ids
    (SkyRL's ``prompt_mean``), or None. rows: [B] the given rows' indices in the batch (None: the
    given rows are the whole batch, in order).
    """

    lengths: Tensor
    horizon: int
    groups: Tensor | None = None
    rows: Tensor | None = None

    def take(self, per_row: Tensor) -> Tensor:
        """The entries of a per-batch-row [N] tensor for the given rows ([B])."""
        return per_row if self.rows is None else per_row[self.rows]


@dataclass(frozen=True)
class LossInput:
    """What a loss function reads: [B, T] tensors, detached, in the computation's floating dtype
    (``mask`` as given, any dtype; ``m`` it as 0/1 floats, ``mb`` as booleans), the batch the
    aggregation is taken over (None: these rows), and whether the caller wants the states."""

    advantages: Tensor
    log_prob: Tensor
    old_log_prob: Tensor
    mask: Tensor
    rollout_log_prob: Tensor | None
    dtype: torch.dtype
    batch: BatchShape | None
    want_states: bool

    def shape(self, counts: Tensor) -> BatchShape:
        """The batch the aggregation is taken over: the one given, else these rows (their policy
        ``counts`` [B], already summed by the caller)."""
        if self.batch is not None:
            return self.batch
        return BatchShape(lengths=counts, horizon=int(self.advantages.shape[-1]))

    @property
    def m(self) -> Tensor:
        """[B, T] the mask as 0/1 numbers in the computation's dtype."""
        return self.mask.to(self.dtype)

    @property
    def mb(self) -> Tensor:
        """[B, T] the mask as booleans."""
        return self.mask != 0

    @property
    def counts(self) -> Tensor:
        """[B] policy tokens of each given row (the mask's sum)."""
        return self.m.sum(dim=-1)

    def zeros_state(self) -> Tensor:
        """[B, T] uint8 zeros."""
        return torch.zeros(self.advantages.shape, dtype=torch.uint8)

    def rollout(self) -> Tensor:
        """The rollout log-probs (the registry checks a loss that reads them has them)."""
        if self.rollout_log_prob is None:
            raise ValueError("this loss needs rollout_log_prob")
        return self.rollout_log_prob
