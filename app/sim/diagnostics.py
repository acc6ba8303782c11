"""Batch diagnostics of sampled (or any meta.calls-annotated) episodes, with the definitions of
app/core/domain.py (score, pass, groups, zero variance, useless credit, oracle advantage).

- zero_variance_share: the share of episodes in zero-variance groups.
- useless_credit_share: :func:`app.core.domain.useless_credit_share` (the same number the batch page
  shows).
- credit_by_effect: per call effect, how many calls, their mean outcome (RLOO) advantage, their
  share of the positive credit, and (when meta.turn_values is present) the mean oracle turn
  advantage, which says what the call was really worth (:func:`app.core.metrics.credit_by_effect`,
  the same shape as the batch diagnostics').
"""

from __future__ import annotations

from typing import Any

import numpy as np

from app.compute.batch import outcome_advantages
from app.core import domain, metrics
from app.core.arrays import arrays_from_native
from app.core.schemas import EpisodeIn
from app.sim.policy import EFFECTS


def sim_diagnostics(episodes: list[EpisodeIn]) -> dict[str, Any]:
    """Diagnostics of a batch of native episodes (definitions: app/core/metrics.py).

    Returns {"n_episodes", "n_groups", "pass_rate", "mean_calls", "truncated_share",
    "zero_variance_share", "zero_variance_all_pass_share", "zero_variance_all_fail_share",
    "zero_variance_groups": [{"group", "n", "all"}], "useless_credit_share",
    "useless_credit_share_per_call", "credit_by_effect": {effect: {...}}} with credit_by_effect
    as :func:`app.core.metrics.credit_by_effect` (the batch diagnostics' shape).
    useless_credit_share and credit_by_effect are None when the episodes carry no meta.calls.
    """
    n = len(episodes)
    if n == 0:
        raise ValueError("no episodes")
    arrays = [arrays_from_native(ep) for ep in episodes]
    labels = [a.group for a in arrays]
    scores = np.array([a.score for a in arrays])
    passed = [domain.passed(a.reward, s) for a, s in zip(arrays, scores, strict=True)]
    adv = outcome_advantages("rloo", scores, labels).tolist()
    zv = metrics.zero_variance(scores, labels, passed)
    out: dict[str, Any] = {
        "n_episodes": n,
        "n_groups": len(domain.groups(labels)),
        "pass_rate": metrics.pass_rate(passed),
        "truncated_share": sum(a.truncated for a in arrays) / n,
        "zero_variance_share": zv.share,
        "zero_variance_all_pass_share": zv.all_pass_share,
        "zero_variance_all_fail_share": zv.all_fail_share,
        "zero_variance_groups": [g._asdict() for g in zv.groups],
        "mean_calls": None,
        "useless_credit_share": None,
        "useless_credit_share_per_call": None,
        "credit_by_effect": None,
    }
    credits = []
    for i, a in enumerate(arrays):
        calls = a.meta.get("calls")
        if not calls:
            continue
        tv = a.meta.get("turn_values")
        oracle = None
        if tv is not None:
            oracle = domain.oracle_turn_advantages(
                a.turn_ids, a.policy, a.rewards, tv, truncated=a.truncated, bootstrap_value=a.bootstrap_value
            )
        c = metrics.call_credit(calls, a.turn_ids, a.policy, passed[i], adv[i], oracle)
        if c is not None:
            credits.append(c)
    if not credits:
        return out
    by = metrics.credit_by_effect(credits, order=EFFECTS)
    out["mean_calls"] = sum(len(c.effects) for c in credits) / len(credits)
    out["useless_credit_share"], out["useless_credit_share_per_call"] = metrics.useless_credit(by)
    out["credit_by_effect"] = by
    return out
