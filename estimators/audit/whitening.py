"""Masked whitening over a batch's policy tokens, in the two arithmetics trainers use.

``"float64"`` is :func:`estimators.stats.whiten` itself (our registry's whitened estimators match to
the bit); ``"float32"`` is verl's ``masked_whiten`` given an integer/bool mask (see :func:`counts`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..stats import whiten


def counts(n: int, factor: str) -> tuple[float, float]:
    """(the mean's denominator, the Bessel factor N/(N-1)) of masked whitening over ``n`` tokens.
    ``"float64"``: ``n + 1e-8`` and ``n / (n - 1)`` in float64 (:func:`estimators.stats.whiten`).
    ``"float32"``: verl's ``masked_whiten`` given an integer/bool mask, whose ``mask.sum()`` is an
    integer tensor: ``+ 1e-8`` yields a float32 tensor (exactly n: the 1e-8 is below half an ulp)
    and the integer division ``n / (n - 1)`` a float32 quotient."""
    if factor == "float64":
        return n + 1e-8, n / (n - 1)
    nt = torch.tensor(n)
    return float(nt + 1e-8), float(nt / (nt - 1))


def whiten_rows(ep: Tensor, n_pol: Tensor, factor: str) -> Tensor:
    """Masked whitening (as :func:`whiten_tokens`) of a row-constant [B, T] tensor, computed on
    [B] ``ep``: every policy token counts (longer rows weigh more), unbiased variance, 1e-8 on the
    variance."""
    w = n_pol.double()
    n = int(w.sum())
    if n < 2:
        return torch.zeros_like(ep)
    count, bessel = counts(n, factor)
    mean = (w * ep).sum() / count
    var = (w * (ep - mean) ** 2).sum() / count * bessel
    return (ep - mean) * torch.rsqrt(var + 1e-8)


def whiten_tokens(x: Tensor, mask: Tensor, factor: str) -> Tensor:
    """[B, T] global masked whitening of ``x`` (float64) over ``mask`` with ``factor``'s count
    arithmetic (see :func:`counts`); 0 when fewer than 2 tokens are masked."""
    n = int(mask.sum())
    if n < 2:
        return torch.zeros_like(x)
    if factor == "float64":
        return whiten(x, mask)
    count, bessel = counts(n, factor)
    mean = torch.where(mask, x, 0).sum() / count
    var = torch.where(mask, (x - mean) ** 2, 0).sum() / count * bessel
    return (x - mean) * torch.rsqrt(var + 1e-8)
