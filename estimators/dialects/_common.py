"""What the trainers' dialects share: reading our [B, T] layout the way a trainer's batch holds it.

Our layout: ``mask`` is the policy mask; a row's response ends at its last policy token, padding
after it; tool output sits on mask-0 positions inside the response. A trainer's batch holds the
same row as its response tensor, with its own masks (verl and OpenRLHF: the policy mask; SkyRL: a
response mask that is 1 on tool tokens too).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .._scan import as_bool_mask
from ..groups import Labels, group_ids
from ..registry import EstimatorInput

__all__ = [
    "contiguous_size",
    "float_dtype",
    "last_policy",
    "on_policy",
    "policy",
    "response_span",
    "row_sums",
]


def policy(inp: EstimatorInput) -> Tensor:
    """[B, T] bool policy mask."""
    return as_bool_mask(inp.mask)


def float_dtype(inp: EstimatorInput) -> torch.dtype:
    """The output dtype: the rewards' when they are floating, else torch's default."""
    r = inp.rewards
    return r.dtype if r.is_floating_point() else torch.get_default_dtype()


def row_sums(inp: EstimatorInput) -> Tensor:
    """[B] the sum of every reward of the row, on policy tokens or not (what a trainer that sums
    ``token_level_rewards`` over the row, or an agent loop that adds up its steps' rewards, sees)."""
    return inp.rewards.to(float_dtype(inp)).sum(-1)


def on_policy(adv: Tensor, m: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """[B] per-row advantages broadcast onto the policy tokens of ``m`` [B, T], 0 elsewhere (one
    pass: a select, not a multiply, so a NaN row stays NaN only where it is on policy)."""
    a = adv if dtype is None else adv.to(dtype)
    return torch.where(m, a[:, None], torch.zeros((), dtype=a.dtype, device=a.device))


def last_policy(m: Tensor) -> Tensor:
    """[B] column of each row's last policy token (-1 for a row without one)."""
    B, T = m.shape
    if T == 0:
        return torch.full((B,), -1, dtype=torch.long, device=m.device)
    # argmax over the reversed row finds the last True; rows without one give -1.
    rev = torch.flip(m, (1,)).view(torch.uint8).argmax(1)
    return torch.where(m.any(1), T - 1 - rev, -1)


def response_span(m: Tensor) -> Tensor:
    """[B, T] bool: from each row's first to its last policy token, inclusive (the response as a
    trainer whose response mask covers tool output holds it)."""
    c = torch.cumsum(m.view(torch.uint8), 1, dtype=torch.int32)
    return (c > 0) & (c < c[:, -1:]) | m


def contiguous_size(groups: Labels, B: int) -> int | None:
    """n when the rows come in contiguous blocks of n rows, one group per block (the layout a
    trainer's ``reshape(-1, n_samples)`` assumes); None otherwise. ``groups=None`` is one block."""
    if B == 0:
        return None
    inv, G = group_ids(groups, B)
    if B % G:
        return None
    n = B // G
    blocks = inv.reshape(G, n)
    if not bool((blocks == blocks[:, :1]).all()):
        return None
    # G uniform blocks and G groups: each group fills exactly one block.
    return n
