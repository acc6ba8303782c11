"""creditlens service: store episodes, compute per-token advantages, render them."""

import os

# torch's CPU allocator aligns its blocks of 2 MB and more to transparent huge pages (madvise) when
# this is set, which it reads once, at its first allocation: so here, before anything in the service
# imports torch. A step audit's [512, 8192] float64 tensors are 32 MB each, served fresh by mmap
# (above glibc's largest mmap threshold, app/malloc.py) and faulted in page by page: with huge pages
# that is 512x fewer faults, and the audit of bench/retention.py's step took 1.7-2.3 s instead of
# 3.0-3.8 s on a 2-core machine. A value in the environment wins.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
