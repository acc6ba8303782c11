"""Outcome/group estimators: per-episode scores ``[B]`` and group labels ``[B]`` -> advantages ``[B]``.

All group statistics come from one vectorised helper, :func:`group_stats` (labels -> inverse ids
with ``torch.unique``; counts, sums and centred sums of squares with ``index_add`` in float64; no
per-sample Python loop). Labels may be any integer/float tensor or a sequence of hashables (e.g.
uuid strings); groups need not be contiguous. ``groups: Labels = None`` means the whole batch is ONE group.

All-equal groups: the mean is computed relative to the group's minimum, so centred scores of an
all-equal group are exactly 0 and every estimator below gives exactly 0 there (verl can give
~1e-11 from rounding).

Singleton groups (documented per function; verl 0.9.1's behaviour is the default wherever verl
has the estimator):

=============================  ============================  =======================================
estimator                      singleton                     verl 0.9.1
=============================  ============================  =======================================
group_mean                     0 (s - s)                     (not in verl)
grpo                           s / (1 + eps) [#]_            same (grpo, grpo_vectorized)
dr_grpo                        s                             same (grpo with norm off)
rloo                           s (``singleton="score"``)     rloo: s; rloo_vectorized: 0 (``"zero"``)
batch_whiten                   (no groups)                   (not in verl as an outcome estimator)
group_center_batch_scale       s / batch scale               (not in verl)
opo, gpg                       baseline 0, so s (gpg: x α)   same
grpo_passk                     ValueError                    same
=============================  ============================  =======================================

.. [#] ``1 + eps`` rounded to float32, as verl computes it (1.00000095 for eps = 1e-6).

Epsilons: grpo adds ``eps=1e-6`` to the std (verl); batch_whiten and group_center_batch_scale add
``eps=1e-6`` to the std as well; :func:`estimators.stats.whiten` adds 1e-8 to the variance (verl).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "GroupStats",
    "group_ids",
    "group_stats",
    "group_mean",
    "grpo",
    "dr_grpo",
    "rloo",
    "batch_whiten",
    "group_center_batch_scale",
    "opo",
    "gpg",
    "grpo_passk",
]


# Group labels: a tensor, a numpy array or a sequence of hashables (e.g. uuid strings); None = one group.
Labels = Tensor | np.ndarray | Sequence[Hashable] | None


def group_ids(groups: Labels, B: int, device: torch.device | str | None = None) -> tuple[Tensor, int]:
    """(inverse ids [B] long in [0, G), G) for any labels; ``None`` = one group of all B rows."""
    if groups is None:
        return torch.zeros(B, dtype=torch.long, device=device), (1 if B else 0)
    if isinstance(groups, Tensor):
        if groups.numel() != B:
            raise ValueError(f"groups must have B={B} labels, got {groups.numel()}")
        _, inv = torch.unique(groups.reshape(-1), return_inverse=True)
    else:
        labels = np.asarray(list(groups) if not isinstance(groups, np.ndarray) else groups, dtype=object)
        if labels.size != B:
            raise ValueError(f"groups must have B={B} labels, got {labels.size}")
        _, inv_np = np.unique(labels.astype(str) if labels.size else labels, return_inverse=True)
        inv = torch.as_tensor(inv_np.reshape(-1), dtype=torch.long)
    inv = inv.to(device=device, dtype=torch.long)
    return inv, (int(inv.max().item()) + 1 if B else 0)


@dataclass
class GroupStats:
    """Per-row views of the statistics of each row's group (all float64, shape [B]).

    inverse: [B] long group id; n_groups: G; count: group size; mean: group mean;
    centered: s - group mean (exactly 0 in all-equal groups); m2: the group's sum of squared
    deviations; gcount/gsum/gm2: the same per group ([G]).
    """

    inverse: Tensor
    n_groups: int
    count: Tensor
    mean: Tensor
    centered: Tensor
    m2: Tensor
    gcount: Tensor
    gm2: Tensor

    def std(self, kind: str = "sample") -> Tensor:
        """[B] group std: ``"sample"`` (n-1, torch.std/verl; NaN for singletons) or ``"population"`` (n)."""
        if kind == "sample":
            return torch.sqrt(self.m2 / (self.count - 1))
        if kind == "population":
            return torch.sqrt(self.m2 / self.count)
        raise ValueError(f"std must be 'sample' or 'population', got {kind!r}")


def _scores(scores: Tensor | Sequence[float]) -> Tensor:
    s = torch.as_tensor(scores)
    if s.ndim != 1:
        raise ValueError(f"scores must be [B], got shape {tuple(s.shape)}")
    return s


def group_stats(scores: Tensor, groups: Labels = None) -> GroupStats:
    """Group statistics of ``scores`` [B] under ``groups`` [B] (see :class:`GroupStats`)."""
    s = _scores(scores).double()
    B = s.numel()
    inv, G = group_ids(groups, B, s.device)
    ones = torch.ones_like(s)
    gcount = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, ones)
    # Shift by the group minimum: exact zeros for all-equal groups, no loss for large offsets.
    gmin = torch.full((G,), torch.inf, dtype=torch.float64, device=s.device)
    gmin = gmin.scatter_reduce(0, inv, s, reduce="amin", include_self=True)
    shifted = s - gmin[inv]
    gshift_mean = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, shifted) / gcount
    centered = shifted - gshift_mean[inv]
    gm2 = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, centered * centered)
    return GroupStats(
        inverse=inv,
        n_groups=G,
        count=gcount[inv],
        mean=(gmin + gshift_mean)[inv],
        centered=centered,
        m2=gm2[inv],
        gcount=gcount,
        gm2=gm2,
    )


def _like(out: Tensor, scores: Tensor | Sequence[float]) -> Tensor:
    s = torch.as_tensor(scores)
    return out.to(s.dtype if s.is_floating_point() else torch.get_default_dtype())


def group_mean(scores: Tensor, groups: Labels = None) -> Tensor:
    """[B] ``s_i - mean(group)`` (the group-mean baseline). Singleton: 0."""
    st = group_stats(scores, groups)
    return _like(st.centered, scores)


def grpo(
    scores: Tensor, groups: Labels = None, std: str = "sample", eps: float = 1e-6, norm: bool = True
) -> Tensor:
    """[B] GRPO: ``(s_i - mean) / (std + eps)`` per group; ``norm=False`` gives ``s_i - mean``.

    ``std="sample"`` (n-1; torch.std and verl) or ``"population"`` (n). ``eps`` is added to the std.
    Singleton groups follow verl: mean 0 and std 1, i.e. ``s / (1 + eps)`` (``s`` without norm).
    All-equal groups give exactly 0.
    """
    st = group_stats(scores, groups)
    single = st.count == 1
    s = _scores(scores).double()
    centered = torch.where(single, s, st.centered)
    if not norm:
        return _like(centered, scores)
    # verl evaluates a singleton's ``std + eps`` as float32 ``1 + 1e-6`` = 1.00000095; we round
    # the same way so singleton rows match verl to the last bit.
    one_eps = float(torch.tensor(1.0, dtype=torch.float32) + eps)
    denom = torch.where(single, torch.full_like(s, one_eps), st.std(std) + eps)
    return _like(centered / denom, scores)


def dr_grpo(scores: Tensor, groups: Labels = None) -> Tensor:
    """[B] Dr. GRPO (Liu et al., 2025): ``s_i - group mean``, no std division (verl's grpo with
    ``norm_adv_by_std_in_grpo=False``). Singleton: ``s`` (verl's mean-0 rule)."""
    return grpo(scores, groups, norm=False)


def rloo(scores: Tensor, groups: Labels = None, singleton: str = "score") -> Tensor:
    """[B] RLOO: ``s_i - mean of the other members = n/(n-1) (s_i - mean)``.

    Singleton: ``singleton="score"`` keeps ``s`` (verl's rloo) or ``"zero"`` gives 0 (verl's
    rloo_vectorized).
    """
    if singleton not in ("score", "zero"):
        raise ValueError(f"singleton must be 'score' or 'zero', got {singleton!r}")
    st = group_stats(scores, groups)
    n = st.count
    single = n == 1
    a = st.centered * n / torch.where(single, torch.ones_like(n), n - 1)
    s = _scores(scores).double()
    a = torch.where(single, s if singleton == "score" else torch.zeros_like(s), a)
    return _like(a, scores)


def batch_whiten(
    scores: Tensor,
    groups: Labels = None,  # noqa: ARG001 (the call shape of every group baseline; the batch is one group)
    std: str = "sample",
    eps: float = 1e-6,
) -> Tensor:
    """[B] ``(s_i - batch mean) / (batch std + eps)``: episode-level whitening across the batch;
    ``groups`` is ignored. One row gives 0 (its std is taken as 0).
    Each episode counts once (verl's token-level whitening weights long responses more)."""
    st = group_stats(scores, None)
    sd = torch.nan_to_num(st.std(std))  # one row: NaN sample std -> 0
    return _like(st.centered / (torch.nan_to_num(sd) + eps), scores)


def group_center_batch_scale(
    scores: Tensor, groups: Labels = None, scale_of: str = "scores", std: str = "sample", eps: float = 1e-6
) -> Tensor:
    """[B] centre within the group, scale by one batch-wide std.

    ``(s_i - group mean) / (std_batch + eps)`` where std_batch is the std of the raw scores over the
    batch (``scale_of="scores"``, as in LitePPO) or of the group-centred scores (``"centered"``).
    Keeps the within-group comparison without GRPO's per-group difficulty weighting. Singleton: 0
    (it is centred on itself); all-equal groups: 0.
    """
    st = group_stats(scores, groups)
    if scale_of == "scores":
        ref = group_stats(scores, None)
        sd = ref.std(std)
    elif scale_of == "centered":
        c = st.centered
        n = c.numel()
        var = (c - c.mean()).square().sum() / (n - 1 if std == "sample" else n) if n > 1 else c.new_zeros(())
        sd = torch.sqrt(var).expand_as(c)
    else:
        raise ValueError(f"scale_of must be 'scores' or 'centered', got {scale_of!r}")
    sd = torch.nan_to_num(sd)
    return _like(st.centered / (sd + eps), scores)


def opo(scores: Tensor, groups: Labels, lengths: Tensor) -> Tensor:
    """[B] OPO: ``s_i - b_g`` with the length-weighted group baseline ``b_g = sum L s / sum L``
    (``lengths`` [B] = number of policy tokens). Singleton: b = 0 (verl). A group of total length 0
    gets b = 0 here (verl: NaN)."""
    s = _scores(scores).double()
    L = torch.as_tensor(lengths, dtype=torch.float64, device=s.device)
    inv, G = group_ids(groups, s.numel(), s.device)
    cnt = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, torch.ones_like(s))
    num = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, L * s)
    den = torch.zeros(G, dtype=torch.float64, device=s.device).index_add_(0, inv, L)
    b = torch.where((cnt > 1) & (den > 0), num / torch.where(den > 0, den, 1.0), 0.0)
    return _like(s - b[inv], scores)


def gpg(scores: Tensor, groups: Labels = None, f_norm: float = 1.0) -> Tensor:
    """[B] GPG: ``alpha (s_i - group mean) / f_norm`` with ``alpha = B / max(#{s != 0}, 1)`` over
    the whole batch. Singleton: mean 0 (verl), so ``alpha s / f_norm``."""
    s = _scores(scores).double()
    st = group_stats(s, groups)
    alpha = s.numel() / max(int((s != 0).sum().item()), 1)
    centered = torch.where(st.count == 1, s, st.centered)
    return _like(alpha * centered / f_norm, scores)


def grpo_passk(
    scores: Tensor, groups: Labels = None, norm: bool = True, std: str = "sample", eps: float = 1e-6
) -> Tensor:
    """[B] Pass@k GRPO (verl's grpo_passk): only the best row of each group gets
    ``s_max - s_second`` (divided by ``std + eps`` if ``norm``); every other row gets 0. A tied
    top gives 0. Every group must have >= 2 members (ValueError otherwise, as verl)."""
    s = _scores(scores).double()
    st = group_stats(s, groups)
    if bool((st.gcount < 2).any()):
        raise ValueError("grpo_passk needs at least 2 members in every group")
    inv, G = st.inverse, st.n_groups
    gmax = torch.full((G,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inv, s, "amax")
    is_max = s == gmax[inv]
    nmax = torch.zeros(G, dtype=torch.float64).index_add_(0, inv, is_max.double())
    below = torch.where(is_max, -torch.inf, s)
    second = torch.full((G,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inv, below, "amax")
    second = torch.where(nmax > 1, gmax, second)
    a = torch.where(is_max & (nmax[inv] == 1), gmax[inv] - second[inv], 0.0)
    if norm:
        a = a / (st.std(std) + eps)
    return _like(a, scores)
