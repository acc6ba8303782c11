"""What the gradient sees: per-token weights ``w = -dL/d log_prob`` under verl 0.9.1's policy
losses, loss aggregations and rollout correction, in closed form (no autograd).

``L`` is ``verl.trainer.ppo.core_algos.get_policy_loss_fn(loss)`` with ``loss_agg_mode=agg`` on one
batch (one data-parallel rank, the whole batch as one micro-batch), its ``rollout_is_weights``
taken from ``verl/trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_weights``)
when ``rollout_is`` is ``"token"`` or ``"sequence"``. A token's weight is its share of the policy
gradient: the gradient of the loss with respect to the model's parameters is
``-sum_ij w_ij * d log_prob_ij / d theta``. With every ratio at 1 and no clipping, ``w`` is the
advantage times the aggregation's per-token factor (``token-mean``: ``A / N``).

Shapes: ``advantages``, ``log_prob``, ``old_log_prob``, ``rollout_log_prob`` and ``mask`` are
``[B, T]``; ``mask`` is the response (policy-token) mask of any dtype, used numerically as verl
does (0 and 1 in practice). Outputs are ``[B, T]`` in the inputs' floating dtype (float64 in,
float64 out) and 0 off-mask whatever the inputs hold there.

Per token, with ``d = log_prob - old_log_prob``, ``r = exp(d)``, the aggregation factor ``c_ij``
(below), the rollout-correction weight ``rho_ij`` (1 without correction) and ``lo = 1 -
clip_ratio_low``, ``hi = 1 + clip_ratio_high``:

* ``vanilla`` (PPO, dual-clip PPO): ``w = c * rho * A * r``, zero when clipped: ``A > 0`` and
  ``r > hi``; ``A < 0`` and ``r < lo``; ``A < 0`` and ``r > clip_ratio_c`` (dual clip); or
  ``|d| > 20`` (verl's stability clamp).
* ``gspo``: ``s_i = exp(mean of d over the row's mask)`` replaces ``r`` (sequence ratio; zero when
  clipped as in PPO, no dual clip, zero when the mean exceeds verl's cap of 10).
* ``cispo``: ``w = c * rho * A * clip(r, lo, hi)`` (the clipped ratio is a stop-gradient weight,
  never zero).
* ``gpg``: ``w = c * rho * A``.
* ``sapo``: ``w = c * rho * A * 4 sigma (1 - sigma) * r`` with ``sigma = sigmoid(tau (r - 1))``,
  ``tau = tau_pos`` when ``A > 0`` else ``tau_neg``; verl 0.9.1 always aggregates SAPO as
  ``seq-mean-token-mean`` whatever ``agg`` says, and so does this.
* ``geo_mean`` (GMPO): the row's loss is ``-mean(A) * exp(mean of clip(d))`` (log-ratio clipped
  to ``[-clip_ratio_low, clip_ratio_high]`` on the pessimistic side), averaged over all B rows
  (verl ignores ``agg``): ``w_ij = mean_i(A) * ratio_i * m_ij / (L_i + 1e-8) / B``, zero where the
  log-ratio is clipped or ``A_ij = 0``. A rollout correction enters as the geometric mean of the
  row's weights.
* ``clip_cov``: ``vanilla`` without the dual clip and the stability clamp, and tokens whose
  covariance ``(A - mean A)(log_prob - mean log_prob)`` lies in ``(1, 5)`` (not already clipped)
  get zero; verl zeroes ``max(1, int(0.0002 N))`` of them picked at random: when there are no more
  candidates than that the weights are exact, otherwise each candidate's weight is its
  expectation (kept with probability ``1 - k / n``).
* ``kl_cov``: ``w = c * rho * A * r`` (no clipping), and the ``max(1, int(0.0002 N))`` tokens of
  largest covariance get ``c * rho * (A * r - 0.1 * sign(d))`` (verl's ``|d|`` penalty).

Aggregation factor ``c_ij = m_ij * s_i`` (``N`` masked tokens, ``S`` rows with any, ``L_i`` the
row's): ``token-mean`` ``1 / N``; ``token-sum`` ``1``; ``seq-mean-token-sum`` ``1 / S``;
``seq-mean-token-mean`` ``1 / ((L_i + 1e-8) S)`` (a token of a long answer weighs less: the
length bias Dr. GRPO removes); ``seq-mean-token-sum-norm`` ``1 / (S * loss_scale_factor)``
(``T`` when None). An empty batch gives zeros (verl divides by zero).

Rollout correction ``rho`` from ``old_log_prob - rollout_log_prob`` (clamped to +-20 before the
exponential): per token (``"token"``) or ``exp`` of the row's masked sum (``"sequence"``),
times the mask; a number ``rollout_is_threshold`` truncates it at that value (TIS), a
``"lo_hi"`` string zeroes it outside ``[lo, hi]`` (IcePop).

:func:`loss_token_states` gives each token's :class:`TokenState` flags (why its weight differs
from ``c * A * r``). docs/conventions.md has the papers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import Tensor

from . import native

__all__ = [
    "AGGS",
    "CLIPPING",
    "LOSSES",
    "ROLLOUT_IS",
    "TokenState",
    "ZEROING",
    "loss_token_states",
    "loss_weights",
    "loss_weights_and_states",
]

LOSSES = ("vanilla", "gspo", "cispo", "geo_mean", "gpg", "sapo", "clip_cov", "kl_cov")
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")
ROLLOUT_IS = ("token", "sequence")

# verl 0.9.1's defaults (verl/workers/config/actor.py, PolicyLossConfig) for the covariance losses.
CLIP_COV_RATIO, CLIP_COV_LB, CLIP_COV_UB = 0.0002, 1.0, 5.0
KL_COV_RATIO, PPO_KL_COEF = 0.0002, 0.1
SAFETY_BOUND = 20.0  # verl clamps log-ratios to +-20 before exp (core_algos, rollout_corr_helper)
GSPO_LOG_CAP = 10.0  # verl's GSPO clamps the sequence log-ratio at 10


class TokenState(enum.IntFlag):
    """Why a token's weight differs from ``c * A * r`` (bit flags; several may be set; 0 off-mask).

    ``CLIPPED_HIGH`` (1): the ratio is above ``1 + clip_ratio_high`` with ``A > 0`` (the weight is
    0; ``cispo``: the ratio weight is truncated there, any sign of A; ``geo_mean``: the log-ratio
    above ``clip_ratio_high``). ``CLIPPED_LOW`` (2): below ``1 - clip_ratio_low`` with ``A < 0``
    (likewise). ``DUAL_CLIPPED`` (4): ``vanilla``, ``A < 0`` and the ratio above ``clip_ratio_c``
    (0). ``TIS_TRUNCATED`` (8): the rollout-correction weight was truncated at the threshold (the
    whole row for ``"sequence"``). ``ICEPOP_ZEROED`` (16): the rollout-correction weight was outside
    ``[lo, hi]`` and set to 0. ``COV_SELECTED`` (32): ``clip_cov`` zeroed it (or may have: see the
    module docstring) / ``kl_cov`` added its KL penalty. ``STABILITY_CLAMPED`` (64): the log-ratio
    was outside verl's clamp (+-20; GSPO's cap of 10), so no gradient flows.
    """

    NONE = 0
    CLIPPED_HIGH = 1
    CLIPPED_LOW = 2
    DUAL_CLIPPED = 4
    TIS_TRUNCATED = 8
    ICEPOP_ZEROED = 16
    COV_SELECTED = 32
    STABILITY_CLAMPED = 64


# The flags that set a weight to 0 (for every loss but cispo, where clipping only truncates).
ZEROING = (
    TokenState.CLIPPED_HIGH
    | TokenState.CLIPPED_LOW
    | TokenState.DUAL_CLIPPED
    | TokenState.ICEPOP_ZEROED
    | TokenState.STABILITY_CLAMPED
)

# The flags whose zero weight is the policy loss's own clipping (PPO's clip and dual clip,
# Clip-Cov, verl's stability clamp), as against rollout-correction masking (ICEPOP_ZEROED).
CLIPPING = (
    TokenState.CLIPPED_HIGH
    | TokenState.CLIPPED_LOW
    | TokenState.DUAL_CLIPPED
    | TokenState.COV_SELECTED
    | TokenState.STABILITY_CLAMPED
)


@dataclass(frozen=True)
class _Cfg:
    loss: str
    agg: str
    lo: float  # 1 - clip_ratio_low
    hi: float  # 1 + clip_ratio_high
    eps_low: float
    eps_high: float
    clip_ratio_c: float
    tau_pos: float
    tau_neg: float
    loss_scale_factor: float | None
    rollout_is: str | None
    is_upper: float
    is_lower: float | None  # None: TIS; a number: IcePop


def _parse_threshold(spec: float | str) -> tuple[float, float | None]:
    """(upper, lower): a number or number-like string is TIS's upper bound; ``"lo_hi"`` is IcePop's
    window (the same reading as verl's ``rollout_corr_helper``)."""
    if isinstance(spec, bool):
        raise TypeError("rollout_is_threshold must be a number or a 'lo_hi' string, not a boolean")
    lower: float | None = None
    if isinstance(spec, int | float):
        upper = float(spec)
    elif isinstance(spec, str):
        s = spec.strip()
        try:
            if "_" in s:
                lo_s, hi_s = s.split("_", 1)
                lower, upper = float(lo_s), float(hi_s)
            else:
                upper = float(s)
        except ValueError as exc:
            raise ValueError(f"invalid rollout_is_threshold {spec!r}: a number or 'lo_hi'") from exc
    else:
        raise TypeError("rollout_is_threshold must be a number or a 'lo_hi' string")
    if not upper > 0:
        raise ValueError(f"rollout_is_threshold upper bound must be positive, got {upper}")
    if lower is not None and not 0 < lower <= upper:
        raise ValueError(f"rollout_is_threshold needs 0 < lo <= hi, got {spec!r}")
    return upper, lower


def _config(
    loss: str,
    agg: str,
    rollout_is: str | None,
    rollout_is_threshold: float | str,
    clip_ratio: float,
    clip_ratio_low: float | None,
    clip_ratio_high: float | None,
    clip_ratio_c: float,
    tau_pos: float,
    tau_neg: float,
    loss_scale_factor: float | None,
) -> _Cfg:
    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; one of {', '.join(LOSSES)}")
    if agg not in AGGS:
        raise ValueError(f"unknown agg {agg!r}; one of {', '.join(AGGS)}")
    if rollout_is is not None and rollout_is not in ROLLOUT_IS:
        raise ValueError(f"unknown rollout_is {rollout_is!r}; one of token, sequence (or None)")
    if loss == "vanilla" and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip PPO), got {clip_ratio_c}")
    if loss_scale_factor is not None and not loss_scale_factor > 0:
        raise ValueError(f"loss_scale_factor must be positive, got {loss_scale_factor}")
    eps_low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    eps_high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    upper, lower = _parse_threshold(rollout_is_threshold)
    return _Cfg(
        loss=loss,
        agg="seq-mean-token-mean" if loss == "sapo" else agg,
        lo=1.0 - eps_low,
        hi=1.0 + eps_high,
        eps_low=float(eps_low),
        eps_high=float(eps_high),
        clip_ratio_c=float(clip_ratio_c),
        tau_pos=float(tau_pos),
        tau_neg=float(tau_neg),
        loss_scale_factor=None if loss_scale_factor is None else float(loss_scale_factor),
        rollout_is=rollout_is,
        is_upper=upper,
        is_lower=lower,
    )


def _check(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    rollout_log_prob: Tensor | None,
    cfg: _Cfg,
) -> torch.dtype:
    shape = advantages.shape
    if advantages.ndim != 2:
        raise ValueError(f"advantages must be [B, T], got shape {tuple(shape)}")
    named = {"log_prob": log_prob, "old_log_prob": old_log_prob, "mask": mask}
    if rollout_log_prob is not None:
        named["rollout_log_prob"] = rollout_log_prob
    for name, x in named.items():
        if x.shape != shape:
            raise ValueError(f"{name} has shape {tuple(x.shape)}, advantages {tuple(shape)}")
    if cfg.rollout_is is not None and rollout_log_prob is None:
        raise ValueError(f"rollout_is={cfg.rollout_is!r} needs rollout_log_prob")
    floats = [x.dtype for x in (advantages, log_prob, old_log_prob) if x.is_floating_point()]
    dtype = floats[0] if floats else torch.get_default_dtype()
    for dt in floats[1:]:
        dtype = torch.promote_types(dtype, dt)
    return dtype


def _row_scale(counts: Tensor, T: int, cfg: _Cfg) -> Tensor:
    """[B] aggregation factor ``s_i`` (the token factor is ``c_ij = m_ij * s_i``) from the rows'
    mask sums ``counts`` [B]."""
    n_rows = (counts > 0).sum().to(counts.dtype)
    agg = cfg.agg
    if agg == "token-sum":
        return torch.ones_like(counts)
    if agg == "token-mean":
        n = counts.sum()
        return torch.where(n > 0, 1.0 / torch.where(n > 0, n, 1.0), 0.0).expand_as(counts)
    inv_rows = torch.where(n_rows > 0, 1.0 / torch.where(n_rows > 0, n_rows, 1.0), 0.0)
    if agg == "seq-mean-token-sum":
        return inv_rows.expand_as(counts)
    if agg == "seq-mean-token-sum-norm":
        lsf = float(T) if cfg.loss_scale_factor is None else cfg.loss_scale_factor
        return (inv_rows / lsf).expand_as(counts)
    return inv_rows / (counts + 1e-8)  # seq-mean-token-mean


def _rollout(
    old_log_prob: Tensor, rollout_log_prob: Tensor, m: Tensor, mb: Tensor, cfg: _Cfg
) -> tuple[Tensor, Tensor]:
    """(rho [B, T], state flags [B, T] uint8): verl's rollout-correction weights (mask included)."""
    lr = torch.where(mb, old_log_prob - rollout_log_prob, 0.0)
    if cfg.rollout_is == "sequence":
        lr = (lr * m).sum(dim=-1, keepdim=True)
    raw = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * m
    if cfg.is_lower is None:
        flag = (raw > cfg.is_upper) & mb
        rho = raw.clamp(max=cfg.is_upper)
        state = flag.to(torch.uint8) * int(TokenState.TIS_TRUNCATED)
    else:
        kept = (raw >= cfg.is_lower) & (raw <= cfg.is_upper)
        rho = torch.where(kept, raw, 0.0)
        state = (~kept & mb).to(torch.uint8) * int(TokenState.ICEPOP_ZEROED)
    return rho, state


def _flag(cond: Tensor, flag: TokenState) -> Tensor:
    return cond.to(torch.uint8) * int(flag)


def _ppo(a: Tensor, d: Tensor, r: Tensor, cfg: _Cfg, dual: bool) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate: (-d pg / d log_prob, flags) for ratio ``r`` (gradient ``r``)."""
    pos, neg = a > 0, a < 0
    high = pos & (r > cfg.hi)
    low = neg & (r < cfg.lo)
    cut = high | low
    state = _flag(high, TokenState.CLIPPED_HIGH) | _flag(low, TokenState.CLIPPED_LOW)
    if dual:
        dc = neg & (r > cfg.clip_ratio_c)
        cut = cut | dc
        state = state | _flag(dc, TokenState.DUAL_CLIPPED)
    return torch.where(cut, 0.0, a * r), state


def _cov_candidates(a: Tensor, lp: Tensor, m: Tensor, mb: Tensor, excluded: Tensor) -> Tensor:
    """clip_cov's candidates: covariance in (lb, ub), on-mask, not already clipped."""
    n = m.sum() + 1e-8
    a_mean = torch.where(mb, a, 0.0).mul(m).sum() / n
    lp_mean = torch.where(mb, lp, 0.0).mul(m).sum() / n
    cov = (a - a_mean) * (lp - lp_mean)
    return (cov > CLIP_COV_LB) & (cov < CLIP_COV_UB) & mb & ~excluded


def _kl_cov_top(a: Tensor, lp: Tensor, mb: Tensor) -> Tensor:
    """kl_cov's tokens: the ``max(1, int(n * ratio))`` on-mask tokens of largest covariance."""
    top = torch.zeros_like(mb)
    flat = mb.reshape(-1)
    idx = torch.nonzero(flat, as_tuple=True)[0]
    if idx.numel() == 0:
        return top
    va, vl = a.reshape(-1)[idx], lp.reshape(-1)[idx]
    cov = (va - va.mean()) * (vl - vl.mean())
    k = max(1, int(idx.numel() * KL_COV_RATIO))
    top.view(-1)[idx[torch.topk(cov, k, largest=True).indices]] = True
    return top


def _geo_mean(
    a: Tensor, d: Tensor, m: Tensor, mb: Tensor, counts: Tensor, rho: Tensor | None, cfg: _Cfg
) -> tuple[Tensor, Tensor]:
    """GMPO: the whole weight (verl averages the B row losses; ``agg`` is not used)."""
    B = a.shape[0]
    pos, neg = a > 0, a < 0
    high = pos & (d > cfg.eps_high)
    low = neg & (d < -cfg.eps_low)
    # The clipped log-ratio that enters the row's geometric mean (0 where A = 0, as sign(A) = 0).
    dmin = torch.where(high, cfg.eps_high, torch.where(low, -cfg.eps_low, d))
    dmin = torch.where(mb & (a != 0), dmin, 0.0)
    denom = counts + 1e-8
    ratio = torch.exp((dmin * m).sum(dim=-1) / denom)
    adv = (torch.where(mb, a, 0.0) * m).sum(dim=-1) / denom
    row = adv * ratio / B
    if rho is not None:
        row = row * torch.exp((torch.log(rho + 1e-10) * m).sum(dim=-1) / denom)
    live = mb & (a != 0) & ~high & ~low
    w = torch.where(live, (row / denom)[:, None] * m, 0.0)
    state = _flag(high & mb, TokenState.CLIPPED_HIGH) | _flag(low & mb, TokenState.CLIPPED_LOW)
    return w, state


def _torch_path(
    a: Tensor, lp: Tensor, olp: Tensor, m: Tensor, rlp: Tensor | None, cfg: _Cfg, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """(weights, states) on the vectorised torch path (every loss)."""
    mb = m != 0
    counts = m.sum(dim=-1)
    rho, rstate = (None, None) if cfg.rollout_is is None or rlp is None else _rollout(olp, rlp, m, mb, cfg)
    d = torch.where(mb, lp - olp, 0.0)
    if cfg.loss == "geo_mean":
        w, state = _geo_mean(a, d, m, mb, counts, rho, cfg)
        if rstate is not None:
            state = state | rstate
        return w, state
    big = d.abs() > SAFETY_BOUND
    clamped = d.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    if cfg.loss == "vanilla":
        g, state = _ppo(a, d, torch.exp(clamped), cfg, dual=True)
        g = torch.where(big, 0.0, g)
        state = state | _flag(big & mb, TokenState.STABILITY_CLAMPED)
    elif cfg.loss == "gspo":
        s = (d * m).sum(dim=-1) / counts.clamp(min=1)
        capped = s > GSPO_LOG_CAP
        sr = torch.exp(s.clamp(max=GSPO_LOG_CAP))[:, None].expand_as(a)
        g, state = _ppo(a, d, sr, cfg, dual=False)
        g = torch.where(capped[:, None], 0.0, g)
        state = state | _flag(capped[:, None] & mb, TokenState.STABILITY_CLAMPED)
    elif cfg.loss == "cispo":
        r = torch.exp(clamped)
        g = a * r.clamp(cfg.lo, cfg.hi)
        state = _flag((r > cfg.hi) & mb, TokenState.CLIPPED_HIGH) | _flag(
            (r < cfg.lo) & mb, TokenState.CLIPPED_LOW
        )
    elif cfg.loss == "gpg":
        g = a
        state = torch.zeros(a.shape, dtype=torch.uint8)
    elif cfg.loss == "sapo":
        r = torch.exp(clamped)
        tau = torch.where(
            a > 0, torch.tensor(cfg.tau_pos, dtype=dtype), torch.tensor(cfg.tau_neg, dtype=dtype)
        )
        sig = torch.sigmoid(tau * (r - 1.0))
        g = torch.where(big, 0.0, a * (4.0 * sig * (1.0 - sig)) * r)
        state = _flag(big & mb, TokenState.STABILITY_CLAMPED)
    elif cfg.loss == "clip_cov":
        g, state = _ppo(a, d, torch.exp(d), cfg, dual=False)
        cand = _cov_candidates(a, lp, m, mb, excluded=state != 0)
        n_cand = int(cand.sum().item())
        k = max(int(CLIP_COV_RATIO * float(m.sum().item())), 1)
        keep = 0.0 if n_cand <= k else 1.0 - k / n_cand
        g = torch.where(cand, g * keep, g)
        state = state | _flag(cand, TokenState.COV_SELECTED)
    else:  # kl_cov
        top = _kl_cov_top(a, lp, mb)
        g = a * torch.exp(d) - torch.where(top, PPO_KL_COEF * torch.sign(d), 0.0)
        state = _flag(top, TokenState.COV_SELECTED)
    c = _row_scale(counts, m.shape[-1], cfg)[:, None] * m
    w = c * g if rho is None else c * rho * g
    w = torch.where(mb, w, 0.0)
    if rstate is not None:
        state = state | rstate
    return w, torch.where(mb, state, 0)


_KERNEL_LOSSES = {"vanilla": 0, "gpg": 1, "cispo": 2}
_KERNEL_MASKS = {torch.int64: 0, torch.bool: 1, torch.uint8: 1, torch.float64: 2}


def _native_path(
    a: Tensor, lp: Tensor, olp: Tensor, mask: Tensor, rlp: Tensor | None, cfg: _Cfg, want_states: bool
) -> tuple[Tensor, Tensor | None] | None:
    """The compiled one-pass kernel (``estimators/_loss_native.c``) for vanilla, gpg and cispo on
    float64 CPU tensors, or None (the caller uses the torch path)."""
    kernel = native.loss_kernel()
    mk = _KERNEL_MASKS.get(mask.dtype)
    tensors = (a, lp, olp, mask) if rlp is None else (a, lp, olp, mask, rlp)
    if kernel is None or cfg.loss not in _KERNEL_LOSSES or mk is None or a.dtype != torch.float64:
        return None
    if any(x.device.type != "cpu" for x in tensors):
        return None
    B, T = a.shape
    m = mask.contiguous()
    m = m.view(torch.uint8) if m.dtype == torch.bool else m
    a, lp, olp = a.contiguous(), lp.contiguous(), olp.contiguous()
    counts = torch.empty(B, dtype=torch.float64)
    if B * T:
        kernel.row_counts(m.data_ptr(), counts.data_ptr(), B, T, mk)
    else:
        counts.zero_()
    scale = _row_scale(counts, T, cfg).contiguous()
    rowrho: Tensor | None = None
    roll = 0
    if cfg.rollout_is is not None and rlp is not None:
        ice = cfg.is_lower is not None
        if cfg.rollout_is == "token":
            roll = 2 if ice else 1
            rlp = rlp.contiguous()
        else:
            roll = 4 if ice else 3
            mf = mask.to(torch.float64)
            lr = (torch.where(mf != 0, olp - rlp, 0.0) * mf).sum(dim=-1)
            rowrho = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)).contiguous()
            rlp = None
    else:
        rlp = None
    w = torch.empty(B, T, dtype=torch.float64)
    st = torch.empty(B, T, dtype=torch.uint8)
    threads = torch.get_num_threads() if B * T >= 1 << 16 else 1
    if B * T:
        kernel.loss_weights(
            a.data_ptr(), lp.data_ptr(), olp.data_ptr(), 0 if rlp is None else rlp.data_ptr(), m.data_ptr(),
            scale.data_ptr(), 0 if rowrho is None else rowrho.data_ptr(), w.data_ptr(), st.data_ptr(),
            B, T, _KERNEL_LOSSES[cfg.loss], roll, mk, cfg.lo, cfg.hi, cfg.clip_ratio_c, cfg.is_upper,
            0.0 if cfg.is_lower is None else cfg.is_lower, threads,
        )  # fmt: skip
    return w, (st if want_states else None)


def _compute(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    rollout_log_prob: Tensor | None,
    cfg: _Cfg,
    want_states: bool,
) -> tuple[Tensor, Tensor | None]:
    rlp_in = rollout_log_prob if cfg.rollout_is is not None else None
    dtype = _check(advantages, log_prob, old_log_prob, mask, rlp_in, cfg)
    with torch.no_grad():
        a, lp, olp = (x.detach().to(dtype) for x in (advantages, log_prob, old_log_prob))
        rlp = None if rlp_in is None else rlp_in.detach().to(dtype)
        fast = _native_path(a, lp, olp, mask.detach(), rlp, cfg, want_states)
        if fast is not None:
            return fast
        m = mask.detach().to(dtype)
        w, state = _torch_path(a, lp, olp, m, rlp, cfg, dtype)
    return w, (state if want_states else None)


def loss_weights(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    *,
    loss: str = "vanilla",
    agg: str = "token-mean",
    rollout_log_prob: Tensor | None = None,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str = 2.0,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """[B, T] ``w = -dL/d log_prob`` per token under verl 0.9.1's policy loss ``loss`` aggregated
    by ``agg``, with ``rollout_is`` correction (None, ``"token"``, ``"sequence"``) from
    ``old_log_prob - rollout_log_prob`` (TIS for a number ``rollout_is_threshold``, IcePop for a
    ``"lo_hi"`` string). Closed form, vectorised; 0 off-mask. See the module docstring for each
    loss's and aggregation's weight."""
    cfg = _config(
        loss, agg, rollout_is, rollout_is_threshold, clip_ratio, clip_ratio_low, clip_ratio_high,
        clip_ratio_c, tau_pos, tau_neg, loss_scale_factor,
    )  # fmt: skip
    w, _ = _compute(advantages, log_prob, old_log_prob, mask, rollout_log_prob, cfg, want_states=False)
    return w


def loss_weights_and_states(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    *,
    loss: str = "vanilla",
    agg: str = "token-mean",
    rollout_log_prob: Tensor | None = None,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str = 2.0,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, Tensor]:
    """(:func:`loss_weights`, :func:`loss_token_states`) in one computation."""
    cfg = _config(
        loss, agg, rollout_is, rollout_is_threshold, clip_ratio, clip_ratio_low, clip_ratio_high,
        clip_ratio_c, tau_pos, tau_neg, loss_scale_factor,
    )  # fmt: skip
    w, state = _compute(advantages, log_prob, old_log_prob, mask, rollout_log_prob, cfg, want_states=True)
    assert state is not None
    return w, state


def loss_token_states(
    advantages: Tensor,
    log_prob: Tensor,
    old_log_prob: Tensor,
    mask: Tensor,
    *,
    loss: str = "vanilla",
    agg: str = "token-mean",
    rollout_log_prob: Tensor | None = None,
    rollout_is: str | None = None,
    rollout_is_threshold: float | str = 2.0,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """[B, T] uint8 :class:`TokenState` flags of each token under the same arguments as
    :func:`loss_weights`: clipped high or low, dual-clipped, truncated by TIS, zeroed by IcePop,
    selected by clip_cov/kl_cov, past verl's stability clamp; 0 off-mask. ``state & ZEROING``
    nonzero means the weight is 0 (except for ``cispo``, whose clipping truncates)."""
    _, state = loss_weights_and_states(
        advantages, log_prob, old_log_prob, mask, loss=loss, agg=agg, rollout_log_prob=rollout_log_prob,
        rollout_is=rollout_is, rollout_is_threshold=rollout_is_threshold, clip_ratio=clip_ratio,
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        tau_pos=tau_pos, tau_neg=tau_neg, loss_scale_factor=loss_scale_factor,
    )  # fmt: skip
    return state
