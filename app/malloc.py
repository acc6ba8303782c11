"""glibc malloc settings for the server process.

By default glibc gives freed blocks of a few MB back to the kernel (mmap'd blocks, and heap tops
above a moving trim threshold), so the next tensor of that size is faulted in again page by page:
for the [256, 8192] GAE outputs that is ~4,000 page faults per call, 2-3x the time of the
computation (bench/estimators.py prints both). Keeping up to ``trim_mb`` of free heap and serving
blocks below 32 MB from the heap avoids that. Linux/glibc only; elsewhere this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit


def tune_malloc(trim_mb: int = 256) -> bool:
    """Apply the settings; True when glibc accepted them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) == 1 and mallopt(M_TRIM_THRESHOLD, trim_mb << 20) == 1
    )
