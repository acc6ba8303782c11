"""The `loss_weights` row of an episode: each token's share of the policy gradient under a chosen
verl loss x aggregation x rollout correction (``estimators.loss_weights``), scaled to the
episode's batch, with the tokens whose weight was clipped or zeroed (docs/api.md).

The advantages are the trainer's own (``advantages`` uploaded) or else the first advantage row of
the view. ``log_prob = old_log_prob =`` the episode's ``logprobs`` (verl's first update of a step:
every PPO ratio is 1), or with ``bypass`` ``old_log_prob = rollout_logprobs`` (verl's bypass mode:
the PPO ratio is the training/rollout ratio). Without ``logprobs`` the ratio is 1 (the row shows
the aggregation alone). The rollout correction reads ``logprobs - rollout_logprobs``.

The weights of one episode are computed on its row alone with ``token-sum`` and multiplied by the
batch's aggregation factor from its policy lengths (``token-mean``: 1 / N tokens of the batch; the
sequence modes: 1 / S non-empty episodes, ...), which is exact for every loss but ``clip_cov`` and
``kl_cov``, whose selections are batch-wide (they are taken within the episode).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from app.core.errors import ApiError
from app.core.views import AGGS, LOSSES, ROLLOUT_IS

# TokenState bits (estimators/loss.py) -> (mark code, what the tooltip says).
STATE_MARKS = (
    (1, "loss_clipped_high", "ratio above 1 + clip_ratio_high with A > 0: clipped"),
    (2, "loss_clipped_low", "ratio below 1 - clip_ratio_low with A < 0: clipped"),
    (4, "loss_dual_clipped", "A < 0 and ratio above clip_ratio_c: dual-clipped"),
    (8, "loss_tis_truncated", "rollout-correction weight truncated at the threshold (TIS)"),
    (16, "loss_icepop_zeroed", "rollout-correction weight outside [lo, hi]: zeroed (IcePop)"),
    (32, "loss_cov_selected", "selected by Clip-Cov / KL-Cov"),
    (64, "loss_stability_clamped", "log-ratio past verl's clamp: no gradient"),
)


@dataclass(frozen=True)
class LossParams:
    """The view's loss x aggregation x correction (the URL's `loss`, `agg`, `rollout_is`,
    `rollout_is_threshold`, `bypass`)."""

    loss: str = "vanilla"
    agg: str = "token-mean"
    rollout_is: str = "none"
    rollout_is_threshold: str = "2"
    bypass: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "loss": self.loss,
            "agg": self.agg,
            "rollout_is": self.rollout_is,
            "rollout_is_threshold": self.rollout_is_threshold,
            "bypass": self.bypass,
        }


def _bad(field: str, message: str) -> ApiError:
    return ApiError(422, "bad_parameter", message, field=field)


def threshold_value(raw: str) -> float | str:
    """The threshold as estimators.loss_weights takes it: a number (TIS) or "lo_hi" (IcePop)."""
    s = raw.strip()
    if "_" in s:
        lo, _, hi = s.partition("_")
        try:
            a, b = float(lo), float(hi)
        except ValueError:
            a = b = math.nan
        if not (math.isfinite(a) and math.isfinite(b) and 0 < a <= b):
            raise _bad(
                "rollout_is_threshold",
                f"`rollout_is_threshold` {raw!r}: write lo_hi with 0 < lo <= hi (IcePop).",
            )
        return s
    try:
        x = float(s)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise _bad(
            "rollout_is_threshold",
            f"`rollout_is_threshold` {raw!r}: a positive number (TIS) or lo_hi (IcePop).",
        )
    return x


def parse(loss: str, agg: str, rollout_is: str, rollout_is_threshold: str, bypass: bool) -> LossParams:
    """LossParams, or a 422 naming the parameter."""
    for name, value, allowed in (
        ("loss", loss, LOSSES),
        ("agg", agg, AGGS),
        ("rollout_is", rollout_is, ROLLOUT_IS),
    ):
        if value not in allowed:
            raise _bad(name, f"parameter `{name}` is {value!r}; choose one of {', '.join(allowed)}.")
    threshold_value(rollout_is_threshold)
    return LossParams(loss, agg, rollout_is, rollout_is_threshold.strip(), bool(bypass))


def batch_factor(params: LossParams, lengths: np.ndarray, own: int, T: int) -> float:
    """Multiplier from the episode-alone ``token-sum`` weights to the batch's aggregation."""
    S = int((lengths > 0).sum()) or 1
    if params.loss == "geo_mean":  # verl averages the B row losses whatever the aggregation
        return 1.0 / max(len(lengths), 1)
    agg = "seq-mean-token-mean" if params.loss == "sapo" else params.agg
    if agg == "token-sum":
        return 1.0
    if agg == "token-mean":
        return 1.0 / max(float(lengths.sum()), 1.0)
    if agg == "seq-mean-token-sum":
        return 1.0 / S
    if agg == "seq-mean-token-sum-norm":
        return 1.0 / (S * T)
    return 1.0 / S  # seq-mean-token-mean: its 1 / L is in the episode-alone weights


def episode_loss_weights(
    advantages: np.ndarray,
    policy: np.ndarray,
    logprobs: np.ndarray | None,
    rollout_logprobs: np.ndarray | None,
    params: LossParams,
    lengths: np.ndarray | None,
    horizon: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """([T] weights, [T] uint8 TokenState flags) of one episode; ``lengths`` the batch's [B] policy
    lengths (None: the episode is its own batch); ``horizon`` T for ``seq-mean-token-sum-norm``
    (the batch's longest episode; default this one's length)."""
    from estimators import loss_weights_and_states

    T = len(policy)
    if params.rollout_is != "none" and (logprobs is None or rollout_logprobs is None):
        raise ApiError(
            422,
            "no_logprobs",
            f"rollout_is={params.rollout_is} needs the episode's `logprobs` and `rollout_logprobs`.",
            field="rollout_is",
        )
    if params.bypass and (logprobs is None or rollout_logprobs is None):
        raise ApiError(
            422,
            "no_logprobs",
            "bypass needs the episode's `logprobs` and `rollout_logprobs`.",
            field="bypass",
        )

    def row(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.nan_to_num(np.asarray(x, dtype=np.float64)))[None]

    lp = row(logprobs) if logprobs is not None else torch.zeros(1, T, dtype=torch.float64)
    old = row(rollout_logprobs) if params.bypass and rollout_logprobs is not None else lp
    rollout = None if rollout_logprobs is None else row(rollout_logprobs)
    mask = torch.from_numpy(policy.astype(bool))[None]
    # On the row alone: token-sum, or the aggregation whose per-row factor (1 / L) it needs.
    alone = (
        params.agg
        if params.agg == "seq-mean-token-mean" or params.loss in ("sapo", "geo_mean")
        else "token-sum"
    )
    w, states = loss_weights_and_states(
        row(np.where(policy, advantages, 0.0)),
        lp,
        old,
        mask,
        loss=params.loss,
        agg=alone,
        rollout_log_prob=rollout,
        rollout_is=None if params.rollout_is == "none" else params.rollout_is,
        rollout_is_threshold=threshold_value(params.rollout_is_threshold),
    )
    n = int(policy.sum())
    lens = lengths if lengths is not None else np.array([n])
    factor = batch_factor(params, lens, n, horizon or T)
    return w[0].numpy() * factor, states[0].numpy()


@dataclass(frozen=True)
class Removed:
    """One episode's |A| mass on policy tokens, the part whose weight is 0 by clipping and by
    masking, its policy tokens and sum |w| (the weights it was computed with)."""

    length: int
    abs_advantage: float
    abs_clipped: float
    abs_masked: float
    abs_weight: float

    @property
    def weight_per_abs_advantage(self) -> float | None:
        """sum |w| / sum |A| over the policy tokens (the per-token loss weight per unit |A| that
        shows an aggregation's length bias); None without any |A|."""
        return self.abs_weight / self.abs_advantage if self.length > 0 and self.abs_advantage > 0 else None


def removed(advantages: np.ndarray, policy: np.ndarray, w: np.ndarray, states: np.ndarray) -> Removed:
    """The :class:`Removed` of one episode's weights ``w`` and TokenState flags ``states``: a
    policy token with A != 0 and w == 0 is clipped when a clip bit is set, else masked when the
    IcePop bit is (the TokenState groups ``estimators.loss.CLIPPING`` and ``ICEPOP_ZEROED``)."""
    from estimators.loss import CLIPPING, TokenState

    a = np.abs(np.where(policy, np.nan_to_num(advantages), 0.0))
    zero = policy & (a != 0) & (w == 0)
    clipped = zero & ((states & int(CLIPPING)) != 0)
    masked = zero & ~clipped & ((states & int(TokenState.ICEPOP_ZEROED)) != 0)
    return Removed(
        int(policy.sum()),
        float(a.sum()),
        float(a[clipped].sum()),
        float(a[masked].sum()),
        float(np.abs(np.where(policy, w, 0.0)).sum()),
    )


# A run step's clipping metric (app/core/metrics.py): verl's vanilla PPO in bypass mode, per token.
STEP_CLIP = LossParams(agg="token-sum", bypass=True)


def episode_removed(
    advantages: np.ndarray, policy: np.ndarray, logprobs: np.ndarray, rollout_logprobs: np.ndarray
) -> Removed:
    """One episode's |A| removed by clipping (:data:`STEP_CLIP`, the ratio exp(logprobs -
    rollout_logprobs)) and by masking (token-level IcePop with the window
    :data:`app.core.metrics.STEP_LOSS_ICEPOP`); ``abs_weight`` of the clipping weights (per token,
    ``token-sum``: the aggregation's constant factor left out)."""
    from app.core.metrics import STEP_LOSS_ICEPOP

    policy = np.asarray(policy, dtype=bool)
    w, st = episode_loss_weights(advantages, policy, logprobs, rollout_logprobs, STEP_CLIP, None)
    clip = removed(advantages, policy, w, st)
    mask_params = LossParams(agg="token-sum", rollout_is="token", rollout_is_threshold=STEP_LOSS_ICEPOP)
    w2, st2 = episode_loss_weights(advantages, policy, logprobs, rollout_logprobs, mask_params, None)
    mask = removed(advantages, policy, w2, st2)
    return Removed(clip.length, clip.abs_advantage, clip.abs_clipped, mask.abs_masked, clip.abs_weight)


# Cells of one padded block of :func:`episodes_removed` (8 MB per float64 array).
REMOVED_BLOCK_CELLS = 1 << 20


def episodes_removed(
    episodes: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
) -> list[Removed]:
    """:func:`episode_removed` of many episodes ``(advantages, policy, logprobs, rollout_logprobs)``,
    equal to it bit for bit: the weights of both of its losses are per token (``token-sum``, no
    factor between rows), so the episodes are padded into blocks of at most
    :data:`REMOVED_BLOCK_CELLS` cells (padding masked out) and each block is one kernel call,
    not two per episode; the sums are then taken per episode on its own tokens, as there."""
    from app.core.metrics import STEP_LOSS_ICEPOP
    from estimators import loss_weights_and_states

    out: list[Removed] = []
    start = 0
    while start < len(episodes):
        T = len(episodes[start][1])
        stop = start + 1
        while (
            stop < len(episodes)
            and (stop - start + 1) * max(T, len(episodes[stop][1])) <= REMOVED_BLOCK_CELLS
        ):
            T = max(T, len(episodes[stop][1]))
            stop += 1
        block = episodes[start:stop]
        B = len(block)
        a, lp, rlp = (np.zeros((B, T)) for _ in range(3))
        mask = np.zeros((B, T), dtype=bool)
        for i, (adv, policy, logp, roll) in enumerate(block):
            pol = np.asarray(policy, dtype=bool)
            n = len(pol)
            mask[i, :n] = pol
            a[i, :n] = np.nan_to_num(np.where(pol, np.asarray(adv, dtype=np.float64), 0.0))
            lp[i, :n] = np.nan_to_num(np.asarray(logp, dtype=np.float64))
            rlp[i, :n] = np.nan_to_num(np.asarray(roll, dtype=np.float64))
        ta, tlp, trlp, tm = (torch.from_numpy(x) for x in (a, lp, rlp, mask))
        common = dict(loss=STEP_CLIP.loss, agg="token-sum", rollout_log_prob=trlp)
        w1, st1 = loss_weights_and_states(
            ta, tlp, trlp, tm, **common, rollout_is=None,
            rollout_is_threshold=threshold_value(STEP_CLIP.rollout_is_threshold),
        )  # fmt: skip
        w2, st2 = loss_weights_and_states(
            ta,
            tlp,
            tlp,
            tm,
            **common,
            rollout_is="token",
            rollout_is_threshold=threshold_value(STEP_LOSS_ICEPOP),
        )
        w1, st1, w2, st2 = (x.numpy() for x in (w1, st1, w2, st2))
        for i, (adv, policy, _logp, _roll) in enumerate(block):
            pol = np.asarray(policy, dtype=bool)
            n = len(pol)
            clip = removed(adv, pol, w1[i, :n], st1[i, :n])
            mask_r = removed(adv, pol, w2[i, :n], st2[i, :n])
            out.append(
                Removed(clip.length, clip.abs_advantage, clip.abs_clipped, mask_r.abs_masked, clip.abs_weight)
            )
        start = stop
    return out


def marks(states: np.ndarray, zeroing_only: bool = False) -> list[dict[str, Any]]:
    """Finding-style marks (code, severity info, message, positions) for the flagged tokens."""
    out = []
    for bit, code, message in STATE_MARKS:
        pos = np.flatnonzero(states & bit)
        if len(pos):
            out.append({"code": code, "severity": "info", "message": message, "positions": pos.tolist()})
    return out


def call_shares(
    weights: np.ndarray, turns: list[dict[str, Any]], turn_ids: np.ndarray, policy: np.ndarray
) -> None:
    """Each call's share of the episode's |weight| (turns[k]["loss_share"], in place)."""
    idx = np.flatnonzero(policy)
    total = float(np.abs(weights[idx]).sum())
    if not len(idx):
        return
    K = int(turn_ids[idx].max()) + 1
    per = np.bincount(turn_ids[idx], weights=np.abs(weights[idx]), minlength=K)
    for t in turns:
        t["loss_share"] = float(per[t["turn"]] / total) if total > 0 else 0.0


def batch_loss(
    episodes: list[tuple[str, str | None, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray | None]],
    params: LossParams,
) -> dict[str, Any]:
    """GET /api/batches/{id}/loss: per episode (slug, group, advantages [T], policy [T] bool,
    logprobs, rollout_logprobs) its policy length, ``weight_sum`` (sum of w over its tokens) and
    ``weight_per_abs_advantage`` (sum |w| / sum |A| over its policy tokens: its per-token weight
    per unit advantage, which shows an aggregation's length bias), and over the batch the shares
    of |A| removed by clipping and by rollout-correction masking and the length-bias slope."""
    from app.core import metrics

    lengths = np.array([int(e[3].sum()) for e in episodes], dtype=np.int64)
    horizon = max((len(e[3]) for e in episodes), default=1)
    has_lp = bool(episodes) and all(e[4] is not None for e in episodes)
    rows, tot = [], np.zeros(3)
    xs, ys = [], []
    for slug, group, adv, policy, lp, rlp in episodes:
        w, st = episode_loss_weights(adv, policy, lp if has_lp else None, rlp, params, lengths, horizon)
        r = removed(adv, policy, w, st)
        tot += (r.abs_advantage, r.abs_clipped, r.abs_masked)
        y = r.weight_per_abs_advantage
        if y is not None:
            xs.append(float(r.length))
            ys.append(y)
        rows.append(
            {
                "slug": slug,
                "group": group,
                "length": r.length,
                "weight_sum": float(np.where(policy, w, 0.0).sum()),
                "weight_per_abs_advantage": y,
            }
        )
    return {
        **params.as_dict(),
        "has_logprobs": has_lp,
        "ratio_from": "logprobs" if has_lp else "none (ratio 1: nothing clips)",
        "plotted": "weight_per_abs_advantage: sum |w| / sum |A| over each episode's policy tokens "
        "(its per-token loss weight per unit advantage) against its policy length",
        "episodes": rows,
        "abs_advantage": float(tot[0]),
        "clipped_share": metrics.removed_share(tot[1], tot[0]),
        "masked_share": metrics.removed_share(tot[2], tot[0]),
        "length_bias_slope": metrics.length_bias_slope(xs, ys),
    }
