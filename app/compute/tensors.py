"""Episodes -> estimator inputs: one episode as a [1, T] row, a batch (or a group) right-padded to
[B, T_max] with the inputs a scheme reads, and the anchor state before each turn.

Shapes: one episode is a row of T tokens; the mask is its policy tokens. What goes into a padded
batch follows the scheme's ``reads`` and ``may_read`` (estimators/registry.py), never its name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from app.core import domain
from app.core.arrays import EpisodeArrays
from app.core.domain import POLICY
from app.core.errors import ApiError
from estimators import EstimatorInput, EstimatorSpec
from estimators.agent import anchor_state_ids


def turn_starts(ep: EpisodeArrays) -> np.ndarray:
    """Position of each turn's first token, in the estimators' turn order (a turn starts at the
    first policy token and wherever a policy token's turn id differs from the previous one's)."""
    pol = np.flatnonzero(ep.policy)
    tid = ep.turn_ids[pol]
    new = np.ones(len(pol), dtype=bool)
    new[1:] = tid[1:] != tid[:-1]
    return pol[new]


def anchor_observations(ep: EpisodeArrays) -> list[str | None]:
    """One anchor state per turn: ``meta.turn_states`` (the native field ``turn_states``) when
    uploaded, else the text of the observation right before the turn (the tool output before it;
    the prompt for the first turn); None (an unknown state) when nothing precedes the turn.
    ApiError 422 when the uploaded list does not have one entry per turn."""
    starts = turn_starts(ep)
    given = ep.meta.get("turn_states")
    if given is not None:
        if len(given) != len(starts):
            raise ApiError(
                422,
                "bad_turn_states",
                f"`meta.turn_states` has {len(given)} entries but the episode has {len(starts)} turns.",
                field="meta.turn_states",
            )
        return list(given)
    pol = np.flatnonzero(ep.policy)
    # The policy token before each turn start (-1: none): the observation is what lies between.
    prev = np.concatenate(([-1], pol))[np.searchsorted(pol, starts)]
    return [
        "".join(ep.tokens[p + 1 : s]) if s - p > 1 else None
        for p, s in zip(prev.tolist(), starts.tolist(), strict=True)
    ]


def episode_row(ep: EpisodeArrays, *, gamma: float, lam: float, critic: str) -> EstimatorInput:
    """[1, T] estimator input of one episode: everything it has (values: the uploaded ones under
    ``critic=upload``, else 0; the bootstrap value with uploaded values only), groups: its own."""
    T = len(ep.kinds)
    use_values = ep.values if critic == "upload" else None
    values = use_values if use_values is not None else np.zeros(T)
    last_value = None
    if ep.truncated and ep.bootstrap_value is not None and critic == "upload":
        last_value = torch.tensor([ep.bootstrap_value], dtype=torch.float64)
    return EstimatorInput(
        rewards=torch.from_numpy(np.ascontiguousarray(ep.rewards, dtype=np.float64))[None],
        mask=torch.from_numpy(ep.policy.astype(np.float64))[None],
        values=torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))[None],
        groups=torch.zeros(1, dtype=torch.long),
        turn_ids=torch.from_numpy(ep.turn_ids.astype(np.int64))[None],
        last_value=last_value,
        gamma=gamma,
        lam=lam,
        logprobs=None if ep.logprobs is None else torch.from_numpy(np.ascontiguousarray(ep.logprobs))[None],
        turn_values=None
        if ep.meta.get("turn_values") is None
        else torch.tensor([ep.meta["turn_values"]], dtype=torch.float64),
    )


def padded_batch(
    arrays: list[EpisodeArrays], spec: EstimatorSpec, *, critic: str, gamma: float, lam: float
) -> EstimatorInput:
    """[B, T_max] right-padded estimator input of ``arrays`` (padding: mask 0) holding what ``spec``
    reads or may read: values (uploaded under ``critic=upload``, 0 where an episode has none, or
    all 0 under ``critic=zero``), logprobs (when every episode has them), turn ids, and the turn
    states (:func:`anchor_observations`, ids shared across the batch)."""
    wanted = {*spec.reads, *spec.may_read}
    B, T = len(arrays), max(len(a.kinds) for a in arrays)
    rew = np.zeros((B, T))
    mask = np.zeros((B, T))
    val = np.zeros((B, T)) if "values" in wanted else None
    has_lp = "logprobs" in wanted and all(a.logprobs is not None for a in arrays)
    lp = np.zeros((B, T)) if has_lp else None
    for b, a in enumerate(arrays):
        n = len(a.kinds)
        rew[b, :n] = a.rewards
        mask[b, :n] = a.kinds == POLICY
        if val is not None and critic == "upload" and a.values is not None:
            val[b, :n] = a.values
        if lp is not None:
            lp[b, :n] = a.logprobs
    kw: dict[str, Any] = {}
    if "turn_ids" in wanted or "turn_states" in wanted:
        tids = np.full((B, T), -1, dtype=np.int64)
        for b, a in enumerate(arrays):
            tids[b, : len(a.kinds)] = a.turn_ids
        kw["turn_ids"] = torch.from_numpy(tids)
    if "turn_states" in wanted:
        kw["turn_states"] = anchor_state_ids([anchor_observations(a) for a in arrays])
    return EstimatorInput(
        rewards=torch.from_numpy(rew),
        mask=torch.from_numpy(mask),
        values=None if val is None else torch.from_numpy(val),
        groups=torch.from_numpy(domain.group_ids([a.group for a in arrays])),
        logprobs=None if lp is None else torch.from_numpy(lp),
        gamma=gamma,
        lam=lam,
        **kw,
    )
