"""SkyRL 0.3.0's policy losses (``skyrl/backends/skyrl_train/utils/ppo_utils.py``,
``PolicyLossRegistry``) as ``skyrl:<policy_loss_type>``: ``regular`` (the default), ``dual_clip``,
``gspo``, ``cispo``, ``rollout_is``, ``clip_cov``, ``kl_cov``, ``sapo``, ``cross_entropy``,
``importance_sampling``, ``dppo``, each with ``loss_reduction`` and its ``AlgorithmConfig``
parameters at SkyRL's defaults.

SkyRL sums the token losses over the loss mask and puts the reduction into the advantages first
(``apply_loss_reduction_to_advantages_minibatch``: ``A' = s_i A``): ``token_mean`` ``s = 1 /
max(N, 1)``; ``sequence_mean`` ``1 / (B max(L_i, 1))``; ``seq_mean_token_sum_norm`` ``1 / (B
max_seq_len)`` (SkyRL requires it set; None here is the batch's padded length);
``prompt_mean`` ``1 / (P max(N_p, 1))`` over the P prompt groups (the batch's groups; N_p a group's
tokens); ``token_mean_legacy`` ``1 / (N_mb * n_mb)`` per micro-batch of
``micro_train_batch_size_per_gpu`` rows (rows past the last whole one get 0). B counts every row of
the mini-batch (this batch), empty ones too.

With ``d = log_prob - old_log_prob`` and ``r`` the ratio: ``regular`` ``-min(r A', clip(r, 1 -
eps_clip_low, 1 + eps_clip_high) A')``; ``dual_clip`` the same, ``A' < 0`` tokens floored at
``-clip_ratio_c A'``; ``gspo`` the same on ``exp(min(s_i, 10))``, ``s_i`` the row's mean log-ratio,
as a per-token ratio (the GSPO-token form: the gradient stays on its token); ``cispo`` ``-A'
clip(r, 1 - cispo_eps_clip_low, 1 + cispo_eps_clip_high) log_prob`` with a stop-gradient weight
(by default ``clip(r, 1, 6)``: a ratio below 1 weighs 1); ``rollout_is`` ``-A' r_roll log_prob``,
``r_roll = exp(log_prob - rollout_log_prob)`` kept inside ``(1 - eps_clip_low, 1 + eps_clip_high)``
and 0 outside; ``sapo`` ``-(4 / tau) sigmoid(tau (r - 1)) A'``; ``dppo`` ``-r A'`` with the ratio
against the rollout when the batch has rollout log-probs, zeroed where the probability moved past
``delta_high`` (A > 0) or ``delta_low`` (A < 0) (``binary_tv``; ``binary_kl`` by the binary KL);
``clip_cov`` PPO's ``max`` of the two losses and ``max(1, int(clip_ratio N))`` random tokens of
covariance in ``(clip_cov_lb, clip_cov_ub)`` zeroed (exact when there are no more candidates than
that, else each candidate at its expectation ``1 - k / n``, as verl's ``clip_cov``); ``kl_cov`` ``-r
A'`` plus ``ppo_kl_coef |d|`` (not scaled by the reduction) on the ``max(1, int(kl_cov_frac N))``
tokens of largest covariance; ``cross_entropy`` ``-log_prob`` on every loss token (no advantage, no
reduction: the weight is 1); ``importance_sampling`` ``-r A'`` (no clip).

The ratio is ``exp(clamp(d, -20, 20))`` computed in float32 (SkyRL's ``safe_exp_delta``) for
``regular``, ``dual_clip``, ``cispo``, ``rollout_is`` and ``dppo``, as here; ``exp(d)`` in the
input's dtype for ``clip_cov``, ``kl_cov`` and ``importance_sampling``; ``sapo`` clamps ``d`` first.

The off-policy correction (``off_policy_correction``; ``regular``, ``dual_clip``, ``gspo``,
``cispo``, ``rollout_is``, ``sapo``, ``dppo``), from ``old_log_prob - rollout_log_prob``, in
SkyRL's order: a token mask (``token_mask_is_threshold_low`` and ``_high`` both set: tokens whose
ratio is outside are dropped), truncated importance sampling (``tis_ratio_type`` ``token``: the
token ratio capped at ``token_tis_ratio_clip_high``; ``sequence``: the row's product capped at
``sequence_tis_ratio_clip_high``), a sequence mask (``sequence_mask_metric`` ``geometric``: the
row's geometric-mean ratio outside ``[geo_mask_low, geo_mask_high]`` drops the row; ``product``:
its product outside ``[product_mask_low, product_mask_high]``). Left out: the outlier token mask,
and the KL and entropy terms SkyRL adds outside the policy loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from .core import SAFETY_BOUND, LossInput, TokenState, flag
from .registry import LossParam, register_loss

VERSION = "0.3.0"
REDUCTIONS = ("token_mean", "token_mean_legacy", "sequence_mean", "seq_mean_token_sum_norm", "prompt_mean")

_REDUCTION = (
    LossParam("loss_reduction", "token_mean", "choice", "how the token losses are reduced", REDUCTIONS, True),
    LossParam("micro_train_batch_size_per_gpu", 1, "int", "rows per micro-batch (token_mean_legacy)"),
    LossParam(
        "max_seq_len", None, "optional_float", "seq_mean_token_sum_norm's constant (None: the padded T)"
    ),
)
_EPS = (
    LossParam("eps_clip_low", 0.2, "float", "the clip range below 1"),
    LossParam("eps_clip_high", 0.2, "float", "the clip range above 1"),
)
_CORRECTION = (
    LossParam(
        "tis_ratio_type", "none", "choice", "truncated importance sampling: none, per token, per sequence",
        ("none", "token", "sequence"), True,
    ),
    LossParam("token_tis_ratio_clip_high", 2.0, "float", "token TIS's cap"),
    LossParam("sequence_tis_ratio_clip_high", 5.0, "float", "sequence TIS's cap"),
    LossParam(
        "sequence_mask_metric", "none", "choice", "drop rows by their ratio: none, geometric mean, product",
        ("none", "geometric", "product"), True,
    ),
    LossParam("geo_mask_low", 0.99, "float", "the geometric mask's lower bound"),
    LossParam("geo_mask_high", 1.01, "float", "the geometric mask's upper bound"),
    LossParam("product_mask_low", 0.5, "float", "the product mask's lower bound"),
    LossParam("product_mask_high", 2.0, "float", "the product mask's upper bound"),
    LossParam("token_mask_is_threshold_low", None, "optional_float", "drop tokens whose ratio is below (with _high)"),
    LossParam("token_mask_is_threshold_high", None, "optional_float", "drop tokens whose ratio is above (with _low)"),
)  # fmt: skip


def _correcting(p: dict[str, Any]) -> bool:
    """SkyRL's off_policy_correction_enabled (without the outlier mask)."""
    token_mask = (
        p.get("token_mask_is_threshold_low") is not None and p.get("token_mask_is_threshold_high") is not None
    )
    return (
        p.get("tis_ratio_type", "none") != "none"
        or p.get("sequence_mask_metric", "none") != "none"
        or token_mask
    )


def safe_exp(d: Tensor) -> Tensor:
    """SkyRL's ``safe_exp_delta``: ``exp(clamp(d, -20, 20))`` in float32, back in d's dtype."""
    return torch.clamp(d.to(torch.float32), -SAFETY_BOUND, SAFETY_BOUND).exp().to(d.dtype)


def _safe_exp_grad(d: Tensor, r: Tensor) -> Tensor:
    """d safe_exp(d) / d d: the ratio inside the clamp (bounds inclusive, on float32(d)), else 0."""
    d32 = d.to(torch.float32)
    return torch.where((d32 >= -SAFETY_BOUND) & (d32 <= SAFETY_BOUND), r, 0.0)


def _scale(x: LossInput, counts: Tensor, p: dict[str, Any]) -> Tensor:
    """[B] the reduction's factor s_i of the given rows (A' = s_i A), over the batch."""
    batch = x.shape(counts)
    lengths = batch.lengths.to(x.dtype)
    n_rows = int(lengths.shape[0])
    rows = batch.rows if batch.rows is not None else torch.arange(n_rows)
    red = p["loss_reduction"]
    if red == "token_mean":
        return (1.0 / lengths.sum().clamp(min=1.0)).expand(rows.shape[0])
    if red == "sequence_mean":
        return 1.0 / (n_rows * lengths[rows].clamp(min=1.0))
    if red == "seq_mean_token_sum_norm":
        T = float(batch.horizon if p["max_seq_len"] is None else p["max_seq_len"])
        return torch.full(rows.shape, 1.0 / (n_rows * T), dtype=x.dtype)
    if red == "prompt_mean":
        if batch.groups is None:
            raise ValueError(
                "loss_reduction='prompt_mean' needs the rows' prompt groups (batch=BatchShape(groups=...))"
            )
        gids, inverse = torch.unique(batch.groups, return_inverse=True)
        tokens: Tensor = torch.zeros(gids.shape[0], dtype=x.dtype).index_add_(0, inverse, lengths)
        per_row: Tensor = tokens[inverse[rows]].clamp(min=1.0)
        return torch.reciprocal(per_row * gids.shape[0])
    size = int(p["micro_train_batch_size_per_gpu"])  # token_mean_legacy
    if size < 1:
        raise ValueError(f"micro_train_batch_size_per_gpu must be >= 1, got {size}")
    n_mb = n_rows // size
    mb = rows // size
    per_mb = torch.zeros(max(n_mb, 1), dtype=x.dtype)
    if n_mb:
        per_mb = lengths[: n_mb * size].reshape(n_mb, size).sum(dim=-1)
    inside = mb < n_mb
    s = 1.0 / (per_mb[mb.clamp(max=max(n_mb - 1, 0))].clamp(min=1.0) * max(n_mb, 1))
    return torch.where(inside, s, 0.0)


def _correction(x: LossInput, m: Tensor, mb: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor, Tensor]:
    """(TIS weight [B, T] or [B, 1], the corrected mask, flags): SkyRL's compute_off_policy_correction."""
    ones = torch.ones(1, 1, dtype=x.dtype)
    state = x.zeros_state()
    if not _correcting(p):
        return ones, m, state
    lr = torch.where(mb, x.old_log_prob - x.rollout(), 0.0)
    if p["token_mask_is_threshold_low"] is not None and p["token_mask_is_threshold_high"] is not None:
        r = safe_exp(lr)
        inside = (r >= p["token_mask_is_threshold_low"]) & (r <= p["token_mask_is_threshold_high"])
        state = state | flag(~inside & (m > 0), TokenState.ICEPOP_ZEROED)
        m = m * (inside | (m == 0)).to(x.dtype)
    tis = ones
    if p["tis_ratio_type"] == "token":
        r = safe_exp(lr)
        cap = p["token_tis_ratio_clip_high"]
        state = state | flag((r > cap) & (m > 0), TokenState.TIS_TRUNCATED)
        tis = r.clamp(max=cap)
    elif p["tis_ratio_type"] == "sequence":
        r = safe_exp((lr * m).sum(dim=-1, keepdim=True))
        cap = p["sequence_tis_ratio_clip_high"]
        state = state | flag((r > cap) & (m > 0), TokenState.TIS_TRUNCATED)
        tis = r.clamp(max=cap)
    metric = p["sequence_mask_metric"]
    if metric != "none":
        total = (lr * m).sum(dim=-1, keepdim=True)
        if metric == "geometric":
            g = safe_exp(total / m.sum(dim=-1, keepdim=True).clamp(min=1.0))
            keep = (g <= p["geo_mask_high"]) & (g >= p["geo_mask_low"])
        else:
            g = safe_exp(total)
            keep = (g <= p["product_mask_high"]) & (g >= p["product_mask_low"])
        state = state | flag(~keep & (m > 0), TokenState.ICEPOP_ZEROED)
        m = m * keep.to(x.dtype)
    return tis, m, state


def _d_min(a: Tensor, r: Tensor, lo: float, hi: float) -> Tensor:
    """d/dr of ``min(r A, clip(r, lo, hi) A)`` as torch passes it (clamp inclusive, a tie half each)."""
    s1, s2 = r * a, r.clamp(lo, hi) * a
    g2 = torch.where((r >= lo) & (r <= hi), a, 0.0)
    return torch.where(s1 < s2, a, torch.where(s2 < s1, g2, (a + g2) / 2))


def _clip_states(a: Tensor, r: Tensor, mb: Tensor, lo: float, hi: float) -> Tensor:
    return flag(mb & (a > 0) & (r > hi), TokenState.CLIPPED_HIGH) | flag(
        mb & (a < 0) & (r < lo), TokenState.CLIPPED_LOW
    )


# A SkyRL loss's per-token part: (g, states) with -d(token loss)/d log_prob = g for advantages A'.
TokenGrad = Callable[[LossInput, Tensor, Tensor, dict[str, Any]], tuple[Tensor, Tensor]]


def _skyrl(
    name: str,
    description: str,
    params: tuple[LossParam, ...],
    corrected: bool = True,
    reads_rollout: bool = False,
) -> Callable[[TokenGrad], TokenGrad]:
    """Register SkyRL's loss ``name``: ``g(x, A', m, p)`` gives its per-token weight for the reduced
    advantages; the reduction, the off-policy correction (``corrected``) and the masked sum are
    SkyRL's for every loss."""

    def deco(g: TokenGrad) -> TokenGrad:
        def fn(x: LossInput, **p: Any) -> tuple[Tensor, Tensor]:
            m, mb = x.m, x.mb
            a = _scale(x, m.sum(dim=-1), p)[:, None] * x.advantages
            w, state = g(x, a, m, p)
            tis, m2, cstate = (
                _correction(x, m, mb, p) if corrected else (torch.ones(1, 1, dtype=x.dtype), m, state)
            )
            w = torch.where(mb, tis * m2 * w, 0.0)
            return w, torch.where(mb, state | cstate, 0)

        register_loss(
            f"skyrl:{name}",
            label=f"SkyRL {name}",
            description=description,
            params=_REDUCTION + params + (_CORRECTION if corrected else ()),
            trainer="skyrl",
            version=VERSION,
            needs_rollout=lambda p: reads_rollout or (corrected and _correcting(p)),
        )(fn)
        return g

    return deco


def _ppo(x: LossInput, a: Tensor, p: dict[str, Any], dual: float | None) -> tuple[Tensor, Tensor]:
    lo, hi = 1.0 - p["eps_clip_low"], 1.0 + p["eps_clip_high"]
    d = torch.where(x.mb, x.log_prob - x.old_log_prob, 0.0)
    r = safe_exp(d)
    dm = _d_min(a, r, lo, hi)
    state = _clip_states(a, r, x.mb, lo, hi)
    if dual is not None:  # SkyRL: min(-A' c, -min(...)) for A' < 0
        v, floor = torch.minimum(r * a, r.clamp(lo, hi) * a), dual * a
        dual_g = torch.where(v > floor, dm, torch.where(v < floor, 0.0, dm / 2))
        dm = torch.where(a < 0, dual_g, dm)
        state = state | flag(x.mb & (a < 0) & (v < floor), TokenState.DUAL_CLIPPED)
    big = (d.to(torch.float32).abs() > SAFETY_BOUND) & x.mb
    return dm * _safe_exp_grad(d, r), state | flag(big, TokenState.STABILITY_CLAMPED)


@_skyrl("regular", "PPO's clipped surrogate (SkyRL's default).", _EPS)
def _regular(x: LossInput, a: Tensor, _m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    return _ppo(x, a, p, None)


@_skyrl(
    "dual_clip",
    "PPO's clip with the dual clip for A < 0.",
    (*_EPS, LossParam("clip_ratio_c", 3.0, "float", "the dual clip's bound")),
)
def _dual_clip(x: LossInput, a: Tensor, _m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    return _ppo(x, a, p, p["clip_ratio_c"])


@_skyrl("gspo", "PPO's clip on the row's geometric-mean ratio, per token (GSPO-token).", _EPS)
def _gspo(x: LossInput, a: Tensor, m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    lo, hi = 1.0 - p["eps_clip_low"], 1.0 + p["eps_clip_high"]
    d = torch.where(x.mb, x.log_prob - x.old_log_prob, 0.0)
    s = (d * m).sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(min=1.0)
    r = torch.exp(s.clamp(max=10.0)).expand_as(d)
    g = torch.where(s <= 10.0, _d_min(a, r, lo, hi) * r, 0.0)
    capped = flag((s > 10.0).expand_as(d) & x.mb, TokenState.STABILITY_CLAMPED)
    return g, _clip_states(a, r, x.mb, lo, hi) | capped


@_skyrl(
    "cispo",
    "The ratio clipped to [1 - low, 1 + high] as a stop-gradient weight (by default [1, 6]).",
    (
        LossParam("cispo_eps_clip_low", 0.0, "float", "the weight's range below 1"),
        LossParam("cispo_eps_clip_high", 5.0, "float", "the weight's range above 1"),
    ),
)
def _cispo(x: LossInput, a: Tensor, _m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    lo, hi = 1.0 - p["cispo_eps_clip_low"], 1.0 + p["cispo_eps_clip_high"]
    r = safe_exp(torch.where(x.mb, x.log_prob - x.old_log_prob, 0.0))
    state = flag(x.mb & (r > hi), TokenState.CLIPPED_HIGH) | flag(x.mb & (r < lo), TokenState.CLIPPED_LOW)
    return a * r.clamp(lo, hi), state


@_skyrl(
    "rollout_is",
    "The training/rollout ratio as a stop-gradient weight, 0 outside (1 - low, 1 + high).",
    _EPS,
    reads_rollout=True,
)
def _rollout_is(x: LossInput, a: Tensor, _m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    lo, hi = 1.0 - p["eps_clip_low"], 1.0 + p["eps_clip_high"]
    r = safe_exp(torch.where(x.mb, x.log_prob - x.rollout(), 0.0))
    inside = (r > lo) & (r < hi)
    state = flag(x.mb & (r >= hi), TokenState.CLIPPED_HIGH) | flag(x.mb & (r <= lo), TokenState.CLIPPED_LOW)
    return torch.where(inside, r, 0.0) * a, state


@_skyrl(
    "sapo",
    "A soft sigmoid gate of the ratio instead of the clip.",
    (
        LossParam("tau_pos", 1.0, "float", "the gate's temperature for A > 0"),
        LossParam("tau_neg", 1.05, "float", "the gate's temperature for A <= 0"),
    ),
)
def _sapo(x: LossInput, a: Tensor, _m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    d = torch.where(x.mb, x.log_prob - x.old_log_prob, 0.0)
    r = torch.exp(d.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    pos, neg = (torch.tensor(float(p[k]), dtype=x.dtype) for k in ("tau_pos", "tau_neg"))
    tau = torch.where(a > 0, pos, neg)
    sig = torch.sigmoid(tau * (r - 1.0))
    inside = d.abs() <= SAFETY_BOUND
    return torch.where(inside, 4.0 * sig * (1.0 - sig) * a * r, 0.0), flag(
        ~inside & x.mb, TokenState.STABILITY_CLAMPED
    )


@_skyrl(
    "dppo",
    "The ratio (against the rollout when there) masked where the probability moved too far.",
    (
        LossParam(
            "dppo_type",
            "binary_tv",
            "choice",
            "the divergence: binary_tv or binary_kl",
            ("binary_tv", "binary_kl"),
        ),
        LossParam("delta_low", 0.2, "float", "the divergence bound for A < 0"),
        LossParam("delta_high", 0.2, "float", "the divergence bound for A > 0"),
    ),
)
def _dppo(x: LossInput, a: Tensor, _m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    mu = x.old_log_prob if x.rollout_log_prob is None else x.rollout_log_prob
    lp = torch.where(x.mb, x.log_prob, mu)
    d = lp - mu
    r = safe_exp(d)
    cur, mu_p = lp.exp(), mu.exp()
    diff = cur - mu_p
    if p["dppo_type"] == "binary_tv":
        cut = ((a > 0) & (diff > p["delta_high"])) | ((a < 0) & (-diff > p["delta_low"]))
    else:
        eps = 1e-8
        kl = mu_p * (mu - lp) + (1 - mu_p) * torch.log((1 - mu_p + eps) / (1 - cur + eps))
        cut = ((a > 0) & (diff > 0) & (kl > p["delta_high"])) | ((a < 0) & (diff < 0) & (kl > p["delta_low"]))
    state = flag(cut & x.mb & (a > 0), TokenState.CLIPPED_HIGH) | flag(
        cut & x.mb & (a < 0), TokenState.CLIPPED_LOW
    )
    return torch.where(cut, 0.0, a * _safe_exp_grad(d, r)), state


@_skyrl(
    "clip_cov",
    "PPO plus zeroing a few high-covariance tokens (in expectation).",
    (
        *_EPS,
        LossParam("clip_ratio", 0.0002, "float", "the share of tokens zeroed"),
        LossParam("clip_cov_lb", 1.0, "float", "the covariance's lower bound"),
        LossParam("clip_cov_ub", 5.0, "float", "the covariance's upper bound"),
    ),
    corrected=False,
)
def _clip_cov(x: LossInput, a: Tensor, m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    lo, hi = 1.0 - p["eps_clip_low"], 1.0 + p["eps_clip_high"]
    mb = x.mb
    lp = torch.where(mb, x.log_prob, 0.0)
    r = torch.exp(torch.where(mb, x.log_prob - x.old_log_prob, 0.0))
    pg1, pg2 = -a * r, -a * r.clamp(lo, hi)
    g2 = torch.where((r >= lo) & (r <= hi), a * r, 0.0)
    g = torch.where(pg1 > pg2, a * r, torch.where(pg2 > pg1, g2, (a * r + g2) / 2))  # -d max(pg1, pg2)
    clipped = (pg2 > pg1) & mb
    n = m.sum().clamp(min=1.0)
    cov = (a - (a * m).sum() / n) * (lp - (lp * m).sum() / n)
    cand = (cov < p["clip_cov_ub"]) & (cov > p["clip_cov_lb"]) & mb & ~clipped
    k = max(int(p["clip_ratio"] * float(m.sum().item())), 1)
    n_cand = int(cand.sum().item())
    keep = 0.0 if n_cand <= k else 1.0 - k / n_cand
    state = _clip_states(a, r, mb, lo, hi) | flag(cand, TokenState.COV_SELECTED)
    return torch.where(cand, g * keep, g), state


@_skyrl(
    "kl_cov",
    "No clipping; a |d| penalty on the tokens of largest covariance.",
    (
        LossParam("kl_cov_frac", 0.2, "float", "the share of tokens penalised"),
        LossParam("ppo_kl_coef", 1.0, "float", "the penalty's coefficient"),
    ),
    corrected=False,
)
def _kl_cov(x: LossInput, a: Tensor, _m: Tensor, p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    mb = x.mb
    d = torch.where(mb, x.log_prob - x.old_log_prob, 0.0)
    top = torch.zeros_like(mb)
    idx = torch.nonzero(mb.reshape(-1), as_tuple=True)[0]
    if idx.numel():
        va, vl = a.reshape(-1)[idx], x.log_prob.reshape(-1)[idx]
        cov = (va - va.mean()) * (vl - vl.mean())
        k = max(1, int(idx.numel() * p["kl_cov_frac"]))
        top.view(-1)[idx[torch.topk(cov, min(k, idx.numel()), largest=True).indices]] = True
    g = a * torch.exp(d) - torch.where(top, p["ppo_kl_coef"] * torch.sign(d), 0.0)
    return g, flag(top, TokenState.COV_SELECTED)


@_skyrl(
    "cross_entropy", "Supervised fine-tuning: -log_prob summed over the loss tokens.", (), corrected=False
)
def _cross_entropy(x: LossInput, a: Tensor, _m: Tensor, _p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    return torch.ones_like(a), x.zeros_state()


@_skyrl("importance_sampling", "The plain importance-weighted policy gradient, no clip.", (), corrected=False)
def _importance_sampling(x: LossInput, a: Tensor, _m: Tensor, _p: dict[str, Any]) -> tuple[Tensor, Tensor]:
    return a * torch.exp(torch.where(x.mb, x.log_prob - x.old_log_prob, 0.0)), x.zeros_state()
