"""The rest of verl 0.9.1's estimator registry, vectorised (no loop over samples or time).

Each function matches its verl counterpart on policy positions (tested to 1e-9 in float64, see
``tests/estimators/test_est_verl.py``). Where we differ, on purpose:

* Inputs are episode scores computed by the caller; verl sums rewards over the whole row without
  the mask (the registry wrappers offer ``score="unmasked"`` for parity).
* Every output is 0 on mask-0 positions. verl's ReMax returns/advantages and OTB/TIR returns keep the
  suffix sum on interior holes.
* ``reinforce_plus_plus_baseline`` / ``reinforce_plus_plus`` whiten with :func:`stats.whiten`
  (verl's global, token-weighted, unbiased masked whitening, eps 1e-8 on the variance). With fewer
  than 2 policy tokens in the batch verl raises ValueError; we return 0 advantages.
* OTB/TIR group members: as verl, a group with one member has baseline 0 (advantage = return);
  TIR excludes rows with no policy token from groups.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ._scan import as_bool_mask, compress
from .groups import Labels, group_ids, group_stats
from .stats import whiten
from .token import returns_to_go

__all__ = [
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "reinforce_plus_plus_baseline_rows",
    "remax",
    "optimal_token_baseline",
    "tir_optimal_token_baseline",
]


def _whiten_or_zero(x: Tensor, m: Tensor) -> Tensor:
    """verl's global masked whitening times the mask; 0 when the batch has fewer than 2 policy
    tokens (verl raises ValueError there: there is nothing to whiten against)."""
    if int(m.sum().item()) < 2:
        return torch.zeros_like(x)
    return whiten(x, m) * m


@torch.no_grad()
def reinforce_plus_plus(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (verl): ``(advantages, returns)`` [B, T]; returns are the masked discounted
    returns-to-go, advantages their global masked whitening over the batch, 0 off-mask."""
    m = as_bool_mask(mask)
    g = returns_to_go(rewards, m, gamma)
    return _whiten_or_zero(g, m), g


@torch.no_grad()
def reinforce_plus_plus_baseline(scores: Tensor, mask: Tensor, groups: Labels = None) -> Tensor:
    """REINFORCE++ with a group baseline (verl): ``s_i - group mean`` (singleton: mean 0, so s),
    broadcast onto the policy tokens and whitened globally over all policy tokens (so longer
    responses weigh more), 0 off-mask. Returns [B, T]."""
    m = as_bool_mask(mask)
    s = torch.as_tensor(scores)
    st = group_stats(s, groups)
    centered = torch.where(st.count == 1, s.double(), st.centered)
    dtype = s.dtype if s.is_floating_point() else torch.get_default_dtype()
    x = centered.to(dtype)[:, None] * m.to(dtype)
    return _whiten_or_zero(x, m)


@torch.no_grad()
def reinforce_plus_plus_baseline_rows(scores: Tensor, groups: Labels, lengths: Tensor) -> Tensor:
    """[B] :func:`reinforce_plus_plus_baseline` of episodes given as summaries: the centred score
    (singleton: the score) sits on each of an episode's ``lengths`` policy tokens, so verl's global
    masked whitening over the batch's tokens is a ``lengths``-weighted whitening of [B] values, with
    verl's denominators (``N + 1e-8`` and N/(N-1), float64 as :func:`stats.whiten`). O(B)."""
    s = torch.as_tensor(scores).double()
    st = group_stats(s, groups)
    c = torch.where(st.count == 1, s, st.centered)
    w = torch.as_tensor(lengths).to(torch.float64)
    n = w.sum()
    if int(n.item()) < 2:  # fewer than 2 policy tokens: nothing to whiten against
        return torch.zeros_like(s)
    mean = (c * w).sum() / (n + 1e-8)
    var = ((c - mean) ** 2 * w).sum() / (n + 1e-8) * (n / (n - 1))
    return (c - mean) * torch.rsqrt(var + 1e-8)


@torch.no_grad()
def remax(rewards: Tensor, mask: Tensor, reward_baselines: Tensor) -> tuple[Tensor, Tensor]:
    """ReMax (verl): ``returns`` = undiscounted masked returns-to-go, ``advantages = returns - b``
    with ``b`` [B] the greedy response's reward; both [B, T], 0 off-mask (verl: nonzero on holes)."""
    m = as_bool_mask(mask)
    g = returns_to_go(rewards, m, 1.0)
    b = torch.as_tensor(reward_baselines, dtype=g.dtype, device=g.device).reshape(-1, 1)
    return (g - b) * m, g


def _otb_weights(logprobs: Tensor, sum_pi_squared: Tensor, m: Tensor, is_weights: Tensor | None) -> Tensor:
    """W_t = sum_{j <= t, policy} (1 - 2 pi_j + sum_v pi(v)^2) [x rho_j^2]: cumulative path variance."""
    w = 1 - 2 * torch.exp(logprobs) + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights**2
    return torch.cumsum(torch.where(m, w, 0), 1)


def _zero_tail_rows(lengths: Tensor, inv: Tensor, G: int, valid: Tensor) -> tuple[Tensor, Tensor]:
    """(row has the unique longest length of its group [B] bool, second-longest length of its group [B])."""
    L = torch.where(valid, lengths, -1)
    gmax = torch.full((G,), -1, dtype=torch.long).scatter_reduce(0, inv, L, "amax")
    is_max = valid & (L == gmax[inv])
    nmax = torch.zeros(G, dtype=torch.long).index_add_(0, inv, is_max.long())
    below = torch.where(is_max, -1, L)
    second = torch.full((G,), -1, dtype=torch.long).scatter_reduce(0, inv, below, "amax")
    return is_max & (nmax[inv] == 1), second[inv]


def _group_baseline(ret: Tensor, W: Tensor, inv: Tensor, G: int, member: Tensor, eps: float) -> Tensor:
    """[B, X] per-group, per-column ``sum_i G W / (sum_i W + eps)`` over member rows; 0 for rows
    whose group has a single member (and for non-members)."""
    X = ret.shape[1]
    wm = torch.where(member[:, None], W, 0)
    num = torch.zeros(G, X, dtype=ret.dtype, device=ret.device).index_add_(0, inv, ret * wm)
    den = torch.zeros(G, X, dtype=ret.dtype, device=ret.device).index_add_(0, inv, wm)
    cnt = torch.zeros(G, dtype=torch.long, device=ret.device).index_add_(0, inv, member.long())
    b = num / (den + eps)
    return torch.where((member & (cnt[inv] > 1))[:, None], b[inv], 0)


@torch.no_grad()
def optimal_token_baseline(
    rewards: Tensor,
    mask: Tensor,
    groups: Labels,
    logprobs: Tensor,
    sum_pi_squared: Tensor,
    is_weights: Tensor | None = None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """Optimal token baseline (verl's ``optimal_token_baseline``): ``(advantages, returns)`` [B, T].

    ``returns`` G = undiscounted masked returns-to-go; per group and per *column* t,
    ``b_t = sum_i G_it W_it / (sum_i W_it + eps)`` over policy entries, W the cumulative path
    variance (see ``_otb_weights``); advantages ``(G - b) * mask``. Singleton groups: b = 0.
    ``handle_zero_tail``: the unique longest row of a group gets b = 0 from the second-longest
    length on (columns, i.e. assumes right padding, as verl).
    """
    m = as_bool_mask(mask)
    B, T = m.shape
    g = returns_to_go(rewards, m, 1.0)
    W = _otb_weights(logprobs.to(g.dtype), sum_pi_squared.to(g.dtype), m, is_weights)
    inv, G = group_ids(groups, B, g.device)
    member = torch.ones(B, dtype=torch.bool, device=g.device)
    b = _group_baseline(g, torch.where(m, W, 0), inv, G, member, eps)
    if handle_zero_tail and B:
        lengths = m.sum(1)
        uniq, second = _zero_tail_rows(lengths, inv, G, member)
        cnt = torch.zeros(G, dtype=torch.long).index_add_(0, inv, torch.ones_like(inv))
        cols = torch.arange(T, device=g.device)[None, :]
        tail = (uniq & (cnt[inv] > 1))[:, None] & (cols >= second[:, None])
        b = b.masked_fill(tail, 0)
    return (g - b) * m, g


@torch.no_grad()
def tir_optimal_token_baseline(
    rewards: Tensor,
    mask: Tensor,
    groups: Labels,
    logprobs: Tensor,
    sum_pi_squared: Tensor,
    is_weights: Tensor | None = None,
    handle_zero_tail: bool = True,
    eps: float = 1e-8,
) -> tuple[Tensor, Tensor]:
    """Multi-turn OTB (verl's ``tir_optimal_token_baseline``): as :func:`optimal_token_baseline`
    but positions are aligned by the *ordinal* of the policy token, not the column, so tool spans
    do not misalign the group. Rows without policy tokens are left out of groups (advantage 0).
    Identical to OTB for right-padded masks without holes."""
    m = as_bool_mask(mask)
    B, T = m.shape
    g = returns_to_go(rewards, m, 1.0)
    W = _otb_weights(logprobs.to(g.dtype), sum_pi_squared.to(g.dtype), m, is_weights)
    lay = compress(m)
    gc, wc = lay.scatter(g), lay.scatter(W)
    inv, G = group_ids(groups, B, g.device)
    member = lay.counts > 0
    b = _group_baseline(gc, wc, inv, G, member, eps)
    if handle_zero_tail and B:
        uniq, second = _zero_tail_rows(lay.counts, inv, G, member)
        cnt = torch.zeros(G, dtype=torch.long).index_add_(0, inv, member.long())
        ordinal = torch.arange(lay.width, device=g.device)[None, :] - 1  # column 0 is the dummy
        tail = (uniq & (cnt[inv] > 1))[:, None] & (ordinal >= second[:, None])
        b = b.masked_fill(tail, 0)
    return lay.gather(gc - b), g
