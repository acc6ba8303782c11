"""The optional compiled kernels (``estimators/_native.c``): behind :func:`estimators.gae` and
:func:`estimators.turn_gae`, and the trainers' dialects' passes (``estimators/dialects/``:
SkyRL's span GAE and returns with their whitening, the row broadcast and row counts, the masked
returns, verl's optimal token baselines).

``pip install`` builds it when a C compiler is present (it is optional: without one the install
still succeeds). When it is built and the inputs are CPU tensors, each function here makes one or
two passes over the data instead of the torch path's several; the numbers are the same arithmetic
(see ``tests/estimators/test_native.py`` and ``test_native_dialects.py``). Each returns None when
it does not apply, and the caller falls back to the torch path, which is always available:

* ``available()`` says whether the kernel is built;
* ``CREDITLENS_NATIVE=0`` in the environment, ``set_default(False)`` (the server's setting does
  this) or ``with disabled():`` (this thread, this block) turns it off.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

try:
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler at install time)
    _native = None
try:  # the policy-loss weights' kernel (estimators/_loss_native.c), built alongside
    from . import _loss_native  # type: ignore[attr-defined]
except ImportError:
    _loss_native = None

_V_KINDS = {torch.float32: 0, torch.float64: 1}
_M_KINDS = {torch.int64: 0, torch.int32: 1, torch.uint8: 2, torch.bool: 2, torch.float32: 3, torch.float64: 4}
_off = threading.local()


def available() -> bool:
    """True when the compiled kernel is built and importable."""
    return _native is not None


_OFF_WORDS = ("0", "false", "f", "no", "n", "off")  # pydantic's false words (app/core/settings.py)
_default: bool | None = None


def set_default(on: bool | None) -> None:
    """Turn the kernel on or off for the whole process (None: follow ``CREDITLENS_NATIVE``)."""
    global _default
    _default = on


def enabled() -> bool:
    """True when :func:`estimators.gae` and ``turn_gae`` will use the kernel for CPU inputs."""
    if _native is None or int(getattr(_off, "depth", 0)):
        return False
    if _default is not None:
        return _default
    return os.environ.get("CREDITLENS_NATIVE", "1").strip().lower() not in _OFF_WORDS


@contextmanager
def disabled() -> Iterator[None]:
    """Use the vectorised torch path inside this block (this thread only)."""
    _off.depth = int(getattr(_off, "depth", 0)) + 1
    try:
        yield
    finally:
        _off.depth -= 1


def loss_kernel() -> Any:
    """The compiled policy-loss-weights module (``estimators/_loss_native.c``) when it is built
    and kernels are on (the same switches as :func:`enabled`), else None."""
    if _loss_native is None or int(getattr(_off, "depth", 0)):
        return None
    on = (
        _default
        if _default is not None
        else os.environ.get("CREDITLENS_NATIVE", "1").strip().lower() not in _OFF_WORDS
    )
    return _loss_native if on else None


def _prepare(rewards: Tensor, values: Tensor, mask: Tensor, last_value: Tensor | None) -> Any:
    """(codes, contiguous buffers, outputs) for the kernel, or None when it does not apply."""
    if not enabled():
        return None
    vk = _V_KINDS.get(rewards.dtype)
    mk = _M_KINDS.get(mask.dtype)
    if vk is None or mk is None or values.dtype != rewards.dtype:
        return None
    if any(x.device.type != "cpu" for x in (rewards, values, mask)):
        return None
    m = _mask_buffer(mask)
    lv = None if last_value is None else last_value.to(device="cpu", dtype=torch.float64).contiguous()
    B, T = rewards.shape
    bufs = (rewards.contiguous(), values.contiguous(), m, lv)
    outs = (torch.empty(B, T, dtype=rewards.dtype), torch.empty(B, T, dtype=rewards.dtype))
    threads = _threads(B * T)
    return (vk, mk, threads), bufs, outs


def _mask_buffer(mask: Tensor) -> Tensor:
    """``mask`` as the kernels read it: contiguous, a bool mask as its bytes (no copy)."""
    m = mask.contiguous()
    return m.view(torch.uint8) if m.dtype == torch.bool else m


def _threads(cells: int) -> int:
    """Threads for a pass over ``cells`` numbers: they cost tens of microseconds to start, so
    small batches run on one."""
    return torch.get_num_threads() if cells >= 1 << 16 else 1


def _addr(x: Tensor | None) -> int:
    return 0 if x is None else x.data_ptr()


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_value: Tensor | None
) -> tuple[Tensor, Tensor] | None:
    """Masked GAE through the kernel, or None when it does not apply (the caller falls back).

    ``rewards`` and ``values`` are [B, T] of the output dtype; ``last_value`` is None or [B]
    already cleaned by the caller (NaN -> 0)."""
    prep = _prepare(rewards, values, mask, last_value)
    if prep is None:
        return None
    (vk, mk, threads), (r, v, m, lv), (adv, tgt) = prep
    B, T = r.shape
    if B * T:
        _native.gae(*map(_addr, (r, v, m, lv, adv, tgt)), B, T, float(gamma), float(lam), vk, mk, threads)
    return adv, tgt


def turn_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma: float,
    lam: float,
    turn_ids: Tensor | None,
    last_value: Tensor | None,
) -> tuple[Tensor, Tensor] | None:
    """Turn-level GAE through the kernel, or None (as :func:`gae`); ``turn_ids`` None or [B, T]."""
    prep = _prepare(rewards, values, mask, last_value)
    if prep is None or (turn_ids is not None and turn_ids.device.type != "cpu"):
        return None
    (vk, mk, threads), (r, v, m, lv), (adv, tgt) = prep
    ids = None if turn_ids is None else turn_ids.to(torch.int64).contiguous()
    B, T = r.shape
    if B * T:
        _native.turn_gae(
            *map(_addr, (r, v, m, ids, lv, adv, tgt)), B, T, float(gamma), float(lam), vk, mk, threads
        )
    return adv, tgt


def span_gae(
    rewards: Tensor, values: Tensor | None, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor] | None:
    """SkyRL's GAE (``values`` given) or discounted returns (``values`` None: V = 0, use
    ``lam = 1``) over each row's response span, its first to last policy token, tool tokens
    stepped through; the advantages whitened over the spans (unbiased, ``masked_whiten``) in one
    pass plus a pass over the policy tokens. Returns (whitened advantages, A + V), both 0 off the
    policy mask, in ``values``' dtype (float32 without values); None when the kernel does not
    apply (the caller falls back). ``rewards`` must be float32 (SkyRL's reward tensor); fewer than
    two span positions in the batch give advantages of 0, as ``whiten_unbiased`` does."""
    if not enabled() or _native is None or rewards.dtype != torch.float32:
        return None
    dtype = torch.float32 if values is None else values.dtype
    vk, mk = _V_KINDS.get(dtype), _M_KINDS.get(mask.dtype)
    if vk is None or mk is None:
        return None
    if any(x is not None and x.device.type != "cpu" for x in (rewards, values, mask)):
        return None
    m = _mask_buffer(mask)
    r = rewards.contiguous()
    v = None if values is None else values.contiguous()
    B, T = r.shape
    adv, tgt = torch.empty(B, T, dtype=dtype), torch.empty(B, T, dtype=dtype)
    if B * T:
        threads = _threads(B * T)
        n = _native.span_gae(
            *map(_addr, (r, v, m, adv, tgt)), B, T, float(gamma), float(lam), vk, mk, threads
        )
        if n < 2:
            adv.zero_()
    return adv, tgt


def row_broadcast(a: Tensor, mask: Tensor, select: bool = False) -> Tensor | None:
    """[B, T] ``a[:, None] * mask`` in ``a``'s dtype (``a`` [B] float32/float64, ``mask`` [B, T]),
    or ``torch.where(mask != 0, a[:, None], 0)`` with ``select`` or a bool mask, in one pass
    without converting the mask first; None when the kernel does not apply (the caller falls
    back to the torch expression, which gives the same numbers)."""
    if not enabled() or _native is None or a.ndim != 1 or mask.ndim != 2 or a.shape[0] != mask.shape[0]:
        return None
    vk, mk = _V_KINDS.get(a.dtype), _M_KINDS.get(mask.dtype)
    if vk is None or mk is None or a.device.type != "cpu" or mask.device.type != "cpu":
        return None
    sel = select or mask.dtype == torch.bool
    m = _mask_buffer(mask)
    ac = a.contiguous()
    B, T = m.shape
    out = torch.empty(B, T, dtype=a.dtype)
    if B * T:
        threads = _threads(B * T)
        _native.row_broadcast(ac.data_ptr(), m.data_ptr(), out.data_ptr(), B, T, vk, mk, int(sel), threads)
    return out


def row_counts(mask: Tensor) -> Tensor | None:
    """[B] int64 ``(mask != 0).sum(-1)`` in one pass over ``mask`` [B, T] (no bool copy), or None
    when the kernel does not apply."""
    if not enabled() or _native is None or mask.ndim != 2 or mask.device.type != "cpu":
        return None
    mk = _M_KINDS.get(mask.dtype)
    if mk is None:
        return None
    m = _mask_buffer(mask)
    B, T = m.shape
    out = torch.zeros(B, dtype=torch.int64)
    if B * T:
        _native.row_counts(m.data_ptr(), out.data_ptr(), B, T, mk)
    return out


def masked_returns(
    rewards: Tensor, mask: Tensor, gamma: float, baseline: Tensor | None = None
) -> tuple[Tensor, Tensor | None] | None:
    """(returns, returns - baseline[:, None]) over the policy tokens of ``mask``: what :func:`gae`
    gives with V = 0 and lambda = 1 (the same arithmetic), without a values array; both 0 off the
    mask, in ``rewards``' dtype (float32/float64); the second None without ``baseline`` [B]. None
    when the kernel does not apply."""
    if not enabled() or _native is None or rewards.ndim != 2 or rewards.shape != mask.shape:
        return None
    vk, mk = _V_KINDS.get(rewards.dtype), _M_KINDS.get(mask.dtype)
    if vk is None or mk is None or rewards.device.type != "cpu" or mask.device.type != "cpu":
        return None
    m = _mask_buffer(mask)
    r = rewards.contiguous()
    B, T = r.shape
    base = None if baseline is None else baseline.to(device="cpu", dtype=r.dtype).reshape(B).contiguous()
    ret = torch.empty(B, T, dtype=r.dtype)
    adv = None if base is None else torch.empty(B, T, dtype=r.dtype)
    if B * T:
        threads = _threads(B * T)
        _native.masked_returns(*map(_addr, (r, m, base, ret, adv)), B, T, float(gamma), vk, mk, threads)
    return ret, adv


def otb(
    rewards: Tensor,
    mask: Tensor,
    exp_logprobs: Tensor,
    sum_pi_squared: Tensor,
    groups: Tensor,
    member: Tensor,
    use_baseline: Tensor,
    tail_from: Tensor,
    n_groups: int,
    width: int,
    tir: bool,
) -> tuple[Tensor, Tensor] | None:
    """(advantages, returns) of verl's optimal token baseline (``tir``: the multi-turn one, by the
    ordinal of the policy token) in three passes per row; the group bookkeeping comes from the
    caller (``estimators/dialects/verl.py``): ``groups`` [B] group ids, ``member`` [B] rows that
    count in their group, ``use_baseline`` [B] rows that get one, ``tail_from`` [B] the column
    (ordinal) from which their baseline is 0, ``width`` columns (T, or the most policy tokens in a
    row). ``rewards``, ``exp_logprobs`` (``torch.exp(logprobs)``), ``sum_pi_squared`` [B, T] of
    one float dtype. None when the kernel does not apply."""
    if not enabled() or _native is None:
        return None
    vk, mk = _V_KINDS.get(rewards.dtype), _M_KINDS.get(mask.dtype)
    if (
        vk is None
        or mk is None
        or exp_logprobs.dtype != rewards.dtype
        or sum_pi_squared.dtype != rewards.dtype
    ):
        return None
    if any(x.device.type != "cpu" for x in (rewards, mask, exp_logprobs, sum_pi_squared, groups)):
        return None
    m = _mask_buffer(mask)
    B, T = rewards.shape
    r, e, spp = rewards.contiguous(), exp_logprobs.contiguous(), sum_pi_squared.contiguous()
    grp = groups.to(torch.int64).contiguous()
    mem = member.to(torch.uint8).contiguous()
    use = use_baseline.to(torch.uint8).contiguous()
    tail = tail_from.to(torch.int64).contiguous()
    ret, adv = torch.empty(B, T, dtype=r.dtype), torch.empty(B, T, dtype=r.dtype)
    num = torch.zeros(n_groups, width, dtype=r.dtype)
    den = torch.zeros(n_groups, width, dtype=r.dtype)
    if B * T:
        bufs = (r, m, e, spp, grp, mem, use, tail, ret, adv, num, den)
        _native.otb(*map(_addr, bufs), B, T, n_groups, width, int(tir), vk, mk)
    return adv, ret
