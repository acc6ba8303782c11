"""The optional compiled kernel behind :func:`estimators.gae` (``estimators/_native.c``).

``pip install`` builds it when a C compiler is present (it is optional: without one the install
still succeeds). When it is built and the inputs are CPU tensors, ``gae`` makes one pass over
the data instead of the vectorised torch path's dozen; the numbers are the same recursion, run
in double (see ``tests/estimators/test_native.py``). Everything else falls back to the torch
path, which is always available:

* ``available()`` says whether the kernel is built;
* ``CREDITLENS_NATIVE=0`` in the environment, or ``with disabled():``, turns it off.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

import torch
from torch import Tensor

try:
    from . import _native  # type: ignore[attr-defined]
except ImportError:  # not built (no compiler at install time)
    _native = None

_V_KINDS = {torch.float32: 0, torch.float64: 1}
_M_KINDS = {torch.int64: 0, torch.int32: 1, torch.uint8: 2, torch.bool: 2, torch.float32: 3, torch.float64: 4}
_off = threading.local()


def available() -> bool:
    """True when the compiled kernel is built and importable."""
    return _native is not None


def enabled() -> bool:
    """True when :func:`estimators.gae` will use the kernel for CPU inputs."""
    return (
        _native is not None
        and not getattr(_off, "depth", 0)
        and os.environ.get("CREDITLENS_NATIVE", "1").strip().lower() not in ("0", "false", "no", "off")
    )


@contextmanager
def disabled():
    """Use the vectorised torch path inside this block (this thread only)."""
    _off.depth = getattr(_off, "depth", 0) + 1
    try:
        yield
    finally:
        _off.depth -= 1


def gae(
    rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float, last_value: Tensor | None
) -> tuple[Tensor, Tensor] | None:
    """Masked GAE through the kernel, or None when it does not apply (the caller falls back).

    ``rewards`` and ``values`` are [B, T] of the output dtype; ``last_value`` is None or [B]
    already cleaned by the caller (NaN -> 0)."""
    if not enabled():
        return None
    vk = _V_KINDS.get(rewards.dtype)
    mk = _M_KINDS.get(mask.dtype)
    if vk is None or mk is None or values.dtype != rewards.dtype:
        return None
    if any(x.device.type != "cpu" for x in (rewards, values, mask)):
        return None
    B, T = rewards.shape
    r = rewards.contiguous()
    v = values.contiguous()
    m = mask.contiguous()
    if m.dtype == torch.bool:
        m = m.view(torch.uint8)
    lv = None if last_value is None else last_value.to(device="cpu", dtype=torch.float64).contiguous()
    adv = torch.empty(B, T, dtype=r.dtype)
    tgt = torch.empty(B, T, dtype=r.dtype)
    if B * T:
        # Threads cost tens of microseconds to start: small batches run on one.
        threads = torch.get_num_threads() if B * T >= 1 << 16 else 1
        _native.gae(
            r.data_ptr(),
            v.data_ptr(),
            m.data_ptr(),
            0 if lv is None else lv.data_ptr(),
            adv.data_ptr(),
            tgt.data_ptr(),
            B,
            T,
            float(gamma),
            float(lam),
            vk,
            mk,
            threads,
        )
    return adv, tgt
