"""Batch diagnostics of sampled (or any meta.calls-annotated) episodes, with the definitions of
app/core/domain.py (score, pass, groups, zero variance, useless credit, oracle advantage).

- zero_variance_share: the share of episodes in zero-variance groups.
- useless_credit_share: :func:`app.core.domain.useless_credit_share` (the same number the batch page
  shows).
- credit_by_effect: per call effect, how many calls, their mean outcome (RLOO) advantage, their
  share of the positive credit, and (when meta.turn_values is present) the mean oracle turn
  advantage, which says what the call was really worth.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from app.compute.advantages import outcome_advantages
from app.core import domain
from app.core.arrays import arrays_from_native
from app.core.schemas import EpisodeIn
from app.sim.policy import EFFECTS


def sim_diagnostics(episodes: list[EpisodeIn]) -> dict:
    """Diagnostics of a batch of native episodes.

    Returns {"n_episodes", "n_groups", "pass_rate", "mean_calls", "truncated_share",
    "zero_variance_share", "zero_variance_groups": [{"group", "n", "all"}], "useless_credit_share",
    "credit_by_effect": {effect: {"n_calls", "mean_outcome_advantage", "positive_credit_share",
    "mean_oracle_advantage"}}}. useless_credit_share and credit_by_effect are None when the
    episodes carry no meta.calls.
    """
    n = len(episodes)
    if n == 0:
        raise ValueError("no episodes")
    arrays = [arrays_from_native(ep) for ep in episodes]
    labels = [a.group for a in arrays]
    scores = np.array([a.score for a in arrays])
    passed = [domain.passed(a.reward, s) for a, s in zip(arrays, scores, strict=True)]
    adv = outcome_advantages("rloo", scores, labels).tolist()

    groups = domain.groups(labels)
    zero_groups = [
        {"group": domain.group_label(key), "n": len(idx), "all": "pass" if passed[idx[0]] else "fail"}
        for key, idx in groups.items()
        if domain.zero_variance(scores[idx])
    ]
    out = {
        "n_episodes": n,
        "n_groups": len(groups),
        "pass_rate": sum(passed) / n,
        "truncated_share": sum(a.truncated for a in arrays) / n,
        "zero_variance_share": sum(z["n"] for z in zero_groups) / n,
        "zero_variance_groups": zero_groups,
        "mean_calls": None,
        "useless_credit_share": None,
        "credit_by_effect": None,
    }
    annotated = [(i, a) for i, a in enumerate(arrays) if a.meta.get("calls")]
    if not annotated:
        return out

    n_calls: dict[str, int] = defaultdict(int)
    sum_adv: dict[str, float] = defaultdict(float)
    pos_credit: dict[str, float] = defaultdict(float)
    oracle_sum: dict[str, float] = defaultdict(float)
    oracle_n: dict[str, int] = defaultdict(int)
    lengths = []
    for i, a in annotated:
        calls = a.meta["calls"]
        tokens = domain.call_tokens(a.turn_ids, a.policy, len(calls))
        if tokens is None:
            continue
        lengths.append(len(calls))
        credit = domain.positive_credit(passed[i], adv[i], tokens)
        tv = a.meta.get("turn_values")
        oracle = None
        if tv is not None:
            oracle = domain.oracle_turn_advantages(
                a.turn_ids, a.policy, a.rewards, tv, truncated=a.truncated, bootstrap_value=a.bootstrap_value
            )
        for k, c in enumerate(calls):
            eff = c.get("effect", "other")
            n_calls[eff] += 1
            sum_adv[eff] += adv[i]
            pos_credit[eff] += float(credit[k])
            if oracle is not None:
                oracle_sum[eff] += float(oracle[k])
                oracle_n[eff] += 1
    total_pos = sum(pos_credit.values())
    order = [e for e in EFFECTS if e in n_calls] + sorted(e for e in n_calls if e not in EFFECTS)
    out["mean_calls"] = sum(lengths) / len(lengths) if lengths else None
    out["useless_credit_share"] = domain.useless_credit_share(pos_credit)
    out["credit_by_effect"] = {
        e: {
            "n_calls": n_calls[e],
            "mean_outcome_advantage": sum_adv[e] / n_calls[e],
            "positive_credit_share": pos_credit[e] / total_pos if total_pos > 0 else None,
            "mean_oracle_advantage": oracle_sum[e] / oracle_n[e] if oracle_n[e] else None,
        }
        for e in order
    }
    return out
