"""Which episodes of a run step are kept in full (``"keep": N`` on ``POST /api/runs``).

The step's metrics, audit, search fields and prompt history are computed over every episode
before this runs; what it chooses is only what is stored. The kept episodes are whole groups
(an ungrouped episode is a group of its own, app/core/domain.py), chosen in this order:

1. flagged groups (an episode with an error finding, or with credit on prompt or tool tokens:
   app/compute/episode_fields.py), most flagged episodes first;
2. the telling groups, taking in turn the one with the largest |A|, the one with the highest
   reward and the one with the lowest, until three quarters of ``keep`` are used;
3. random groups (a generator seeded by the step, so a re-post keeps the same ones) for the rest.

A group is taken only when it fits in what is left of ``keep``; a step whose groups are all
larger than ``keep`` keeps its first choice whole all the same (a step is never stored empty).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from app.core import domain

TELLING_SHARE = 0.75


def _order_by(
    values: np.ndarray, groups: list[list[int]], reduce: Callable[[np.ndarray], float], descending: bool
) -> list[int]:
    """Group indices ordered by ``reduce`` of their members' values (NaN: none, last)."""
    keyed = []
    for gi, members in enumerate(groups):
        v = values[members]
        v = v[~np.isnan(v)]
        if len(v):
            x = float(reduce(v))
            keyed.append((-x if descending else x, gi))
    return [gi for _, gi in sorted(keyed)]


def choose(
    labels: Sequence[str | None],
    flagged: Sequence[bool],
    max_abs_adv: Sequence[float | None],
    reward: Sequence[float | None],
    keep: int,
    seed: int = 0,
) -> list[int]:
    """The indices of the episodes to keep, in upload order (see the module docstring)."""
    n = len(labels)
    if n <= keep:
        return list(range(n))
    groups = list(domain.groups(labels).values())
    flags = np.asarray(flagged, dtype=bool)
    adv = np.array([np.nan if x is None else x for x in max_abs_adv], dtype=np.float64)
    rew = np.array([np.nan if x is None else x for x in reward], dtype=np.float64)
    chosen: list[int] = []
    taken: set[int] = set()
    used = 0

    def take(gi: int) -> None:
        nonlocal used
        if gi in taken or used + len(groups[gi]) > keep:
            return
        taken.add(gi)
        chosen.append(gi)
        used += len(groups[gi])

    n_flags = [int(flags[m].sum()) for m in groups]
    for gi in sorted((gi for gi, k in enumerate(n_flags) if k), key=lambda gi: (-n_flags[gi], gi)):
        take(gi)
    orders = [
        _order_by(adv, groups, np.max, descending=True),
        _order_by(rew, groups, np.max, descending=True),
        _order_by(rew, groups, np.min, descending=False),
    ]
    flagged_first = next((gi for gi, k in enumerate(n_flags) if k), None)
    fallback = flagged_first if flagged_first is not None else (orders[0] or [0])[0]
    telling = int(keep * TELLING_SHARE)
    k = 0
    while used < telling and any(orders):
        order = orders[k % len(orders)]
        k += 1
        while order and order[0] in taken:
            order.pop(0)
        if order:
            take(order.pop(0))  # one that does not fit is passed over
    for gi in np.random.default_rng(seed).permutation(len(groups)).tolist():
        if used >= keep:
            break
        take(int(gi))
    if not chosen:  # every group is larger than keep: the first choice, whole
        chosen.append(fallback)
    return sorted(i for gi in chosen for i in groups[gi])
