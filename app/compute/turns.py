"""Per-turn views of an episode: the summary of each turn (span, text, reward, V, effect, mean
advantage per scheme), a batch turn scheme's per-turn extras on the tokens, and the oracle advantage
from the true turn values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from app.compute.tensors import turn_starts
from app.core import domain
from app.core.arrays import EpisodeArrays
from app.core.errors import ApiError
from app.core.tokenize import join_tokens


def masked(arr: np.ndarray, policy: np.ndarray, as_numpy: bool = False) -> list[float | None] | np.ndarray:
    """[T] -> list with None off-policy (the JSON null the front end greys out).

    ``as_numpy``: a float64 array with NaN off-policy instead; orjson writes NaN as null and
    serialises the array in C, which is what keeps the 32k-token API call fast."""
    out = np.array(arr, dtype=np.float64)
    out[~policy] = np.nan
    if as_numpy:
        return out
    o = out.astype(object)
    o[np.isnan(out)] = None  # off-policy, or no number at all (an episode without a reward)
    values: list[float | None] = o.tolist()
    return values


def turn_extras(extras: dict[str, Any], row: int, ep: EpisodeArrays, as_numpy: bool) -> dict[str, Any]:
    """A batch turn scheme's per-turn ([B, K]) and per-episode ([B]) extras of row ``row`` on
    this episode's policy tokens (null elsewhere); ``turn_advantages`` (the row itself) left out."""
    policy = ep.policy
    k_of = np.cumsum(np.isin(np.arange(len(policy)), turn_starts(ep))) - 1  # turn index per token
    out: dict[str, Any] = {}
    for key, v in extras.items():
        if key == "turn_advantages" or not isinstance(v, torch.Tensor):
            continue
        x = v[row].to(torch.float64).numpy()
        if x.ndim == 0:
            tok = np.full(len(policy), float(x))
        elif x.ndim == 1 and len(x):
            tok = x[np.clip(k_of, 0, len(x) - 1)]
        else:
            continue
        out[key] = masked(tok, policy, as_numpy)
    return out


def oracle_advantages(ep: EpisodeArrays, gamma: float) -> np.ndarray:
    """[T] the oracle turn advantage (:func:`app.core.domain.oracle_turn_advantages`) with the true
    values ``meta.turn_values``, broadcast on each turn's policy tokens."""
    V = ep.meta["turn_values"]
    policy = ep.policy
    A = domain.oracle_turn_advantages(
        ep.turn_ids,
        policy,
        ep.rewards,
        V,
        truncated=ep.truncated,
        bootstrap_value=ep.bootstrap_value,
        gamma=gamma,
    )
    if A is None:
        K = int(ep.turn_ids[policy].max()) + 1
        raise ApiError(
            422,
            "bad_turn_values",
            f"`meta.turn_values` has {len(V)} entries but the episode has {K} turns.",
            field="meta.turn_values",
        )
    out = np.zeros(len(policy))
    out[policy] = A[ep.turn_ids[policy]]
    return out


def turn_summaries(
    ep: EpisodeArrays, per_token: dict[str, np.ndarray], values: np.ndarray | None
) -> list[dict[str, Any]]:
    """One entry per turn: token span, text, reward, V at its first token, effect, mean advantage per scheme."""
    policy = ep.policy
    tid = ep.turn_ids
    idx = np.flatnonzero(policy)
    if not len(idx):
        return []
    t = tid[idx]
    K = int(t.max()) + 1
    counts = np.bincount(t, minlength=K)
    rewards = np.bincount(t, weights=ep.rewards[idx], minlength=K)
    # Policy positions grouped by turn (stable sort keeps token order): O(T log T), not O(K T).
    order = idx[np.argsort(t, kind="stable")]
    bounds = np.concatenate(([0], np.cumsum(counts))).tolist()
    means = {
        name: (np.bincount(t, weights=adv[idx], minlength=K) / np.maximum(counts, 1)).tolist()
        for name, adv in per_token.items()
    }
    calls = ep.meta.get("calls") if isinstance(ep.meta.get("calls"), list) else None
    tokens = ep.tokens
    counts_l, rewards_l = counts.tolist(), rewards.tolist()
    out = []
    for k in range(K):
        n = counts_l[k]
        if n == 0:
            continue
        b0, b1 = bounds[k], bounds[k + 1]
        s, e = int(order[b0]), int(order[b1 - 1]) + 1
        if e - s == n:  # the usual case: a contiguous run of policy tokens
            text = join_tokens(tokens[s : min(e, s + 400)])
        else:
            text = join_tokens([tokens[i] for i in order[b0 : min(b1, b0 + 400)].tolist()])
        effect = None
        if calls is not None and k < len(calls) and isinstance(calls[k], dict):
            effect = calls[k].get("effect")
        out.append(
            {
                "turn": k,
                "start": s,
                "end": e,
                "text": text,
                "reward": rewards_l[k],
                "value": None if values is None else float(values[s]),
                "effect": effect,
                "means": {name: m[k] for name, m in means.items()},
            }
        )
    return out
