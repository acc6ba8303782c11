"""Known departures of trainers' code from our conventions, as the audit reports them.

A trainer's dialect (``register(..., trainer=..., departs=(...))``) lists the codes of the
departures its code makes. When an upload's best match is that dialect, :func:`report` looks for
each on the batch and names the tokens it touches; a departure the batch cannot show (no tool span,
no singleton group) is not reported. **Adding a departure** happens here and only here: a
:class:`Departure` in :data:`DEPARTURES` with the tokens it touches (``where``), then its code in
the ``departs`` of the dialects whose code makes it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import groups as G
from .batch import Batch, is_token


@dataclass(frozen=True)
class Seen:
    """What a departure's detector may read: the batch, the dialect's output and its reference's
    (the reference estimator with the same gamma and lambda; None when the dialect names none)."""

    b: Batch
    dialect: Tensor  # [B, T] the best match's raw advantages (returns - values for a critic dialect)
    reference: Tensor | None  # [B, T] the reference estimator's (same gamma and lambda), or None


@dataclass(frozen=True)
class Departure:
    """One known departure: its finding code, severity and what it does; ``where`` -> [B, T] bool
    tokens it touches on this batch (none: not reported)."""

    code: str
    severity: str
    text: str
    where: Callable[[Seen], Tensor]


def _changed_policy_tokens(s: Seen) -> Tensor:
    """Policy tokens where the dialect and its reference differ (relative 1e-9)."""
    if s.reference is None:
        return torch.zeros_like(s.b.pol)
    d, r = s.dialect, s.reference
    return s.b.pol & ((d - r).abs() > 1e-9 * (1 + r.abs()))


def _through_spans(s: Seen) -> Tensor:
    """Changed policy tokens of rows that have a tool span between policy tokens."""
    gaps = (s.b.resp & ~s.b.pol).any(1, keepdim=True)
    return _changed_policy_tokens(s) & gaps


def _masked_rewards(s: Seen) -> Tensor:
    """Prompt/tool tokens holding a nonzero reward (the loss masks them)."""
    b = s.b
    return is_token(b.kinds) & ~b.pol & (b.r != 0)


def _rejected_siblings(s: Seen) -> Tensor:
    """Policy tokens of rows that share a group with a row without policy tokens but with a reward
    (a rejected sample still in its group's baseline)."""
    b = s.b
    B = b.pol.shape[0]
    ids, n = G.group_ids(b.groups, B)
    rejected = ~b.rows & (torch.where(is_token(b.kinds), b.r, 0.0) != 0).any(1)
    if not bool(rejected.any()):
        return torch.zeros_like(b.pol)
    hit = torch.zeros(n, dtype=torch.bool).index_fill_(0, ids[rejected], True)
    return b.pol & (hit[ids] & b.rows)[:, None]


def _singletons(s: Seen) -> Tensor:
    """Policy tokens of rows alone in their group."""
    b = s.b
    B = b.pol.shape[0]
    ids, n = G.group_ids(b.groups, B)
    count = torch.zeros(n, dtype=torch.long).index_add_(0, ids, torch.ones(B, dtype=torch.long))
    return b.pol & (count[ids] == 1)[:, None]


DEPARTURES: dict[str, Departure] = {
    d.code: d
    for d in (
        Departure(
            "gae_through_tool_spans",
            "error",
            "its GAE steps through tool spans, decaying gamma * lambda once per tool token (or reading "
            "the critic's values there), so credit before a tool span shrinks or changes sign",
            _through_spans,
        ),
        Departure(
            "reward_on_masked_position_dropped",
            "warning",
            "a reward on a position the loss masks (a prompt or tool token) is dropped without a word, "
            "while the trainer's group estimators sum the whole row and count it",
            _masked_rewards,
        ),
        Departure(
            "rejected_rows_in_baseline",
            "error",
            "rows whose loss mask is all 0 (rejected samples) still move their group's baseline, since "
            "the group statistics sum rewards without the mask",
            _rejected_siblings,
        ),
        Departure(
            "singleton_twins_differ",
            "warning",
            "a group of one is handled differently by the trainer's two implementations of the same "
            "estimator (one gives the score, the other 0)",
            _singletons,
        ),
    )
}
