"""A candidate configuration and how it is scored against the upload (policy tokens only).

Outcome/group candidates hold one advantage per episode (``ep`` [B]) and are scored exactly on
[B] vectors; token/turn candidates hold their whole [B, T] reference. :func:`matches` is the match
rule (``max_abs_diff <= MATCH_MAX_ABS`` and ``MATCH_SHARE`` of policy tokens within ``TOKEN_TOL``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .batch import Batch
from .constants import MATCH_MAX_ABS, MATCH_SHARE, TOKEN_TOL


@dataclass
class Cand:
    """One configuration: a scheme, its parameters (conventions and bug hypotheses) and its score."""

    scheme: str
    params: dict[str, Any]
    kind: str  # outcome | token | turn
    ep: Tensor | None = None  # [B] per-episode advantages (outcome)
    max_abs: float = math.inf
    share: float | None = None
    fit: float = 0.0  # outcome: share of policy tokens in rows that agree whole (<= share)
    inlier: float = math.inf  # max |u - ref| over the agreeing tokens (outcome: rows); inf if none
    ref: Tensor | None = None  # [B, T] (token family, after full evaluation)
    raw: Tensor | None = None

    @property
    def vec(self) -> Tensor:
        """[B] per-episode advantages of an outcome candidate."""
        if self.ep is None:
            raise ValueError(f"{self.scheme} is not an outcome candidate")
        return self.ep


def score_outcome(b: Batch, c: Cand) -> tuple[float, float, float]:
    """(exact max |u - c| over policy tokens, share of policy tokens in rows that agree whole,
    max |u - c| over those rows) for a row-constant candidate: ``max(umax - c, c - umin)`` per
    row, no [B, T] pass."""
    ep = c.vec
    d = torch.maximum(b.umax - ep, ep - b.umin)
    d = torch.where(b.rows, d, 0.0)
    d = torch.nan_to_num(d, nan=math.inf)
    n = int(b.n_pol.sum())
    ok = d <= TOKEN_TOL
    fit = float((b.n_pol * ok).sum()) / n if n else 1.0
    inlier = float(d[ok & b.rows].max()) if bool((ok & b.rows).any()) else math.inf
    return (float(d.max()) if d.numel() else 0.0), fit, inlier


def broadcast(b: Batch, ep: Tensor) -> Tensor:
    """[B, T] the per-episode ``ep`` [B] on every policy token, 0 elsewhere."""
    return torch.where(b.pol, ep[:, None], 0.0)


def share(b: Batch, ref: Tensor) -> tuple[float, float, float]:
    """(max |u - ref|, share of policy tokens within TOKEN_TOL, max |u - ref| over those tokens)
    over policy tokens."""
    n = int(b.pol.sum())
    if n == 0:
        return 0.0, 1.0, 0.0
    d = torch.where(b.pol, (b.u - ref).abs(), 0.0)
    d = torch.where(b.pol & d.isnan(), math.inf, d)
    ok = (d <= TOKEN_TOL) & b.pol
    within = int(ok.sum())
    inlier = float(torch.where(ok, d, 0.0).max()) if within else math.inf
    return float(d.max()), within / n, inlier


def one_factor(cands: list[Cand]) -> list[Cand]:
    """Of the whitening-factor variants of each configuration, the one that reproduces the
    agreeing tokens best (smallest ``inlier``, then ``max_abs``). The factors differ by ~1e-8, so
    only the tokens that agree can tell them apart: a wrong token's error says nothing about them."""
    best: dict[tuple[str, str], Cand] = {}
    for c in cands:
        key = (c.scheme, repr(sorted((k, v) for k, v in c.params.items() if k != "whiten_factor")))
        o = best.get(key)
        if o is None or (c.inlier, c.max_abs) < (o.inlier, o.max_abs):
            best[key] = c
    keep = {id(c) for c in best.values()}
    return [c for c in cands if id(c) in keep]


def matches(c: Cand) -> bool:
    """The match rule: no policy token off by more than MATCH_MAX_ABS, MATCH_SHARE within TOKEN_TOL."""
    return c.max_abs <= MATCH_MAX_ABS and (c.share or 0.0) >= MATCH_SHARE


def public(c: Cand) -> dict[str, Any]:
    """A candidate as the JSON answer names it."""
    return {
        "scheme": c.scheme,
        "params": dict(c.params),
        "max_abs_diff": num(c.max_abs),
        "share_within_1e-5": num(c.share),
    }


def num(x: float | None) -> float | None:
    """``x`` as JSON can carry it: None for NaN and infinities."""
    if x is None or math.isnan(x):
        return None
    return x if math.isfinite(x) else None
