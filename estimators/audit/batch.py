"""The audited batch, prepared once: uploads, masks and the facts the hypotheses need (float64).

:func:`prepare` turns the caller's :class:`~estimators.registry.EstimatorInput`, uploaded advantages
and kind codes into a :class:`Batch`: the policy and "response" masks, the rewards with the outcome
moved to the row's last token (when that changes anything), bootstrap values of truncated rows, and
per-row extremes of the upload that score row-constant candidates without a [B, T] pass.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from ..registry import EstimatorInput
from .constants import KIND_POLICY, KIND_PROMPT, KIND_TOOL, WHITEN_FACTORS


@dataclass
class Batch:
    """One audited batch, [B, T] tensors in float64 (masks bool)."""

    u: Tensor  # [B, T] float64 uploaded
    pol: Tensor  # [B, T] bool policy
    resp: Tensor  # [B, T] bool every token (not padding) from the first policy token on
    kinds: Tensor
    r: Tensor  # [B, T] float64 rewards
    r_end: Tensor | None  # rewards with the last-policy reward moved to the row's last token
    v: Tensor | None
    lv: Tensor | None  # [B] bootstrap values (NaN = terminated) or None
    turn_ids: Tensor | None
    groups: Any
    n_pol: Tensor  # [B] long
    rows: Tensor  # [B] bool rows with a policy token
    umin: Tensor
    umax: Tensor
    has_gaps: bool
    has_boot: bool
    ep_first: Tensor  # [B] uploaded at the first policy token
    factors: tuple[str, ...] = WHITEN_FACTORS  # whiten_factor values worth searching
    lp: Tensor | None = None  # [B, T] float64 the training log-probs (``logprobs``), or None
    rlp: Tensor | None = None  # [B, T] float64 the rollout engine's log-probs, or None
    drift: Tensor | None = None  # [B, T] bool sampled tokens a later prompt re-renders as others
    drift_lp: Tensor | None = None  # [B, T] float64 the upload's lowest log-prob there (NaN: none)
    misaligned: Tensor | None = None  # [B, T] bool tokens where the trainer's own mask does not fit


def is_token(kinds: Tensor) -> Tensor:
    """[B, T] bool: a prompt, policy or tool token (not padding)."""
    return (kinds == KIND_PROMPT) | (kinds == KIND_POLICY) | (kinds == KIND_TOOL)


def row_end_rewards(r: Tensor, pol: Tensor, tok: Tensor) -> Tensor | None:
    """The rewards with each row's last-policy reward moved to the row's last token, as a trainer
    that scores the row's last token would place the outcome (None when that moves nothing)."""
    B, T = r.shape
    idx = torch.arange(T).expand(B, T)
    last_pol = torch.where(pol, idx, -1).amax(1)
    last_any = torch.where(tok, idx, -1).amax(1)
    moved = (last_pol >= 0) & (last_any > last_pol)
    if not bool(moved.any()):
        return None
    rows = moved.nonzero().squeeze(1)
    rv = r[rows, last_pol[rows]]
    if not bool((rv != 0).any()):
        return None
    r_end = r.clone()
    r_end[rows, last_pol[rows]] = 0
    r_end[rows, last_any[rows]] += rv
    return r_end


def on_policy_rewards(b: Batch) -> Tensor:
    """[B, T] the rewards with every reward on a prompt/tool token moved to the policy token the
    reward belongs to: the nearest policy token at or before it (the action whose turn it closes),
    else the row's first policy token (a reward on the prompt). Rows without a policy token keep theirs."""
    B, T = b.r.shape
    idx = torch.arange(T).expand(B, T)
    off = is_token(b.kinds) & ~b.pol & (b.r != 0) & b.rows[:, None]
    if not bool(off.any()):
        return b.r
    prev = torch.where(b.pol, idx, -1).cummax(1).values
    first = torch.where(b.pol, idx, T).amin(1)
    dest = torch.where(prev >= 0, prev, first[:, None].expand(B, T))
    out = torch.where(off, 0.0, b.r)
    return out.scatter_add(1, torch.where(off, dest, 0), torch.where(off, b.r, 0.0))


def prepare(inp: EstimatorInput, uploaded: Tensor, kinds: Tensor, truncated: Tensor | None) -> Batch:
    """The :class:`Batch` of an audit call (see :func:`estimators.audit.audit` for the arguments)."""
    r = inp.rewards.double()
    B, T = r.shape
    u = torch.as_tensor(uploaded).double()
    if u.shape != (B, T) or tuple(kinds.shape) != (B, T):
        raise ValueError(
            f"uploaded {tuple(u.shape)} and kinds {tuple(kinds.shape)} must be [B, T] = {(B, T)}"
        )
    pol = inp.mask != 0
    tok = is_token(kinds)
    idx = torch.arange(T).expand(B, T)
    first = torch.where(pol, idx, T).amin(1)
    resp = tok & (idx >= first[:, None])
    r_end = row_end_rewards(r, pol, tok)
    lv = None
    if inp.last_value is not None:
        lv = torch.as_tensor(inp.last_value, dtype=torch.float64).reshape(-1).clone()
        if truncated is not None:
            lv = torch.where(torch.as_tensor(truncated, dtype=torch.bool), lv, torch.nan)
    has_boot = lv is not None and bool((torch.nan_to_num(lv) != 0).any())
    n_pol = pol.sum(1)
    upol_hi = torch.where(pol, u, -torch.inf).amax(1)
    upol_lo = torch.where(pol, u, torch.inf).amin(1)
    # NaN uploads never agree with anything.
    bad = torch.where(pol, u.isnan(), False).any(1)
    upol_hi = torch.where(bad, torch.inf, upol_hi)
    upol_lo = torch.where(bad, -torch.inf, upol_lo)
    fidx = first.clamp(max=T - 1) if T else first
    # Float32-precision uploads (every policy value survives a round trip through float32) cannot
    # resolve the ~6e-8 gap between the two whitening factors, and were float32 arithmetic anyway.
    up = u[pol]
    f32 = bool(torch.equal(up.float().double(), up))
    return Batch(
        u=u,
        pol=pol,
        resp=resp,
        kinds=kinds,
        r=r,
        r_end=r_end,
        v=None if inp.values is None else inp.values.double(),
        lv=lv if has_boot else None,
        turn_ids=inp.turn_ids,
        groups=inp.groups,
        n_pol=n_pol,
        rows=n_pol > 0,
        umin=upol_lo,
        umax=upol_hi,
        has_gaps=bool((resp & ~pol).any()),
        has_boot=has_boot,
        ep_first=u.gather(1, fidx[:, None]).squeeze(1) if T else u.new_zeros(B),
        factors=("float32",) if f32 else WHITEN_FACTORS,
    )


def subset(b: Batch, rows: Tensor) -> Batch:
    """The rows ``rows`` of ``b`` as a batch of their own (only what the token family reads)."""

    def sel(x: Tensor | None) -> Tensor | None:
        return None if x is None else x[rows]

    return replace(
        b,
        u=b.u[rows],
        pol=b.pol[rows],
        resp=b.resp[rows],
        kinds=b.kinds[rows],
        r=b.r[rows],
        r_end=sel(b.r_end),
        v=sel(b.v),
        lv=sel(b.lv),
        turn_ids=sel(b.turn_ids),
        lp=sel(b.lp),
        rlp=sel(b.rlp),
    )
