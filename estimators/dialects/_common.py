"""What the trainers' dialects share: reading our [B, T] layout the way a trainer's batch holds it.

Our layout: ``mask`` is the policy mask; a row's response ends at its last policy token, padding
after it; tool output sits on mask-0 positions inside the response. A trainer's batch holds the
same row as its response tensor, with its own masks (verl and OpenRLHF: the policy mask; SkyRL: a
response mask that is 1 on tool tokens too).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .. import native
from .. import token as tok
from .._scan import as_bool_mask
from ..groups import Labels, group_ids
from ..registry import TRAINERS, EstimatorInput, EstimatorOutput, register

__all__ = [
    "Dialects",
    "broadcast",
    "contiguous_size",
    "float_dtype",
    "last_policy",
    "on_policy",
    "policy",
    "response_span",
    "returns_over",
    "whiten_rows",
    "whiten_unbiased",
    "row_sums",
]


Decorator = Callable[[Callable[..., EstimatorOutput]], Callable[..., EstimatorOutput]]


@dataclass(frozen=True)
class Dialects:
    """Registers one trainer's dialects: ``dialects("grpo", "GRPO", ...)`` registers
    ``"<trainer>:grpo"`` labelled ``"GRPO (<trainer's shown name> <version>)"``, with the trainer
    and version set (see :func:`estimators.registry.register` for the other arguments)."""

    trainer: str
    version: str
    reads: tuple[str, ...] = ("rewards",)  # what a dialect reads unless it says otherwise
    verl_name: bool = False  # verl's own dialects carry their name in verl's registry

    def __call__(
        self,
        name: str,
        label: str,
        description: str,
        kind: str,
        reads: tuple[str, ...] | None = None,
        params: dict[str, Any] | None = None,
        *,
        may_read: tuple[str, ...] = (),
        reference: str | None = None,
        departs: tuple[str, ...] = (),
    ) -> Decorator:
        return register(
            f"{self.trainer}:{name}",
            label=f"{label} ({TRAINERS[self.trainer][0]} {self.version})",
            description=description,
            kind=kind,
            reads=self.reads if reads is None else reads,
            may_read=may_read,
            params=params,
            verl_name=name if self.verl_name else None,
            trainer=self.trainer,
            version=self.version,
            reference=reference,
            departs=departs,
        )


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
    fused = native.row_broadcast(a, m, select=True)  # the compiled pass, when built
    if fused is not None:
        return fused
    return torch.where(m, a[:, None], torch.zeros((), dtype=a.dtype, device=a.device))


def broadcast(adv: Tensor, mask: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """[B] per-row advantages times the row's mask [B, T] (``adv.unsqueeze(-1) * mask``, as the
    trainers write it: one pass; a bool mask selects), in ``dtype`` (default: adv's). The mask is
    0/1, as ``EstimatorInput.mask`` is."""
    a = adv if dtype is None else adv.to(dtype)
    # The compiled pass, when built: torch would convert an integer mask to a's type first (a
    # [B, T] temporary and a pass), then multiply.
    fused = native.row_broadcast(a, mask)
    if fused is not None:
        return fused
    if mask.dtype == torch.bool:
        return torch.where(mask, a[:, None], torch.zeros((), dtype=a.dtype, device=a.device))
    out = a[:, None] * mask
    return out if out.dtype == a.dtype else out.to(a.dtype)


def _ramp(T: int, device: torch.device) -> Tensor:
    """[T] 1 .. T in the narrowest integer type that holds T (a product with a 0/1 uint8 mask
    stays that narrow)."""
    dtype = torch.int16 if T < 2**15 else torch.int32
    return torch.arange(1, T + 1, dtype=dtype, device=device)


def last_policy(m: Tensor) -> Tensor:
    """[B] column of each row's last policy token (-1 for a row without one)."""
    B, T = m.shape
    if T == 0:
        return torch.full((B,), -1, dtype=torch.long, device=m.device)
    # max over mask * (1 .. T): the last policy column + 1, or 0 for a row without one.
    return (m.view(torch.uint8) * _ramp(T, m.device)).amax(1).long() - 1


def response_span(m: Tensor) -> Tensor:
    """[B, T] bool: from each row's first to its last policy token, inclusive (the response as a
    trainer whose response mask covers tool output holds it); all False for a row without one."""
    B, T = m.shape
    if T == 0:
        return m.clone()
    ramp = _ramp(T, m.device)
    u = m.view(torch.uint8)
    first = T - (u * ramp.flip(0)).amax(1).long()  # T for a row without one: an empty span
    cols = torch.arange(T, device=m.device)
    return (cols >= first[:, None]) & (cols <= last_policy(m)[:, None])


def returns_over(rewards: Tensor, steps: Tensor, gamma: float) -> Tensor:
    """[B, T] discounted returns ``G_t = r_t + gamma G_next`` over the positions of ``steps`` (one
    step each; others skipped, their rewards unread, 0 there): the one-pass GAE (the compiled
    kernel when built) with V = 0 and lambda = 1. A trainer that steps through tool tokens passes
    the response span; one that skips them, the policy mask."""
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    r = rewards.to(dtype)
    if not 0.0 <= float(gamma) <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    fused = native.masked_returns(r, steps, float(gamma))  # no zero values array to read
    if fused is not None:
        return fused[0]
    return tok.gae(r, torch.zeros_like(r), steps, float(gamma), 1.0)[0]


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


def whiten_unbiased(x: Tensor, stats: Tensor, out: Tensor | None = None, zero_off: bool = False) -> Tensor:
    """verl's and SkyRL's ``masked_whiten(x, mask)`` with the int64 mask their trainers pass:
    mean over ``stats`` (bool [B, T]), variance times N/(N-1) computed as an integer division
    (float32), ``(x - mean) * rsqrt(var + 1e-8)``; returned where ``out`` (bool, default
    ``stats``) is True, 0 elsewhere. ``zero_off``: ``x`` is already 0 off ``stats`` (a scan's or a
    broadcast's output), so the sums read ``x`` alone (the variance as sum x^2 - N mean^2: within
    1e-14 of the two-pass one for advantages). With fewer than 2 positions in ``stats`` the
    trainers raise; here the result is 0 (there is nothing to whiten against)."""
    n = int(torch.count_nonzero(stats).item())  # (a bool sum converts the mask to int64 first)
    if n < 2:
        return torch.zeros_like(x)
    zero = torch.zeros((), dtype=x.dtype)
    bessel = torch.tensor(n) / torch.tensor(n - 1)  # int64 / int64: float32, as theirs
    if zero_off:
        flat = x.reshape(-1)
        mean = flat.sum() / n
        var = (torch.dot(flat, flat) / n - mean * mean) * bessel
        return torch.where(stats if out is None else out, x, mean).sub_(mean).mul_(torch.rsqrt(var + 1e-8))
    mean = torch.where(stats, x, zero).sum() / n  # the same terms in the same order as x * mask
    c = torch.where(stats, x, mean).sub_(mean)  # x - mean on the mask, 0 elsewhere
    flat = c.view(-1)
    var = torch.dot(flat, flat) / n * bessel
    c.mul_(torch.rsqrt(var + 1e-8))
    if out is not None and out is not stats:
        c = torch.where(out, c, zero)
    return c


def whiten_rows(a: Tensor, mask: Tensor) -> Tensor:
    """``whiten_unbiased(broadcast(a, mask), mask != 0, zero_off=True)`` for one number per row
    ``a`` [B] on a 0/1 ``mask`` [B, T], from per-row numbers: with n_b policy tokens in row b,
    N = sum n_b, mean = sum a_b n_b / N and var = (sum a_b^2 n_b / N - mean^2) N/(N-1) (in float64;
    N/(N-1) in float32 as the trainers' integer mask gives it), then ``(a_b - mean) *
    rsqrt(var + 1e-8)`` in ``a``'s dtype broadcast onto the policy tokens (0 elsewhere). One pass
    counting the mask and one writing the output, instead of a [B, T] broadcast, its sums and
    a second [B, T] pass. Fewer than two policy tokens: 0, as ``whiten_unbiased``."""
    counts = native.row_counts(mask)
    if counts is None:
        counts = (mask != 0).sum(-1)
    n = int(counts.sum().item())
    if n < 2:
        return torch.zeros(mask.shape, dtype=a.dtype, device=a.device)
    c, a64 = counts.to(torch.float64), a.to(torch.float64)
    mean = (a64 * c).sum() / n
    bessel = torch.tensor(n) / torch.tensor(n - 1)  # int64 / int64: float32, as theirs
    var = ((a64 * a64 * c).sum() / n - mean * mean) * bessel.to(torch.float64)
    mean_s = mean.to(a.dtype)
    row = (a - mean_s) * torch.rsqrt(var.to(a.dtype) + 1e-8)
    fused = native.row_broadcast(row, mask, select=True)
    if fused is not None:
        return fused
    return torch.where(as_bool_mask(mask), row[:, None], torch.zeros((), dtype=a.dtype, device=a.device))
