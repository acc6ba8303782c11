"""SkyRL 0.3.0's advantages (``skyrl/backends/skyrl_train/utils/ppo_utils.py``, called by
``skyrl/train/trainer.py::compute_advantages_and_returns``), vectorised, on our [B, T] layout.

SkyRL's batch holds a row's response (right-aligned in its tensor) with a ``response_mask`` that
is 1 on every response token, tool output included, and a separate ``loss_mask`` (our policy
mask) used only by the loss. Its per-token rewards are a float32 tensor
(``convert_prompts_responses_to_batch_tensors``). So on our layout the dialects read the
**response span** (a row's first to last policy token) as SkyRL's response, with float32 rewards:

* ``gae``: the recursion ignores every mask: it steps through tool tokens (gamma * lambda once
  per token) and reads the critic's values and any reward there; V = 0 after the response. The
  advantages are then whitened over the response span (``masked_whiten``: unbiased, with the
  count's N/(N-1) in float32 as SkyRL's integer mask gives it, 1e-8 on the variance).
* ``reinforce++``: discounted returns stepping through tool tokens (no reset inside the
  response), whitened over the response span.
* ``grpo`` / ``rloo`` / ``maxrl``: the score is the sum of the row's rewards (SkyRL sums its
  response tensor: tool tokens included); ``grpo``: ``(s - mean) / (std + 1e-6)`` (``grpo_norm_by_std``; a group of one: mean 0,
  std 1); ``rloo``: ``n/(n-1) (s - mean)``, a group of one gets 0; ``maxrl``:
  ``(s - mean) / (mean + 1e-6)``, a group of one keeps its score.

Every output is 0 off the policy mask (SkyRL's loss mask). Truncated rows bootstrap nothing.
Groups come from ``inp.groups``; in contiguous blocks of one size (SkyRL's layout, n samples per
prompt in a row) the group statistics run as SkyRL's float32 reductions do.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import native
from .. import token as tok
from .._scan import as_bool_mask as policy_mask
from ..groups import group_stats
from ..registry import EstimatorInput, EstimatorOutput
from ._common import (
    Dialects,
    broadcast,
    contiguous_size,
    float_dtype,
    response_span,
)

VERSION = "0.3.0"
TRAINER = "skyrl"
_reg = Dialects(TRAINER, VERSION)
EPS = 1e-6


def _span_credit(
    r: Tensor, values: Tensor | None, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """(whitened advantages, A + V) of SkyRL's recursion over each row's response span (one step
    per token, tool tokens included; ``values`` None: V = 0, the discounted returns), both 0 off
    the policy mask, in ``values``' dtype (float32 without). The compiled kernel makes one pass
    and whitens the policy tokens in a second (``estimators.native.span_gae``). Without it, the
    same arithmetic in torch: the masked GAE scan in float64 with the span as its mask (after
    the response V = 0, nothing bootstrapped), rounded to the storage dtype, then whitened with
    float64 sums as the kernel does."""
    fused = native.span_gae(r, values, mask, gamma, lam)
    if fused is not None:
        return fused
    dtype = torch.float32 if values is None else values.dtype
    m = policy_mask(mask)
    span = response_span(m)
    r64 = r.to(torch.float64)
    v64 = torch.zeros_like(r64) if values is None else values.to(torch.float64)
    raw64, tgt64 = tok.gae(r64, v64, span, gamma, lam)
    raw, tgt = raw64.to(dtype), tgt64.to(dtype)
    zero = torch.zeros((), dtype=dtype)
    return _whiten_span(raw, span, m), torch.where(m, tgt, zero)


def _whiten_span(raw: Tensor, span: Tensor, m: Tensor) -> Tensor:
    """``masked_whiten(raw, span)`` (unbiased; ``raw`` is 0 off ``span``) on the policy tokens
    ``m``, 0 elsewhere, as ``estimators/_native.c`` computes it: the sums of ``raw`` and its
    square in float64, var = (sum x^2 / N - mean^2) * N/(N-1) with N/(N-1) in float32 (the
    trainers' integer mask), ``(x - mean) * rsqrt(var + 1e-8)`` in ``raw``'s dtype. Fewer than two
    span positions: 0 (SkyRL raises)."""
    n = int(torch.count_nonzero(span).item())
    if n < 2:
        return torch.zeros_like(raw)
    flat = raw.reshape(-1).to(torch.float64)
    mean = flat.sum() / n
    bessel = torch.tensor(float(n), dtype=torch.float32) / torch.tensor(float(n - 1), dtype=torch.float32)
    var = (torch.dot(flat, flat) / n - mean * mean) * bessel.to(torch.float64)
    mean_s = mean.to(raw.dtype)
    rs = torch.rsqrt(var.to(raw.dtype) + 1e-8)
    # 0 off the policy mask even when a NaN or inf made the mean NaN (as the kernel writes it)
    return torch.where(m, (raw - mean_s).mul_(rs), torch.zeros((), dtype=raw.dtype))


@_reg(
    "gae",
    label="GAE",
    description=(
        "SkyRL's GAE: the recursion ignores the masks, so it steps through tool tokens (gamma*lambda "
        "once per token) and reads the critic's values and rewards there; whitened over the whole "
        "response (tool tokens included)."
    ),
    kind="token",
    reads=("rewards", "values"),
    reference="token_gae",
    departs=("gae_through_tool_spans",),
)
def _skyrl_gae(inp: EstimatorInput) -> EstimatorOutput:
    if inp.values is None:
        raise ValueError("SkyRL's gae needs values (a critic)")
    dtype = float_dtype(inp)
    cdt = torch.promote_types(torch.float32, inp.values.dtype)
    r = inp.rewards.to(torch.float32)  # SkyRL's float32 reward tensor
    adv, tgt = _span_credit(r, inp.values.to(cdt), inp.mask, float(inp.gamma), float(inp.lam))
    return EstimatorOutput(advantages=adv.to(dtype), value_targets=tgt.to(dtype))


@_reg(
    "reinforce++",
    label="REINFORCE++",
    description=(
        "SkyRL's REINFORCE++: discounted returns that step through tool tokens (gamma once per "
        "token, rewards there counted, no reset inside the response), whitened over the whole response."
    ),
    kind="token",
    reference="reinforce_plus_plus",
    departs=("gae_through_tool_spans",),
)
def _skyrl_rfpp(inp: EstimatorInput) -> EstimatorOutput:
    dtype = float_dtype(inp)
    r = inp.rewards.to(torch.float32)
    adv, ret = _span_credit(r, None, inp.mask, float(inp.gamma), 1.0)  # no reset inside the response
    return EstimatorOutput(advantages=adv.to(dtype), value_targets=ret.to(dtype))


def _scores(inp: EstimatorInput) -> Tensor:
    """[B] float32 ``token_level_rewards.sum(-1)``: SkyRL's tensor holds the response alone, whose
    every reward (tool tokens included) counts; our row holds nothing else a reward sits on."""
    return inp.rewards.to(torch.float32).sum(-1)


def _stats(s: Tensor, inp: EstimatorInput) -> tuple[Tensor, Tensor, Tensor]:
    """[B] float32 (group mean, unbiased group std, group size) of ``s`` [B]; a group of one has
    mean 0 and std 1 (SkyRL's dict loop). SkyRL's own reductions where the groups are contiguous
    blocks of one size."""
    B = s.shape[0]
    n = contiguous_size(inp.groups, B)
    if n is not None and n > 1:
        g = s.view(-1, n)
        mean = g.mean(-1, keepdim=True).expand(-1, n).reshape(-1)
        std = g.std(-1, keepdim=True).expand(-1, n).reshape(-1)
        cnt = torch.full((B,), float(n), dtype=torch.float32)
        return mean, std, cnt
    st = group_stats(s, inp.groups)
    single = st.count == 1
    mean = torch.where(single, 0.0, st.mean).to(torch.float32)
    std = torch.where(single, 1.0, st.std("sample")).to(torch.float32)
    return mean, std, st.count.to(torch.float32)


def _outcome(inp: EstimatorInput, adv: Tensor) -> EstimatorOutput:
    dtype = float_dtype(inp)
    return EstimatorOutput(
        advantages=broadcast(adv, inp.mask, dtype), extras={"episode_advantages": adv.to(dtype)}
    )


@_reg(
    "grpo",
    label="GRPO",
    description=(
        "SkyRL's GRPO: the sum of the response's rewards (tool tokens included), minus the group "
        "mean, over the unbiased group std + 1e-6 (grpo_norm_by_std); a group of one: s / (1 + 1e-6); float32."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
    params={"grpo_norm_by_std": True},
    reference="grpo",
)
def _skyrl_grpo(inp: EstimatorInput, grpo_norm_by_std: bool = True) -> EstimatorOutput:
    s = _scores(inp)
    mean, std, _ = _stats(s, inp)
    adv = (s - mean) / (std + EPS) if grpo_norm_by_std else s - mean
    return _outcome(inp, adv)


@_reg(
    "rloo",
    label="RLOO",
    description=(
        "SkyRL's RLOO: n/(n-1) x (the response's reward sum minus the group mean), tool-token rewards "
        "included; a group of one gets 0 (verl's rloo keeps the score); float32."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
    reference="rloo",
)
def _skyrl_rloo(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    mean, _, cnt = _stats(s, inp)
    factor = (cnt / torch.where(cnt > 1, cnt - 1, 1.0)).to(torch.float32)
    adv = torch.where(cnt > 1, (s - mean) * factor, 0.0)
    return _outcome(inp, adv)


@_reg(
    "maxrl",
    label="MaxRL",
    description=(
        "SkyRL's MaxRL: (the response's reward sum minus the group mean) over (the group mean + 1e-6), "
        "tool-token rewards included; a group of one keeps its score; float32."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
)
def _skyrl_maxrl(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    mean, _, cnt = _stats(s, inp)
    adv = torch.where(cnt > 1, (s - mean) / (mean + EPS), s - mean)
    return _outcome(inp, adv)
