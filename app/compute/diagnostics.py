"""Batch diagnostics: per-group statistics, zero-variance groups, the reward histogram, batch
whitening vs group centering and, when episodes carry ``meta.calls``, where the positive outcome
credit of successful episodes lands. Each number is defined once, in app/core/metrics.py (pass
rate, zero-variance shares, credit by effect, useless credit), on the rules of app/core/domain.py.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, TypedDict

import numpy as np

from app.compute.batch import outcome_advantages
from app.core import domain, metrics
from app.core.arrays import json_loads
from app.core.schemas import EpisodeSummary

# What batch_diagnostics may raise on extreme scores: the batch is stored all the same, without them.
DIAGNOSTICS_ERRORS = (ValueError, FloatingPointError, OverflowError)

# slug -> (kinds [T] uint8, turn ids [T] int32) of the episodes with ``meta.calls``.
TurnData = dict[str, tuple[np.ndarray, np.ndarray]]


class Histogram(TypedDict):
    """Bin edges [bins + 1] and counts [bins] (empty: no finite score)."""

    edges: list[float]
    counts: list[int]


class GroupStats(TypedDict):
    """One group of a batch (``group`` None: an ungrouped episode's group of its own)."""

    group: str | None
    n: int
    mean_reward: float
    pass_rate: float | None
    zero_variance: bool


class CreditShares(TypedDict):
    """Where the positive outcome credit lands (:func:`credit_by_effect`)."""

    useless_credit_share: float | None
    useless_credit_share_per_call: float | None
    credit_by_effect: dict[str, metrics.EffectCredit] | None


class Diagnostics(TypedDict):
    """A batch's diagnostics (:func:`batch_diagnostics`), as the batch API answers them."""

    groups: list[GroupStats]
    zero_variance_groups: list[str | None]
    zero_variance_share: float | None
    zero_variance_all_pass_share: float | None
    zero_variance_all_fail_share: float | None
    pass_rate: float | None
    reward_histogram: Histogram
    whiten_vs_center: dict[str, Any]
    useless_credit_share: float | None
    useless_credit_share_per_call: float | None
    credit_by_effect: dict[str, metrics.EffectCredit] | None
    drift_episode_share: float | None
    drift_token_share: float | None


def histogram(scores: np.ndarray, bins: int = 10) -> Histogram:
    """{"edges": [bins+1], "counts": [bins]} over the scores (one bin when all are equal)."""
    # Sums of huge rewards can overflow to +-inf: those scores have no bin (but count in ``n``).
    scores = scores[np.isfinite(scores)]
    if len(scores) == 0:
        return {"edges": [], "counts": []}
    lo, hi = float(scores.min()), float(scores.max())
    if hi - lo < domain.ZERO_VARIANCE_TOL:
        return {"edges": [lo, hi], "counts": [len(scores)]}
    try:
        counts, edges = np.histogram(scores, bins=bins, range=(lo, hi))
    except ValueError:  # a range too wide for float64 bin widths (hi - lo overflows)
        return {"edges": [lo, hi], "counts": [len(scores)]}
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def batch_diagnostics(
    rows: list[EpisodeSummary], turn_data: TurnData | None = None, policy_tokens: int | None = None
) -> Diagnostics:
    """Diagnostics of one batch.

    turn_data: slug -> (kinds [T] uint8, turn_ids [T] int32) for episodes with ``meta.calls``
    (None: the credit-by-effect figures are null). policy_tokens: the batch's policy tokens, the
    denominator of ``drift_token_share`` (None: that share is null when some episode drifts)."""
    slugs = [r.slug for r in rows]
    labels = [r.group for r in rows]
    scores = np.array([r.score for r in rows], dtype=np.float64)
    passes = [bool(r.passed) for r in rows]
    passed = np.array(passes)
    groups = domain.groups(labels)
    zv = metrics.zero_variance(scores, labels, passes)
    group_stats: list[GroupStats] = [
        {
            "group": domain.group_label(key),
            "n": len(members),
            "mean_reward": float(scores[members].mean()),
            "pass_rate": metrics.pass_rate(passed[members]),
            "zero_variance": domain.zero_variance(scores[members]),
        }
        for key, members in groups.items()
    ]
    out: Diagnostics = {
        "groups": group_stats,
        "zero_variance_groups": [g.group for g in zv.groups],
        "zero_variance_share": zv.share,
        "zero_variance_all_pass_share": zv.all_pass_share,
        "zero_variance_all_fail_share": zv.all_fail_share,
        "pass_rate": metrics.pass_rate(passed),
        "reward_histogram": histogram(scores),
        "whiten_vs_center": whiten_vs_center(slugs, labels, scores, passed, groups),
        "useless_credit_share": None,
        "useless_credit_share_per_call": None,
        "credit_by_effect": None,
        "drift_episode_share": None,
        "drift_token_share": None,
    }
    drifted = [
        metrics.drift_tokens(json_loads(r.meta_json).get("drift")) for r in rows if '"drift"' in r.meta_json
    ]
    out["drift_episode_share"], out["drift_token_share"] = metrics.drift_shares(
        sum(1 for n in drifted if n), len(rows), sum(drifted), policy_tokens
    )
    if turn_data:
        shares = credit_by_effect(rows, scores, passed, labels, turn_data)
        if shares is not None:
            out["useless_credit_share"] = shares["useless_credit_share"]
            out["useless_credit_share_per_call"] = shares["useless_credit_share_per_call"]
            out["credit_by_effect"] = shares["credit_by_effect"]
    return out


def whiten_vs_center(
    slugs: Sequence[str],
    labels: Sequence[str | None],
    scores: np.ndarray,
    passed: np.ndarray,
    groups: dict[Hashable, list[int]],
) -> dict[str, Any]:
    """Per episode, the batch-whitened outcome advantage next to the group-centred one, and a
    summary: failures on never-solved tasks are pushed down under batch whitening but get exactly
    0 under group centering."""
    if len(scores) == 0:
        return {"episodes": [], "summary": "empty batch"}
    bw = outcome_advantages("batch_whiten", scores, labels)
    gc = outcome_advantages("group_mean", scores, labels)
    never = [
        k
        for k, m in groups.items()
        if len(m) >= 2 and not passed[m].any() and domain.group_label(k) is not None
    ]
    never_idx = [i for k in never for i in groups[k]]
    succ_idx = np.flatnonzero(passed)

    def mean(a: np.ndarray, idx: Sequence[int] | np.ndarray) -> float | None:
        return float(a[idx].mean()) if len(idx) else None

    res: dict[str, Any] = {
        "episodes": [
            {"slug": s, "group": g, "score": float(x), "batch_whiten": float(b), "group_center": float(c)}
            for s, g, x, b, c in zip(slugs, labels, scores, bw, gc, strict=True)
        ],
        "never_solved_groups": never,
        "never_solved_failures": {
            "n": len(never_idx),
            "mean_batch_whiten": mean(bw, never_idx),
            "mean_group_center": mean(gc, never_idx),
        },
        "successes": {
            "n": int(len(succ_idx)),
            "mean_batch_whiten": mean(bw, succ_idx),
            "mean_group_center": mean(gc, succ_idx),
        },
    }
    parts = []
    if never_idx:
        parts.append(
            f"Batch whitening pushes down the {len(never_idx)} failures on the {len(never)} never-solved "
            f"group(s) by {res['never_solved_failures']['mean_batch_whiten']:+.2f} on average, although no "
            "better attempt at those tasks exists in the batch; group centering gives them "
            f"{res['never_solved_failures']['mean_group_center']:+.2f}."
        )
    if len(succ_idx):
        parts.append(
            f"Successes get {res['successes']['mean_batch_whiten']:+.2f} on average under batch whitening and "
            f"{res['successes']['mean_group_center']:+.2f} under group centering."
        )
    res["summary"] = " ".join(parts) or "No never-solved groups and no successes in this batch."
    return res


def credit_by_effect(
    rows: list[EpisodeSummary],
    scores: np.ndarray,
    passed: np.ndarray,
    labels: Sequence[str | None],
    turn_data: TurnData,
) -> CreditShares | None:
    """Where the RLOO outcome credit lands, by ``meta.calls[k].effect``
    (:func:`app.core.metrics.credit_by_effect` over the episodes in ``turn_data``), and the
    useless-credit shares of it (None when no episode's calls describe its turns)."""
    rloo = outcome_advantages("rloo", scores, labels)
    eps = []
    for i, r in enumerate(rows):
        if r.slug not in turn_data:
            continue
        kinds, tids = turn_data[r.slug]
        calls = json_loads(r.meta_json).get("calls")
        c = metrics.call_credit(calls, tids, kinds == domain.POLICY, bool(passed[i]), float(rloo[i]))
        if c is not None:
            eps.append(c)
    by = metrics.credit_by_effect(eps)
    if not by:
        return None
    share, per_call = metrics.useless_credit(by)
    return {"useless_credit_share": share, "useless_credit_share_per_call": per_call, "credit_by_effect": by}


GROUP_DETAIL_BASELINES = ("rloo", "grpo", "dr_grpo", "group_mean", "batch_whiten")


def group_detail(
    rows: list[EpisodeSummary], group: str, advantages: dict[str, np.ndarray] | None = None
) -> dict[str, Any] | None:
    """GET /api/batches/{id}/groups/{group}: each member's outcome advantage under the five
    baselines (batch_whiten over the whole batch), whether the group has zero variance, and why.

    ``advantages`` None: ``rows`` is the whole batch. Otherwise ``rows`` are the group's members
    and ``advantages[name]`` their advantages (the batch's memoised ones, app/storage/batch_cache.py)."""
    if advantages is None:
        labels = [r.group for r in rows]
        all_scores = np.array([r.score for r in rows], dtype=np.float64)
        idx = [i for i, g in enumerate(labels) if g == group]
        advantages = {
            name: outcome_advantages(name, all_scores, labels)[idx] for name in GROUP_DETAIL_BASELINES
        }
        rows = [rows[i] for i in idx]
    if not rows:
        return None
    members = list(range(len(rows)))
    scores = np.array([r.score for r in rows], dtype=np.float64)
    advs = advantages
    s = scores[members]
    zero_var = domain.zero_variance(s)
    why = None
    if zero_var:
        verdict = (
            "passed"
            if all(rows[i].passed for i in members)
            else ("failed" if not any(rows[i].passed for i in members) else "tied")
        )
        why = (
            f"All {len(members)} attempts scored {s[0]:g} (all {verdict}): every group baseline equals each "
            "attempt's own score, so RLOO, GRPO, Dr. GRPO and the group mean give every attempt advantage 0 "
            "and this group carries no gradient. Only batch whitening, which compares with other tasks, moves them."
        )
    elif len(members) == 1:
        why = "A group of one has no other attempt to compare with; group baselines cannot say whether it was good."
    return {
        "group": group,
        "episodes": [
            {
                "slug": rows[i].slug,
                "reward": rows[i].reward if rows[i].reward is not None else float(scores[i]),
                "score": float(scores[i]),
                "passed": bool(rows[i].passed),
                "advantages": {name: float(a[i]) for name, a in advs.items()},
            }
            for i in members
        ],
        "zero_variance": zero_var,
        "why": why,
    }
