"""TRL 1.16.0's GRPO losses (``trl/trainer/grpo_trainer.py``, ``GRPOTrainer._compute_loss``) as
``trl:<loss_type>``: ``grpo``, ``dr_grpo``, ``dapo`` (TRL's default), ``bnpo``, ``cispo``,
``sapo``, ``luspo``, ``vespo``, each with ``importance_sampling_level`` (``token``, the default, or
``sequence``) and its own ``GRPOConfig`` parameters at TRL's defaults.

With ``r`` the importance weight (per token ``exp(log_prob - old_log_prob)``; with
``importance_sampling_level="sequence"`` one per row, ``r_i = exp(mean of the row's log-ratios)``,
whose gradient reaches every token of the row as ``r_i / L_i``), ``A`` the advantage and ``m`` the
loss mask (``completion_mask * tool_mask``: tool tokens carry no loss), the per-token loss is

* ``grpo``, ``bnpo``, ``dr_grpo``, ``dapo``, ``luspo``: ``-min(min(r, delta) A, clip(r, 1 -
  epsilon, 1 + epsilon_high) A)`` (``delta``: the two-sided clip, None by default; ``epsilon_high``
  None is ``epsilon``); a tie passes half the gradient through each side, as torch does;
* ``cispo``: ``-min(r, epsilon_high) A log_prob`` with the ratio a stop-gradient weight (TRL's
  ``epsilon_high`` is here the upper bound itself, ScaleRL's epsilon_max; by default it is
  ``epsilon`` = 0.2, so every ratio weight is at most 0.2);
* ``sapo``: ``-(4 / tau) sigmoid(tau (r - 1)) A``, ``tau = sapo_temperature_pos`` for ``A > 0``
  else ``sapo_temperature_neg``;
* ``vespo``: ``-phi A log_prob`` with the stop-gradient Gamma weight ``phi = exp(lambda + k log w -
  lambda w)`` of the row's sequence ratio ``w = exp(clamp(sum of clamp(d, -20, 20), log 1e-8,
  20))``, ``(k, lambda)`` by the sign of ``A`` (``A >= 0``: ``vespo_k_pos``, ``vespo_lambda_pos``);
  it does not read the importance-sampling level;

aggregated over the batch of B rows (empty ones included) with N loss tokens and ``L_i`` in row
``i``: ``grpo``, ``sapo`` ``1 / (B max(L_i, 1))``; ``bnpo``, ``dapo``, ``cispo``, ``vespo`` ``1 /
max(N, 1)`` (dapo's ``num_items_in_batch`` is the generation batch's loss tokens: this batch, one
process, no gradient accumulation); ``dr_grpo`` ``1 / (B max_completion_length)``; ``luspo`` ``1 /
B`` (each row's loss summed over its tokens). Left out: the KL term (``beta``, 0 by default), the
entropy mask (``top_entropy_quantile``), the off-policy sequence mask and vLLM's importance
sampling correction, each off by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .core import LossInput, TokenState, flag
from .registry import LossParam, register_loss

VERSION = "1.16.0"
LEVELS = ("token", "sequence")

_LEVEL = LossParam(
    "importance_sampling_level",
    "token",
    "choice",
    "the ratio per token or one per sequence (GSPO)",
    LEVELS,
    True,
)
_EPS = LossParam("epsilon", 0.2, "float", "the clip range below 1 (and above, unless epsilon_high)")
_EPS_HIGH = LossParam("epsilon_high", None, "optional_float", "the clip range above 1 (None: epsilon)")
_DELTA = LossParam(
    "delta", None, "optional_float", "the two-sided clip's upper bound on the ratio (None: off)"
)
_CLIPPED = (_LEVEL, _EPS, _EPS_HIGH, _DELTA)

# The aggregation's per-row factor s_i (c_ij = m_ij s_i) from the batch's rows, tokens and lengths.
Scale = Callable[[LossInput, Tensor, dict[str, Any]], Tensor]


def _per_row(x: LossInput, counts: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(B rows of the batch, N loss tokens of the batch, [B] the given rows' L) as floats."""
    batch = x.shape(counts)
    lengths = batch.lengths.to(x.dtype)
    return (
        torch.tensor(float(lengths.shape[0]), dtype=x.dtype),
        lengths.sum(),
        batch.take(lengths),
    )


def _seq_mean(x: LossInput, counts: Tensor, _p: dict[str, Any]) -> Tensor:
    B, _, L = _per_row(x, counts)
    return 1.0 / (B * L.clamp(min=1.0))


def _token_mean(x: LossInput, counts: Tensor, _p: dict[str, Any]) -> Tensor:
    _, N, L = _per_row(x, counts)
    return (1.0 / N.clamp(min=1.0)).expand_as(L)


def _constant(x: LossInput, counts: Tensor, p: dict[str, Any]) -> Tensor:
    B, _, L = _per_row(x, counts)
    return (1.0 / (B * float(p["max_completion_length"]))).expand_as(L)


def _row_sum(x: LossInput, counts: Tensor, _p: dict[str, Any]) -> Tensor:
    B, _, L = _per_row(x, counts)
    return (1.0 / B).expand_as(L)


def _ratio(x: LossInput, m: Tensor, level: str) -> Tensor:
    """[B, T] TRL's ``coef_1``: per token, or the row's geometric-mean ratio on every token."""
    d = torch.where(m != 0, x.log_prob - x.old_log_prob, 0.0)
    if level == "token":
        return torch.exp(d)
    s = (d * m).sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return torch.exp(s).expand_as(d)


def _through_ratio(m: Tensor, c: Tensor, dr: Tensor, r: Tensor, level: str) -> Tensor:
    """-dL/d log_prob when the loss reaches log_prob through the ratio: ``dr`` [B, T] is -d(token
    loss)/d r, ``c`` the aggregation factor. Per token ``c dr r``; per sequence each token of row i
    gets ``r_i / max(L_i, 1) * sum_j c_ij dr_ij``."""
    if level == "token":
        return c * dr * r
    total = (c * dr).sum(dim=-1, keepdim=True)
    return m * r * total / m.sum(dim=-1, keepdim=True).clamp(min=1.0)


def _states(a: Tensor, r: Tensor, mb: Tensor, lo: float, hi: float, delta: float | None) -> Tensor:
    state = flag(mb & (a > 0) & (r > hi), TokenState.CLIPPED_HIGH) | flag(
        mb & (a < 0) & (r < lo), TokenState.CLIPPED_LOW
    )
    if delta is not None:
        state = state | flag(mb & (a < 0) & (r > max(delta, hi)), TokenState.DUAL_CLIPPED)
    return state


def _clipped(name: str, scale: Scale, description: str, extra: tuple[LossParam, ...] = ()) -> None:
    """Register TRL's clipped-surrogate loss ``name`` (grpo, bnpo, dr_grpo, dapo, luspo)."""

    def fn(x: LossInput, **p: Any) -> tuple[Tensor, Tensor]:
        a, m, mb = x.advantages, x.m, x.mb
        lo = 1.0 - p["epsilon"]
        hi = 1.0 + (p["epsilon"] if p["epsilon_high"] is None else p["epsilon_high"])
        delta = p["delta"]
        r = _ratio(x, m, p["importance_sampling_level"])
        r1 = r if delta is None else r.clamp(max=delta)
        v1, v2 = r1 * a, r.clamp(lo, hi) * a
        # d min / d r, as torch's minimum and clamp pass it (clamp: inclusive bounds; a tie: half each).
        g1 = a if delta is None else torch.where(r <= delta, a, 0.0)
        g2 = torch.where((r >= lo) & (r <= hi), a, 0.0)
        dr = torch.where(v1 < v2, g1, torch.where(v2 < v1, g2, (g1 + g2) / 2))
        c = scale(x, m.sum(dim=-1), p)[:, None] * m
        w = torch.where(mb, _through_ratio(m, c, dr, r, p["importance_sampling_level"]), 0.0)
        return w, _states(a, r, mb, lo, hi, delta)

    register_loss(
        f"trl:{name}",
        label=f"TRL {name}",
        description=description,
        params=_CLIPPED + extra,
        trainer="trl",
        version=VERSION,
    )(fn)


_clipped(
    "grpo", _seq_mean, "PPO's clip, each sequence's token mean averaged over the sequences (length bias)."
)
_clipped(
    "dr_grpo",
    _constant,
    "PPO's clip, summed and divided by B x max_completion_length (Dr. GRPO: no length bias).",
    (LossParam("max_completion_length", 512, "int", "the constant Dr. GRPO divides by (with B)"),),
)
_clipped("dapo", _token_mean, "PPO's clip, averaged over the batch's loss tokens (TRL's default loss).")
_clipped("bnpo", _token_mean, "PPO's clip, averaged over the local batch's loss tokens.")
_clipped(
    "luspo", _row_sum, "PPO's clip, each sequence's loss summed over its tokens, averaged over sequences."
)


@register_loss(
    "trl:cispo",
    label="TRL cispo",
    description="The ratio, capped at epsilon_high, as a stop-gradient weight on A log_prob; token mean.",
    params=(_LEVEL, _EPS, _EPS_HIGH),
    trainer="trl",
    version=VERSION,
)
def _cispo(x: LossInput, **p: Any) -> tuple[Tensor, Tensor]:
    m, mb = x.m, x.mb
    cap = p["epsilon"] if p["epsilon_high"] is None else p["epsilon_high"]
    r = _ratio(x, m, p["importance_sampling_level"])
    c = _token_mean(x, m.sum(dim=-1), p)[:, None] * m
    w = torch.where(mb, c * r.clamp(max=cap) * x.advantages, 0.0)
    return w, flag(mb & (r > cap), TokenState.CLIPPED_HIGH)


@register_loss(
    "trl:sapo",
    label="TRL sapo",
    description="A soft sigmoid gate of the ratio instead of the clip; each sequence's token mean averaged.",
    params=(
        _LEVEL,
        LossParam("sapo_temperature_pos", 1.0, "float", "the gate's temperature for A > 0"),
        LossParam("sapo_temperature_neg", 1.05, "float", "the gate's temperature for A <= 0"),
    ),
    trainer="trl",
    version=VERSION,
)
def _sapo(x: LossInput, **p: Any) -> tuple[Tensor, Tensor]:
    a, m, mb = x.advantages, x.m, x.mb
    r = _ratio(x, m, p["importance_sampling_level"])
    # TRL picks the temperatures as torch.where(A > 0, pos, neg) of two Python floats: a tensor of
    # torch's default dtype (float32: 1.05 is 1.0499999523...), as here.
    tau = torch.where(a > 0, float(p["sapo_temperature_pos"]), float(p["sapo_temperature_neg"]))
    sig = torch.sigmoid(tau * (r - 1.0))
    dr = 4.0 * sig * (1.0 - sig) * a  # d/dr of (4 / tau) sigmoid(tau (r - 1)) A
    c = _seq_mean(x, m.sum(dim=-1), p)[:, None] * m
    w = torch.where(mb, _through_ratio(m, c, dr, r, p["importance_sampling_level"]), 0.0)
    return w, x.zeros_state()


@register_loss(
    "trl:vespo",
    label="TRL vespo",
    description="A stop-gradient Gamma weight of the sequence's ratio on A log_prob; token mean.",
    params=(
        _LEVEL,
        LossParam("vespo_k_pos", 2.0, "float", "the Gamma weight's power for A >= 0"),
        LossParam("vespo_lambda_pos", 3.0, "float", "the Gamma weight's decay for A >= 0"),
        LossParam("vespo_k_neg", 3.0, "float", "the Gamma weight's power for A < 0"),
        LossParam("vespo_lambda_neg", 2.0, "float", "the Gamma weight's decay for A < 0"),
    ),
    trainer="trl",
    version=VERSION,
)
def _vespo(x: LossInput, **p: Any) -> tuple[Tensor, Tensor]:
    a, m, mb = x.advantages, x.m, x.mb
    lower = math.log(1e-8)
    d = torch.where(mb, x.log_prob - x.old_log_prob, 0.0).clamp(-20.0, 20.0)
    log_w = (d * m).sum(dim=-1, keepdim=True).clamp(lower, 20.0)
    nonneg = a >= 0
    k = torch.where(nonneg, float(p["vespo_k_pos"]), float(p["vespo_k_neg"])).to(x.dtype)
    lam = torch.where(nonneg, float(p["vespo_lambda_pos"]), float(p["vespo_lambda_neg"])).to(x.dtype)
    lam = lam.clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    c = _token_mean(x, m.sum(dim=-1), p)[:, None] * m
    return torch.where(mb, c * phi * a, 0.0), x.zeros_state()
