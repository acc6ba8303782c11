"""The audit's answer: :class:`AuditResult`, the ``best_match`` block and the shape of one finding."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from .candidates import public
from .constants import CAP, MATCH_MAX_ABS
from .search import Search


@dataclass
class AuditResult:
    """The audit of one batch. ``as_dict()`` is the JSON answer; ``reference`` [B, T] float64 is the
    best match's advantages (or the closest fit's when nothing matches; 0 off-policy), for an
    ``uploaded - reference`` view."""

    best_match: dict[str, Any]
    findings: list[dict[str, Any]]
    searched: int
    reference: Tensor | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        """``{"best_match", "findings", "searched"}`` as plain JSON-ready values."""
        return {"best_match": self.best_match, "findings": self.findings, "searched": self.searched}

    @property
    def has_error(self) -> bool:
        """True when any finding has severity ``error`` (the CLI's exit status)."""
        return any(f["severity"] == "error" for f in self.findings)


_NONE = {"scheme": None, "params": None, "max_abs_diff": None, "share_within_1e-5": None}


def no_policy_tokens() -> AuditResult:
    """The answer on a batch without a single policy token (nothing to compare)."""
    return AuditResult({**_NONE, "message": "the batch has no policy token to compare"}, [], 0)


def best_match(s: Search) -> dict[str, Any]:
    """The ``best_match`` block: the match, or (scheme None) the closest fit and why it is not one."""
    if s.pick is not None:
        out = public(s.pick)
        out["also_matches"] = [public(c) for c in s.also]
        return out
    c = s.closest
    return {
        **_NONE,
        "closest": public(c),
        "message": (
            f"no configuration explains these advantages: the closest, {c.scheme}, is off by up to "
            f"{c.max_abs:.3g} (tolerance {MATCH_MAX_ABS:g}) after {s.searched} configurations"
        ),
    }


def positions(mask: Tensor) -> tuple[list[list[int]], int, list[int]]:
    """(the first CAP ``[episode, position]`` pairs of ``mask`` [B, T], how many in all, the episodes)."""
    eps = mask.any(1).nonzero().squeeze(1).tolist()
    n = int(mask.sum())
    if n > CAP:  # only the first CAP positions are listed: find them in the first rows that hold them
        rows = mask.sum(1).cumsum(0)
        last = int(torch.searchsorted(rows, torch.tensor(CAP)).item()) + 1
        mask = mask[:last]
    return mask.nonzero()[:CAP].tolist(), n, eps


def finding(code: str, severity: str, message: str, mask: Tensor, evidence: dict[str, Any]) -> dict[str, Any]:
    """One finding as the JSON answer holds it, naming the tokens of ``mask`` [B, T]."""
    toks, n, eps = positions(mask)
    return {
        "code": code,
        "severity": severity,
        "message": message,
        "episodes": eps,
        "tokens": toks,
        "token_count": n,
        "evidence": evidence,
    }
