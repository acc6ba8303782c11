"""The `loss_weights` row of an episode and the batch's loss view: each token's share of the policy
gradient under a registered loss with its parameters (``estimators.losses``: verl's loss x
aggregation x rollout correction, or another trainer's ``<trainer>:<loss>``), aggregated over the
episode's batch, with the tokens whose weight was clipped or zeroed (docs/api.md).

The advantages are the trainer's own (``advantages`` uploaded) or else the first advantage row of
the view. ``log_prob = old_log_prob =`` the episode's ``logprobs`` (verl's first update of a step:
every PPO ratio is 1), or with ``bypass`` ``old_log_prob = rollout_logprobs`` (verl's bypass mode:
the PPO ratio is the training/rollout ratio). Without ``logprobs`` the ratio is 1 (the row shows
the aggregation alone). The rollout correction reads ``logprobs - rollout_logprobs``. A token
where either log-prob is not a finite number has ratio 1 (app/compute/mismatch.py).

The weights of one episode are computed on its row alone, with the aggregation taken over its
batch (``estimators.losses.BatchShape``: the batch's policy lengths, padded length and groups;
``token-mean``: 1 / N tokens of the batch; the sequence modes: 1 / S non-empty episodes, ...),
which is exact for every loss but ``clip_cov`` and ``kl_cov``, whose selections are batch-wide
(they are taken within the episode).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from app.compute.mismatch import comparable
from app.core import domain
from app.core.errors import ApiError
from estimators.losses import DEFAULT_LOSS, BatchShape, LossSpec, TokenState, available_losses, get_loss

# TokenState bits -> (mark code, what the tooltip says).
STATE_MARKS = (
    (TokenState.CLIPPED_HIGH, "loss_clipped_high", "ratio above 1 + clip_ratio_high with A > 0: clipped"),
    (TokenState.CLIPPED_LOW, "loss_clipped_low", "ratio below 1 - clip_ratio_low with A < 0: clipped"),
    (TokenState.DUAL_CLIPPED, "loss_dual_clipped", "A < 0 and ratio above the dual-clip bound: dual-clipped"),
    (
        TokenState.TIS_TRUNCATED,
        "loss_tis_truncated",
        "rollout-correction weight truncated at the threshold (TIS)",
    ),
    (
        TokenState.ICEPOP_ZEROED,
        "loss_icepop_zeroed",
        "rollout-correction weight outside its window: zeroed (IcePop)",
    ),
    (TokenState.COV_SELECTED, "loss_cov_selected", "selected by Clip-Cov / KL-Cov"),
    (
        TokenState.STABILITY_CLAMPED,
        "loss_stability_clamped",
        "log-ratio past the trainer's clamp: no gradient",
    ),
)


def param_names() -> tuple[str, ...]:
    """Every parameter name some registered loss takes (the query keys the loss views read)."""
    return tuple(dict.fromkeys(p for s in available_losses().values() for p in s.params))


@dataclass(frozen=True)
class LossParams:
    """The view's loss (the URL's `loss`), the parameters given for it (checked values, the loss's
    defaults for the rest) and `bypass`."""

    loss: str = DEFAULT_LOSS
    given: tuple[tuple[str, Any], ...] = ()
    bypass: bool = False

    @property
    def spec(self) -> LossSpec:
        return get_loss(self.loss)

    @property
    def values(self) -> dict[str, Any]:
        """Every parameter of the loss: the given ones, the defaults for the rest."""
        return self.spec.resolve(dict(self.given))

    def as_dict(self) -> dict[str, Any]:
        """The loss, every parameter as the URL writes it, and bypass (the answer's echo)."""
        spec = self.spec
        texts = {n: spec.params[n].text(v) for n, v in self.values.items()}
        return {
            "loss": self.loss,
            **texts,
            "trainer": spec.trainer,
            "version": spec.version,
            "bypass": self.bypass,
        }

    def reads_rollout(self) -> bool:
        """True when the loss with these parameters reads the rollout log-probs."""
        return self.spec.needs_rollout(self.values)


def _bad(field: str, message: str) -> ApiError:
    return ApiError(422, "bad_parameter", message, field=field)


def parse(loss: str, given: dict[str, str], bypass: bool) -> LossParams:
    """LossParams from the query's text, or a 422 naming the parameter: an unknown loss (listing
    the known ones), a parameter the loss does not take (listing the ones it does), a bad value
    (saying what is allowed)."""
    losses = available_losses()
    if loss not in losses:
        raise _bad("loss", f"parameter `loss` is {loss!r}; choose one of {', '.join(losses)}.")
    spec = losses[loss]
    out: list[tuple[str, Any]] = []
    for name, text in given.items():
        if name not in spec.params:
            takes = ", ".join(spec.params) or "no parameters"
            raise _bad(name, f"loss {loss!r} takes no parameter `{name}`; it takes {takes}.")
        try:
            out.append((name, spec.params[name].parse(text)))
        except (TypeError, ValueError) as exc:
            raise _bad(name, f"parameter `{name}` is {text!r}: {exc}.") from None
    return LossParams(loss, tuple(out), bool(bypass))


def _rollout_field(params: LossParams) -> str:
    """The parameter that makes the loss read the rollout log-probs (``loss`` when it always does)."""
    spec, values = params.spec, params.values
    for name, p in spec.params.items():
        if p.control and not spec.needs_rollout({**values, name: p.default}):
            return name
    return "loss"


def episode_loss_weights(
    advantages: np.ndarray,
    policy: np.ndarray,
    logprobs: np.ndarray | None,
    rollout_logprobs: np.ndarray | None,
    params: LossParams,
    lengths: np.ndarray | None,
    horizon: int | None = None,
    index: int = 0,
    groups: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """([T] weights, [T] uint8 TokenState flags) of one episode, row ``index`` of a batch whose
    [B] policy lengths are ``lengths`` (None: the episode is its own batch), ``groups`` its [B]
    integer group ids (when the loss's aggregation reads them), ``horizon`` its padded T (the
    batch's longest episode; default this one's length): the loss's aggregation over that batch."""
    from estimators import loss_weights_and_states

    T = len(policy)
    if params.reads_rollout() and (logprobs is None or rollout_logprobs is None):
        field = _rollout_field(params)
        said = params.loss if field == "loss" else params.spec.params[field].text(params.values[field])
        raise ApiError(
            422,
            "no_logprobs",
            f"{field}={said} needs the episode's `logprobs` and `rollout_logprobs`.",
            field=field,
        )
    if params.bypass and (logprobs is None or rollout_logprobs is None):
        raise ApiError(
            422,
            "no_logprobs",
            "bypass needs the episode's `logprobs` and `rollout_logprobs`.",
            field="bypass",
        )

    if logprobs is not None and rollout_logprobs is not None:  # a position not compared: ratio 1
        logprobs, rollout_logprobs = comparable(logprobs, rollout_logprobs)

    def row(x: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.nan_to_num(np.asarray(x, dtype=np.float64)))[None]

    lp = row(logprobs) if logprobs is not None else torch.zeros(1, T, dtype=torch.float64)
    old = row(rollout_logprobs) if params.bypass and rollout_logprobs is not None else lp
    rollout = None if rollout_logprobs is None else row(rollout_logprobs)
    mask = torch.from_numpy(policy.astype(bool))[None]
    n = int(policy.sum())
    lens = np.asarray(lengths, dtype=np.float64) if lengths is not None else np.array([float(n)])
    batch = BatchShape(
        lengths=torch.from_numpy(lens),
        horizon=int(horizon or T),
        groups=None if groups is None else torch.from_numpy(np.asarray(groups, dtype=np.int64)),
        rows=torch.tensor([index if lengths is not None else 0]),
    )
    w, states = loss_weights_and_states(
        row(np.where(policy, advantages, 0.0)),
        lp,
        old,
        mask,
        loss=params.loss,
        rollout_log_prob=rollout,
        batch=batch,
        **dict(params.given),
    )
    return w[0].numpy(), states[0].numpy()


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
    from estimators.losses import CLIPPING

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
STEP_CLIP = LossParams(given=(("agg", "token-sum"),), bypass=True)


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
    mask_params = LossParams(
        given=(("agg", "token-sum"), ("rollout_is", "token"), ("rollout_is_threshold", STEP_LOSS_ICEPOP))
    )
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
            lp[i, :n], rlp[i, :n] = comparable(logp, roll)  # a position not compared: ratio 1
        ta, tlp, trlp, tm = (torch.from_numpy(x) for x in (a, lp, rlp, mask))
        tw1, ts1 = loss_weights_and_states(ta, tlp, trlp, tm, loss=STEP_CLIP.loss, **dict(STEP_CLIP.given))
        tw2, ts2 = loss_weights_and_states(
            ta, tlp, tlp, tm, loss=STEP_CLIP.loss, rollout_log_prob=trlp, agg="token-sum", rollout_is="token",
            rollout_is_threshold=STEP_LOSS_ICEPOP,
        )  # fmt: skip
        w1, st1, w2, st2 = (x.numpy() for x in (tw1, ts1, tw2, ts2))
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


def marks(states: np.ndarray) -> list[dict[str, Any]]:
    """Finding-style marks (code, severity info, message, positions) for the flagged tokens."""
    out = []
    for bit, code, message in STATE_MARKS:
        pos = np.flatnonzero(states & int(bit))
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
    gids = domain.group_ids([e[1] for e in episodes])
    for i, (slug, group, adv, policy, lp, rlp) in enumerate(episodes):
        w, st = episode_loss_weights(
            adv, policy, lp if has_lp else None, rlp, params, lengths, horizon, i, gids
        )
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
