"""slime 0.3.1's advantages on our [B, T] layout (read, not run: slime is not on PyPI).

Code read (THUDM/slime; docs/conventions.md, "slime and miles", names the commits):

- ``slime/ray/rollout.py`` ``_post_process_rewards``: for ``grpo``/``gspo`` and
  ``reinforce_plus_plus_baseline`` (with ``rewards_normalization``, on unless
  ``--disable-rewards-normalization``) the sample rewards, as a float32 tensor, are reshaped to
  ``(-1, n_samples_per_prompt)`` and centred on the group mean; ``grpo``/``gspo`` also divide by
  ``std + 1e-6`` (``torch.std``: unbiased, so a group of one gives NaN) unless
  ``--disable-grpo-std-normalization``.
- ``slime/backends/megatron_utils/loss.py`` ``compute_advantages_and_returns`` and
  ``slime/utils/ppo_utils.py``: ``grpo`` (and ``gspo``, ``cispo``) broadcast that number over the
  whole response; ``reinforce_plus_plus`` puts the raw reward on the last loss-mask token and takes
  ``G_t = r_t + gamma G_{t+1}`` over every response token (tool tokens included: gamma once per
  tool token); ``reinforce_plus_plus_baseline`` broadcasts the centred reward; ``ppo`` puts the
  reward on the last response token and runs GAE over every response token (``chunked_gae``): the
  recursion steps through tool spans, decays gamma * lambda once per tool token and reads the
  critic's values there, and bootstraps 0 after the response whether it was truncated or not.
- ``--normalize-advantages`` (off by default): ``distributed_masked_whiten`` over the loss-mask
  tokens, statistics in float32 from one pass (``E[x^2] - E[x]^2``, times n/(n-1)), ``rsqrt(var + 1e-8)``.

Our layout: the response runs from a row's first to its last policy token (tool output inside it
has mask 0, as slime's loss mask), the sample's reward is the sum of the row's rewards at every
position (slime's reward is one number per sample), the KL term is 0 (``--kl-coef 0``, slime's
default). Groups come from ``EstimatorInput.groups``; contiguous blocks of one size run slime's own
reshape (the same rounding). Outputs are 0 off the policy mask (slime's loss masks them out).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .._scan import reverse_scan
from ..groups import group_ids
from ..registry import EstimatorInput, EstimatorOutput
from ._common import (
    Dialects,
    contiguous_size,
    float_dtype,
    last_policy,
    on_policy,
    policy,
    response_span,
    row_sums,
)

__all__ = ["group_rewards", "masked_whiten"]

_TRAINER = "slime"
_VERSION = "0.3.1"
_reg = Dialects(_TRAINER, _VERSION)
F32 = torch.float32


def group_rewards(r: Tensor, groups: Any, std_normalization: bool) -> Tensor:
    """slime's reward post-processing in float32: minus the group mean, over ``std + 1e-6``
    (unbiased std; NaN for a group of one) when ``std_normalization``."""
    r = r.to(F32)
    B = r.shape[0]
    if B == 0:
        return r
    n = contiguous_size(groups, B)
    if n is not None:  # slime's own rewards.reshape(-1, n_samples_per_prompt)
        g = r.reshape(-1, n)
        g = g - g.mean(dim=-1, keepdim=True)
        if std_normalization:
            g = g / (g.std(dim=-1, keepdim=True) + 1e-6)
        return g.reshape(-1)
    inv, G = group_ids(groups, B, r.device)
    count = torch.zeros(G, dtype=F32, device=r.device).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros(G, dtype=F32, device=r.device).index_add_(0, inv, r) / count
    c = r - mean[inv]
    if std_normalization:
        ss = torch.zeros(G, dtype=F32, device=r.device).index_add_(0, inv, c * c)
        std = (ss / (count - 1)).sqrt()  # 0 / 0 = NaN for a group of one, as torch.std
        c = c / (std[inv] + 1e-6)
    return c


def masked_whiten(x: Tensor, m: Tensor) -> Tensor:
    """slime's ``distributed_masked_whiten`` on one rank: float32 sums over the mask, one-pass
    variance with the n/(n-1) factor (n >= 2), ``(x - mean) * rsqrt(var + 1e-8)``."""
    mf = m.to(x.dtype)
    stats = torch.stack([(x * mf).sum(), ((x**2) * mf).sum(), mf.sum()]).to(F32)
    total, total_sq, n = stats[0], stats[1], stats[2]
    if float(n) == 0:
        raise ValueError("slime's advantage whitening needs at least one policy token")
    mean = total / n
    var = total_sq / n - mean**2
    if float(n) >= 2:
        var = var * n / (n - 1)
    return (x - mean) * torch.rsqrt(var + 1e-8)


def _finish(
    inp: EstimatorInput, adv: Tensor, returns: Tensor, normalize_advantages: bool, **extras: Any
) -> EstimatorOutput:
    m = policy(inp)
    dtype = float_dtype(inp)
    if normalize_advantages:
        adv = masked_whiten(adv, m)
    zero = torch.zeros((), dtype=adv.dtype, device=adv.device)
    return EstimatorOutput(
        advantages=torch.where(m, adv, zero).to(dtype),
        value_targets=torch.where(m, returns, torch.zeros((), dtype=returns.dtype)).to(dtype),
        extras=extras,
    )


def _outcome(inp: EstimatorInput, normalize: bool, std: bool, normalize_advantages: bool) -> EstimatorOutput:
    """The row's reward in float32 (minus its group mean when ``normalize``, over the group std
    too when ``std``) on every policy token."""
    r = row_sums(inp).to(F32)
    if normalize:
        r = group_rewards(r, inp.groups, std)
    adv = on_policy(r, policy(inp))
    return _finish(inp, adv, adv, normalize_advantages, episode_advantages=r.to(float_dtype(inp)))


@_reg(
    "grpo",
    label="GRPO",
    description=(
        "The row's reward minus its group mean, over the unbiased group std + 1e-6, in float32 "
        "(a group of one gives NaN, as torch.std); the same number on every policy token (slime's "
        "gspo and cispo use these advantages too)."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
    params={"rewards_normalization": True, "grpo_std_normalization": True, "normalize_advantages": False},
    reference="grpo",
)
def _grpo(
    inp: EstimatorInput,
    rewards_normalization: bool = True,
    grpo_std_normalization: bool = True,
    normalize_advantages: bool = False,
) -> EstimatorOutput:
    return _outcome(inp, rewards_normalization, grpo_std_normalization, normalize_advantages)


@_reg(
    "reinforce_plus_plus_baseline",
    label="REINFORCE++ baseline",
    description=(
        "The row's reward minus its group mean in float32, on every policy token; whitened over the "
        "batch's policy tokens only with normalize_advantages (off by default in slime)."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
    params={"rewards_normalization": True, "normalize_advantages": False},
    reference="reinforce_plus_plus_baseline",
)
def _rfpp_baseline(
    inp: EstimatorInput, rewards_normalization: bool = True, normalize_advantages: bool = False
) -> EstimatorOutput:
    return _outcome(inp, rewards_normalization, False, normalize_advantages)


@_reg(
    "reinforce_plus_plus",
    label="REINFORCE++",
    description=(
        "The row's raw reward on its last policy token, returns G = r + gamma G over every response "
        "token (gamma applied once per tool token too), float32; no whitening by default."
    ),
    kind="token",
    params={"normalize_advantages": False},
    reference="reinforce_plus_plus",
    departs=("gae_through_tool_spans",),
)
def _rfpp(inp: EstimatorInput, normalize_advantages: bool = False) -> EstimatorOutput:
    m = policy(inp)
    B, T = m.shape
    r = torch.zeros(B, T, dtype=F32, device=m.device)
    last = last_policy(m)
    rows = (last >= 0).nonzero().squeeze(1)
    r[rows, last[rows]] = row_sums(inp).to(F32)[rows]
    # Every position of the row is a step (tool tokens and the prompt alike); nothing after the end.
    g = reverse_scan(r, float(inp.gamma)) if T else r
    return _finish(inp, g, g, normalize_advantages)


@_reg(
    "ppo",
    label="PPO GAE",
    description=(
        "GAE over every response token: the reward (float32) on the last one, the recursion steps "
        "through tool spans (gamma * lambda per tool token) and reads the critic's values there; "
        "bootstrap 0 at the end, truncated or not."
    ),
    kind="token",
    reads=("rewards", "values"),
    params={"normalize_advantages": False},
    reference="token_gae",
    departs=("gae_through_tool_spans",),
)
def _ppo(inp: EstimatorInput, normalize_advantages: bool = False) -> EstimatorOutput:
    if inp.values is None:
        raise ValueError("slime:ppo needs values (a critic)")
    m = policy(inp)
    B, T = m.shape
    resp = response_span(m)
    dtype = torch.promote_types(F32, inp.values.dtype)
    # Values on every response token (tool tokens included), 0 outside the response (slime's
    # response tensor ends there: V after the last token is 0).
    v = torch.where(resp, inp.values.to(dtype), torch.zeros((), dtype=dtype))
    r = torch.zeros(B, T, dtype=dtype, device=m.device)
    last = last_policy(m)
    rows = (last >= 0).nonzero().squeeze(1)
    r[rows, last[rows]] = row_sums(inp).to(F32).to(dtype)[rows]
    if T == 0:
        return _finish(inp, r, r, normalize_advantages)
    next_v = torch.zeros_like(v)
    next_v[:, :-1] = v[:, 1:]
    delta = torch.where(resp, r + float(inp.gamma) * next_v - v, torch.zeros((), dtype=dtype))
    adv = reverse_scan(delta, float(inp.gamma) * float(inp.lam))
    return _finish(inp, adv, adv + v, normalize_advantages)
