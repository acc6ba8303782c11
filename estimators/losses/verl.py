"""verl 0.9.1's policy losses (``verl.trainer.ppo.core_algos.get_policy_loss_fn``), loss
aggregations (``agg_loss``) and rollout correction, in closed form (no autograd).

``L`` is ``get_policy_loss_fn(loss)`` with ``loss_agg_mode=agg`` on one batch (one data-parallel
rank, the whole batch as one micro-batch), its ``rollout_is_weights`` taken from
``verl/trainer/ppo/rollout_corr_helper.py`` (``compute_rollout_correction_weights``) when
``rollout_is`` is ``"token"`` or ``"sequence"``. With every ratio at 1 and no clipping, ``w`` is
the advantage times the aggregation's per-token factor (``token-mean``: ``A / N``).

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
row's, all of the batch the aggregation is taken over): ``token-mean`` ``1 / N``; ``token-sum``
``1``; ``seq-mean-token-sum`` ``1 / S``; ``seq-mean-token-mean`` ``1 / ((L_i + 1e-8) S)`` (a token
of a long answer weighs less: the length bias Dr. GRPO removes); ``seq-mean-token-sum-norm`` ``1 /
(S * loss_scale_factor)`` (``T`` when None). An empty batch gives zeros (verl divides by zero).

Rollout correction ``rho`` from ``old_log_prob - rollout_log_prob`` (clamped to +-20 before the
exponential): per token (``"token"``) or ``exp`` of the row's masked sum (``"sequence"``), times
the mask; a number ``rollout_is_threshold`` truncates it at that value (TIS), a ``"lo_hi"`` string
zeroes it outside ``[lo, hi]`` (IcePop). docs/conventions.md has the papers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import native
from .core import SAFETY_BOUND, BatchShape, LossInput, TokenState, flag, parse_threshold
from .registry import LossParam, register_loss

__all__ = ["AGGS", "LOSSES", "ROLLOUT_IS", "VERL_PARAMS", "agg_scale"]

VERSION = "0.9.1"
LOSSES = ("vanilla", "gspo", "cispo", "geo_mean", "gpg", "sapo", "clip_cov", "kl_cov")
AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm", "token-sum")
ROLLOUT_IS = ("none", "token", "sequence")

# verl 0.9.1's defaults (verl/workers/config/actor.py, PolicyLossConfig) for the covariance losses.
CLIP_COV_RATIO, CLIP_COV_LB, CLIP_COV_UB = 0.0002, 1.0, 5.0
KL_COV_RATIO, PPO_KL_COEF = 0.0002, 0.1
GSPO_LOG_CAP = 10.0  # verl's GSPO clamps the sequence log-ratio at 10

# Every verl loss reads the same ActorConfig (verl/workers/config/actor.py, its defaults); the
# rollout correction is verl's RolloutCorrectionConfig.
VERL_PARAMS = (
    LossParam("agg", "token-mean", "choice", "loss_agg_mode: how token losses become one", AGGS, True),
    LossParam(
        "rollout_is",
        "none",
        "choice",
        "rollout correction: none, per token or per sequence",
        ROLLOUT_IS,
        True,
    ),
    LossParam(
        "rollout_is_threshold",
        2.0,
        "threshold",
        "a number truncates (TIS); lo_hi zeroes outside (IcePop)",
        control=True,
    ),  # fmt: skip
    LossParam("clip_ratio", 0.2, "float", "PPO's clip range (both sides unless set apart)"),
    LossParam("clip_ratio_low", None, "optional_float", "the clip range below 1 (None: clip_ratio)"),
    LossParam("clip_ratio_high", None, "optional_float", "the clip range above 1 (None: clip_ratio)"),
    LossParam("clip_ratio_c", 3.0, "float", "dual-clip bound for A < 0 (vanilla)"),
    LossParam("tau_pos", 1.0, "float", "SAPO's temperature for A > 0"),
    LossParam("tau_neg", 1.05, "float", "SAPO's temperature for A <= 0"),
    LossParam("loss_scale_factor", None, "optional_float", "seq-mean-token-sum-norm's constant (None: T)"),
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


def _config(loss: str, p: dict[str, Any]) -> _Cfg:
    if loss == "vanilla" and not p["clip_ratio_c"] > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 (dual-clip PPO), got {p['clip_ratio_c']}")
    lsf = p["loss_scale_factor"]
    if lsf is not None and not lsf > 0:
        raise ValueError(f"loss_scale_factor must be positive, got {lsf}")
    eps_low = p["clip_ratio"] if p["clip_ratio_low"] is None else p["clip_ratio_low"]
    eps_high = p["clip_ratio"] if p["clip_ratio_high"] is None else p["clip_ratio_high"]
    upper, lower = parse_threshold(p["rollout_is_threshold"])
    return _Cfg(
        loss=loss,
        agg="seq-mean-token-mean" if loss == "sapo" else p["agg"],
        lo=1.0 - eps_low,
        hi=1.0 + eps_high,
        eps_low=float(eps_low),
        eps_high=float(eps_high),
        clip_ratio_c=float(p["clip_ratio_c"]),
        tau_pos=float(p["tau_pos"]),
        tau_neg=float(p["tau_neg"]),
        loss_scale_factor=None if lsf is None else float(lsf),
        rollout_is=None if p["rollout_is"] == "none" else p["rollout_is"],
        is_upper=upper,
        is_lower=lower,
    )


def agg_scale(agg: str, batch: BatchShape, loss_scale_factor: float | None = None) -> Tensor:
    """[N] verl's aggregation factor ``s_i`` of every row of ``batch`` (the token factor is
    ``c_ij = m_ij * s_i``), from its rows' policy lengths."""
    lengths = batch.lengths
    if not lengths.is_floating_point():
        lengths = lengths.to(torch.get_default_dtype())
    n_rows = (lengths > 0).sum().to(lengths.dtype)
    if agg == "token-sum":
        return torch.ones_like(lengths)
    if agg == "token-mean":
        n = lengths.sum()
        return torch.where(n > 0, 1.0 / torch.where(n > 0, n, 1.0), 0.0).expand_as(lengths)
    inv_rows = torch.where(n_rows > 0, 1.0 / torch.where(n_rows > 0, n_rows, 1.0), 0.0)
    if agg == "seq-mean-token-sum":
        return inv_rows.expand_as(lengths)
    if agg == "seq-mean-token-sum-norm":
        lsf = float(batch.horizon) if loss_scale_factor is None else loss_scale_factor
        return (inv_rows / lsf).expand_as(lengths)
    return inv_rows / (lengths + 1e-8)  # seq-mean-token-mean


def _row_scale(batch: BatchShape, cfg: _Cfg, dtype: torch.dtype) -> Tensor:
    """[B] the given rows' aggregation factor."""
    return batch.take(agg_scale(cfg.agg, batch, cfg.loss_scale_factor)).to(dtype)


def _rollout(
    old_log_prob: Tensor, rollout_log_prob: Tensor, m: Tensor, mb: Tensor, cfg: _Cfg
) -> tuple[Tensor, Tensor]:
    """(rho [B, T], state flags [B, T] uint8): verl's rollout-correction weights (mask included)."""
    lr = torch.where(mb, old_log_prob - rollout_log_prob, 0.0)
    if cfg.rollout_is == "sequence":
        lr = (lr * m).sum(dim=-1, keepdim=True)
    raw = torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * m
    if cfg.is_lower is None:
        rho = raw.clamp(max=cfg.is_upper)
        state = flag((raw > cfg.is_upper) & mb, TokenState.TIS_TRUNCATED)
    else:
        kept = (raw >= cfg.is_lower) & (raw <= cfg.is_upper)
        rho = torch.where(kept, raw, 0.0)
        state = flag(~kept & mb, TokenState.ICEPOP_ZEROED)
    return rho, state


def _ppo(a: Tensor, r: Tensor, cfg: _Cfg, dual: bool) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate: (-d pg / d log_prob, flags) for ratio ``r`` (gradient ``r``)."""
    pos, neg = a > 0, a < 0
    high = pos & (r > cfg.hi)
    low = neg & (r < cfg.lo)
    cut = high | low
    state = flag(high, TokenState.CLIPPED_HIGH) | flag(low, TokenState.CLIPPED_LOW)
    if dual:
        dc = neg & (r > cfg.clip_ratio_c)
        cut = cut | dc
        state = state | flag(dc, TokenState.DUAL_CLIPPED)
    return torch.where(cut, 0.0, a * r), state


@dataclass(frozen=True)
class _Tok:
    """What a verl loss's per-token gradient reads: the input, its config, the masked log-ratio
    ``d``, its clamped form and where it passed the clamp."""

    x: LossInput
    cfg: _Cfg
    m: Tensor
    mb: Tensor
    counts: Tensor
    d: Tensor
    rho: Tensor | None

    @property
    def big(self) -> Tensor:
        return self.d.abs() > SAFETY_BOUND

    @property
    def clamped(self) -> Tensor:
        return self.d.clamp(-SAFETY_BOUND, SAFETY_BOUND)


# A verl loss's per-token part: (g [B, T], states) with w = c * rho * g (``whole``: w itself).
TokenGrad = Callable[[_Tok], tuple[Tensor, Tensor]]
_KERNEL_LOSSES = {"vanilla": 0, "gpg": 1, "cispo": 2}
_KERNEL_MASKS = {torch.int64: 0, torch.bool: 1, torch.uint8: 1, torch.float64: 2}


def _verl(name: str, label: str, description: str, whole: bool = False) -> Callable[[TokenGrad], TokenGrad]:
    """Register verl's loss ``name`` (and its ``verl:`` alias): ``g`` gives its per-token gradient;
    the rollout correction, the aggregation and the compiled kernel are verl's for every loss
    (``whole``: ``g`` gives the weight itself, aggregation and correction included)."""

    def deco(g: TokenGrad) -> TokenGrad:
        def fn(x: LossInput, **params: Any) -> tuple[Tensor, Tensor]:
            cfg = _config(name, params)
            fast = _native_path(x, cfg)
            if fast is not None:
                return fast
            m = x.m
            mb = m != 0
            counts = m.sum(dim=-1)
            rho, rstate = (None, None)
            if cfg.rollout_is is not None:
                rho, rstate = _rollout(x.old_log_prob, x.rollout(), m, mb, cfg)
            t = _Tok(x, cfg, m, mb, counts, torch.where(mb, x.log_prob - x.old_log_prob, 0.0), rho)
            if whole:
                w, state = g(t)
            else:
                gw, state = g(t)
                c = _row_scale(x.shape(counts), cfg, x.dtype)[:, None] * m
                w = torch.where(mb, c * gw if rho is None else c * rho * gw, 0.0)
            if rstate is not None:
                state = state | rstate
            return w, torch.where(mb, state, 0)

        register_loss(
            name,
            label=label,
            description=description,
            params=VERL_PARAMS,
            trainer="verl",
            version=VERSION,
            needs_rollout=lambda p: p["rollout_is"] not in (None, "none"),
            aliases=(f"verl:{name}",),
        )(fn)
        return g

    return deco


@_verl("vanilla", "PPO (verl vanilla)", "PPO's clipped surrogate with dual clip; verl's default loss.")
def _vanilla(t: _Tok) -> tuple[Tensor, Tensor]:
    g, state = _ppo(t.x.advantages, torch.exp(t.clamped), t.cfg, dual=True)
    g = torch.where(t.big, 0.0, g)
    return g, state | flag(t.big & t.mb, TokenState.STABILITY_CLAMPED)


@_verl("gspo", "GSPO (verl)", "PPO's clip on the sequence's geometric-mean ratio.")
def _gspo(t: _Tok) -> tuple[Tensor, Tensor]:
    a = t.x.advantages
    s = (t.d * t.m).sum(dim=-1) / t.counts.clamp(min=1)
    capped = s > GSPO_LOG_CAP
    sr = torch.exp(s.clamp(max=GSPO_LOG_CAP))[:, None].expand_as(a)
    g, state = _ppo(a, sr, t.cfg, dual=False)
    g = torch.where(capped[:, None], 0.0, g)
    return g, state | flag(capped[:, None] & t.mb, TokenState.STABILITY_CLAMPED)


@_verl("cispo", "CISPO (verl)", "The clipped ratio as a stop-gradient weight: no token loses its gradient.")
def _cispo(t: _Tok) -> tuple[Tensor, Tensor]:
    r = torch.exp(t.clamped)
    g = t.x.advantages * r.clamp(t.cfg.lo, t.cfg.hi)
    state = flag((r > t.cfg.hi) & t.mb, TokenState.CLIPPED_HIGH) | flag(
        (r < t.cfg.lo) & t.mb, TokenState.CLIPPED_LOW
    )
    return g, state


@_verl(
    "geo_mean", "GMPO (verl geo_mean)", "The row's geometric-mean ratio, clipped in log space.", whole=True
)
def _geo_mean(t: _Tok) -> tuple[Tensor, Tensor]:
    """GMPO: the whole weight (verl averages the B row losses; ``agg`` is not used)."""
    a, d, m, mb, cfg, rho = t.x.advantages, t.d, t.m, t.mb, t.cfg, t.rho
    B = int(t.x.shape(t.counts).lengths.shape[0])
    pos, neg = a > 0, a < 0
    high = pos & (d > cfg.eps_high)
    low = neg & (d < -cfg.eps_low)
    # The clipped log-ratio that enters the row's geometric mean (0 where A = 0, as sign(A) = 0).
    dmin = torch.where(high, cfg.eps_high, torch.where(low, -cfg.eps_low, d))
    dmin = torch.where(mb & (a != 0), dmin, 0.0)
    denom = t.counts + 1e-8
    ratio = torch.exp((dmin * m).sum(dim=-1) / denom)
    adv = (torch.where(mb, a, 0.0) * m).sum(dim=-1) / denom
    row = adv * ratio / B
    if rho is not None:
        row = row * torch.exp((torch.log(rho + 1e-10) * m).sum(dim=-1) / denom)
    live = mb & (a != 0) & ~high & ~low
    w = torch.where(live, (row / denom)[:, None] * m, 0.0)
    return w, flag(high & mb, TokenState.CLIPPED_HIGH) | flag(low & mb, TokenState.CLIPPED_LOW)


@_verl("gpg", "GPG (verl)", "The plain policy gradient: A times the aggregation, no ratio.")
def _gpg(t: _Tok) -> tuple[Tensor, Tensor]:
    return t.x.advantages, t.x.zeros_state()


@_verl(
    "sapo",
    "SAPO (verl)",
    "A soft sigmoid gate instead of the clip; always seq-mean-token-mean in verl 0.9.1.",
)
def _sapo(t: _Tok) -> tuple[Tensor, Tensor]:
    a, cfg = t.x.advantages, t.cfg
    r = torch.exp(t.clamped)
    tau = torch.where(
        a > 0, torch.tensor(cfg.tau_pos, dtype=t.x.dtype), torch.tensor(cfg.tau_neg, dtype=t.x.dtype)
    )
    sig = torch.sigmoid(tau * (r - 1.0))
    g = torch.where(t.big, 0.0, a * (4.0 * sig * (1.0 - sig)) * r)
    return g, flag(t.big & t.mb, TokenState.STABILITY_CLAMPED)


@_verl("clip_cov", "Clip-Cov (verl)", "PPO plus zeroing a few high-covariance tokens (in expectation).")
def _clip_cov(t: _Tok) -> tuple[Tensor, Tensor]:
    a, lp, m, mb = t.x.advantages, t.x.log_prob, t.m, t.mb
    g, state = _ppo(a, torch.exp(t.d), t.cfg, dual=False)
    n = m.sum() + 1e-8
    a_mean = torch.where(mb, a, 0.0).mul(m).sum() / n
    lp_mean = torch.where(mb, lp, 0.0).mul(m).sum() / n
    cov = (a - a_mean) * (lp - lp_mean)
    cand = (cov > CLIP_COV_LB) & (cov < CLIP_COV_UB) & mb & (state == 0)
    n_cand = int(cand.sum().item())
    k = max(int(CLIP_COV_RATIO * float(m.sum().item())), 1)
    keep = 0.0 if n_cand <= k else 1.0 - k / n_cand
    return torch.where(cand, g * keep, g), state | flag(cand, TokenState.COV_SELECTED)


@_verl("kl_cov", "KL-Cov (verl)", "No clipping; a |d| penalty on the highest-covariance tokens.")
def _kl_cov(t: _Tok) -> tuple[Tensor, Tensor]:
    a, lp, mb = t.x.advantages, t.x.log_prob, t.mb
    top = torch.zeros_like(mb)
    flat = mb.reshape(-1)
    idx = torch.nonzero(flat, as_tuple=True)[0]
    if idx.numel():
        va, vl = a.reshape(-1)[idx], lp.reshape(-1)[idx]
        cov = (va - va.mean()) * (vl - vl.mean())
        k = max(1, int(idx.numel() * KL_COV_RATIO))
        top.view(-1)[idx[torch.topk(cov, k, largest=True).indices]] = True
    g = a * torch.exp(t.d) - torch.where(top, PPO_KL_COEF * torch.sign(t.d), 0.0)
    return g, flag(top, TokenState.COV_SELECTED)


def _native_path(x: LossInput, cfg: _Cfg) -> tuple[Tensor, Tensor] | None:
    """The compiled one-pass kernel (``estimators/_loss_native.c``) for vanilla, gpg and cispo on
    float64 CPU tensors, or None (the caller uses the torch path)."""
    kernel = native.loss_kernel()
    mask = x.mask
    mk = _KERNEL_MASKS.get(mask.dtype)
    if kernel is None or cfg.loss not in _KERNEL_LOSSES or mk is None or x.dtype != torch.float64:
        return None
    rlp = x.rollout_log_prob if cfg.rollout_is is not None else None
    tensors = (x.advantages, x.log_prob, x.old_log_prob, mask) if rlp is None else (
        x.advantages, x.log_prob, x.old_log_prob, mask, rlp
    )  # fmt: skip
    if any(t.device.type != "cpu" for t in tensors):
        return None
    B, T = x.advantages.shape
    m = mask.contiguous()
    m = m.view(torch.uint8) if m.dtype == torch.bool else m
    a, lp, olp = x.advantages.contiguous(), x.log_prob.contiguous(), x.old_log_prob.contiguous()
    counts = torch.empty(B, dtype=torch.float64)
    if B * T:
        kernel.row_counts(m.data_ptr(), counts.data_ptr(), B, T, mk)
    else:
        counts.zero_()
    scale = _row_scale(x.shape(counts), cfg, torch.float64).contiguous()
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
    return w, st
