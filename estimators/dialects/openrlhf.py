"""OpenRLHF 0.11.2's advantages (``openrlhf/trainer/ppo_utils/experience_maker.py``,
``RemoteExperienceMaker.compute_advantages_and_returns``), vectorised, on our [B, T] layout.

What OpenRLHF does, step by step, and how each step reads our input:

1. **One reward per sample.** A sample's reward is a scalar (its multi-turn agent adds up the
   steps' rewards, ``openrlhf/utils/agent.py``), so the dialect's reward is the sum of every reward
   of the row (a reward on a tool token counts).
2. **Group shaping** by ``rewards.reshape(-1, n_samples_per_prompt)``: ``rloo`` (minus the mean
   of the others), ``reinforce_baseline`` / ``dr_grpo`` (minus the group mean), ``group_norm``
   (over the unbiased group std + 1e-9), ``flash_reinforce`` (minus the batch mean). Groups come
   from ``inp.groups``; when they are contiguous blocks of one size (OpenRLHF's own layout) the
   same reshape and reductions run, so rounding matches too. OpenRLHF refuses
   ``n_samples_per_prompt == 1`` for the group estimators (``train_ppo_ray.py``): a group of one
   is a ValueError here.
3. ``compute_reward``: the shaped reward is clamped to ``clip_range`` (``--reward.clip_range``,
   default (-10, 10)) and written into the KL tensor's dtype (float32) at the last policy token.
4. **Per-token returns.** ``gae``: ``get_advantages_and_returns`` zeroes values and rewards where
   ``action_mask`` is 0 but still steps through those positions, decaying gamma * lambda once per
   tool token and reading V = 0 there. The others: ``get_cumulative_returns`` with gamma (forced
   to 1 for all but ``reinforce``), stepping through tool tokens too.
5. **Whitening** for ``gae``, ``reinforce`` and ``reinforce_baseline``: mean and biased variance
   over the batch's policy tokens, computed in float32, ``var.clamp(min=1e-8).rsqrt()``;
   ``no_std_norm`` keeps only the mean subtraction.

Every output is 0 off the policy mask (OpenRLHF's loss masks those positions out). Truncated rows
bootstrap nothing (``last_value`` is not read), as OpenRLHF.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import token as tok
from ..groups import group_stats
from ..registry import EstimatorInput, EstimatorOutput
from ._common import (
    Dialects,
    broadcast,
    contiguous_size,
    float_dtype,
    last_policy,
    policy,
    response_span,
    returns_over,
    row_sums,
)

VERSION = "0.11.2"
TRAINER = "openrlhf"
CLIP_RANGE = (-10.0, 10.0)  # --reward.clip_range's default
GROUP_ESTIMATORS = ("rloo", "reinforce_baseline", "group_norm", "dr_grpo")


def _contiguous(r: Tensor, n: int, estimator: str) -> Tensor:
    """OpenRLHF's own shaping on ``r.reshape(-1, n)`` (the same reductions, so the same rounding)."""
    g = r.reshape(-1, n)
    if estimator == "rloo":
        g = g - (g.sum(-1, keepdim=True) - g) / (n - 1)
    elif estimator in ("reinforce_baseline", "dr_grpo"):
        g = g - g.mean(-1, keepdim=True)
    else:  # group_norm
        g = (g - g.mean(-1, keepdim=True)) / (g.std(-1, keepdim=True) + 1e-9)
    return g.reshape(-1)


def _by_labels(r: Tensor, inp: EstimatorInput, estimator: str) -> Tensor:
    """The same shaping for groups that are not contiguous blocks of one size (float64 statistics)."""
    st = group_stats(r, inp.groups)
    if estimator == "rloo":
        a = st.centered * st.count / (st.count - 1)
    elif estimator in ("reinforce_baseline", "dr_grpo"):
        a = st.centered
    else:
        a = st.centered / (st.std("sample") + 1e-9)
    return a.to(r.dtype)


def shaped_rewards(inp: EstimatorInput, estimator: str, clip_range: tuple[float, float] | None) -> Tensor:
    """[B] float32: each sample's reward after OpenRLHF's group shaping and ``compute_reward``'s
    clamp, in the dtype ``compute_reward`` writes it in (the KL tensor's, float32)."""
    s = row_sums(inp)
    r = s.to(torch.promote_types(s.dtype, torch.float32))  # "at least FP32 for group statistics"
    B = r.shape[0]
    if estimator in GROUP_ESTIMATORS and B:
        st_count = group_stats(r, inp.groups).gcount
        if bool((st_count < 2).any()):
            raise ValueError(
                f"OpenRLHF's {estimator} needs n_samples_per_prompt > 1 (a group of one has no baseline)"
            )
        n = contiguous_size(inp.groups, B)
        r = _contiguous(r, n, estimator) if n is not None else _by_labels(r, inp, estimator)
    elif estimator == "flash_reinforce" and B:
        r = r - r.mean()
    if clip_range:
        r = r.clamp(min=clip_range[0], max=clip_range[1])
    return r.to(torch.float32)


def _whiten(adv: Tensor, m: Tensor, no_std_norm: bool) -> Tensor:
    """OpenRLHF's batch normalisation: mean and biased variance over the policy tokens in float32
    (``all_advantages.float()``), ``var.clamp(min=1e-8).rsqrt()``, applied in the advantages'
    dtype; 0 off-mask. ``no_std_norm``: the mean only."""
    n = int(torch.count_nonzero(m).item())
    if n == 0:
        return torch.zeros_like(adv)
    a32 = adv.to(torch.float32)
    mean = torch.where(m, a32, torch.zeros((), dtype=torch.float32)).sum() / n
    c32 = torch.where(m, a32, mean).sub_(mean)
    # x - mean on the policy tokens, 0 elsewhere (the float32 copy serves when adv is float32)
    out = torch.where(m, adv, mean.to(adv.dtype)).sub_(mean) if adv.dtype != torch.float32 else c32
    if not no_std_norm:
        flat = c32.view(-1)
        var = torch.dot(flat, flat) / n
        out = out.mul_(var.clamp(min=1e-8).rsqrt())
    return out


def _outcome(
    inp: EstimatorInput,
    estimator: str,
    clip_range: tuple[float, float] | None,
    whiten: bool,
    no_std_norm: bool,
) -> EstimatorOutput:
    """gamma = 1 estimators: the return of every token up to the last policy token is the shaped
    reward, so every policy token carries it."""
    dtype = float_dtype(inp)
    r = shaped_rewards(inp, estimator, clip_range)
    ret = broadcast(r, inp.mask)  # float32, as OpenRLHF's returns
    adv = _whiten(ret, policy(inp), no_std_norm) if whiten else ret
    return EstimatorOutput(
        advantages=adv.to(dtype),
        value_targets=ret.to(dtype),
        extras={"episode_advantages": r.to(dtype)} if not whiten else {},
    )


def _at_last(r: Tensor, m: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """([B, T] ``dtype`` zeros with ``r`` [B] on each row's last policy token, the response span).
    ``compute_reward``'s ``last_reward``."""
    B, T = m.shape
    out = torch.zeros(B, T, dtype=dtype)
    last = last_policy(m)
    rows = (last >= 0).nonzero().squeeze(1)
    out[rows, last[rows]] = r[rows].to(dtype)
    return out, response_span(m)


def _gae(inp: EstimatorInput, clip_range: tuple[float, float] | None, no_std_norm: bool) -> EstimatorOutput:
    """``get_advantages_and_returns``: one step per column of the response, tool tokens included
    (the span as the scan's mask), with V and r zeroed where ``action_mask`` is 0."""
    if inp.values is None:
        raise ValueError("OpenRLHF's gae needs values (a critic)")
    m = policy(inp)
    dtype = float_dtype(inp)
    cdt = torch.promote_types(torch.float32, inp.values.dtype)
    r, span = _at_last(shaped_rewards(inp, "gae", clip_range), m, cdt)
    zero = torch.zeros((), dtype=cdt)
    v = torch.where(m, inp.values.to(cdt), zero)  # action_mask * values (where: no NaN leaks)
    adv, tgt = tok.gae(r, v, span, float(inp.gamma), float(inp.lam))
    out = _whiten(adv, m, no_std_norm)
    return EstimatorOutput(advantages=out.to(dtype), value_targets=torch.where(m, tgt, zero).to(dtype))


def _reinforce(
    inp: EstimatorInput, clip_range: tuple[float, float] | None, no_std_norm: bool
) -> EstimatorOutput:
    """``get_cumulative_returns`` with the reward on the last policy token only: the return at
    column t is ``gamma ** (last - t) * R``, one discount per column (tool tokens included)."""
    m = policy(inp)
    dtype = float_dtype(inp)
    r, span = _at_last(shaped_rewards(inp, "reinforce", clip_range), m, torch.float32)
    ret = torch.where(m, returns_over(r, span, inp.gamma), torch.zeros((), dtype=torch.float32))
    return EstimatorOutput(advantages=_whiten(ret, m, no_std_norm).to(dtype), value_targets=ret.to(dtype))


_ADV = "--algo.advantage.estimator"


_reg = Dialects(TRAINER, VERSION)


def _plain_outcome(
    name: str,
    label: str,
    description: str,
    reads: tuple[str, ...] = ("rewards", "groups"),
    reference: str | None = None,
) -> None:
    """Register OpenRLHF's outcome estimator ``name`` as it runs without whitening (its one
    parameter: ``clip_range``)."""

    def fn(inp: EstimatorInput, clip_range: tuple[float, float] | None = CLIP_RANGE) -> EstimatorOutput:
        return _outcome(inp, name, clip_range, whiten=False, no_std_norm=False)

    fn.__name__ = fn.__qualname__ = f"_openrlhf_{name}"
    _reg(name, label, description, "outcome", reads, {"clip_range": CLIP_RANGE}, reference=reference)(fn)


@_reg(
    "gae",
    "GAE",
    "OpenRLHF's GAE: the episode's reward on the last policy token; values and rewards zeroed on "
    "tool tokens but the recursion still steps through them (gamma*lambda decays once per tool "
    "token, V = 0 read there); then whitened over the batch's policy tokens in float32.",
    "token",
    ("rewards", "values"),
    {"no_std_norm": False, "clip_range": CLIP_RANGE},
    reference="token_gae",
    departs=("gae_through_tool_spans",),
)
def _openrlhf_gae(
    inp: EstimatorInput, no_std_norm: bool = False, clip_range: tuple[float, float] | None = CLIP_RANGE
) -> EstimatorOutput:
    return _gae(inp, clip_range, no_std_norm)


@_reg(
    "reinforce",
    "REINFORCE",
    "OpenRLHF's REINFORCE: the episode's reward on the last policy token, discounted once per "
    "column back from it (tool tokens included), whitened over the batch's policy tokens in float32.",
    "token",
    ("rewards",),
    {"no_std_norm": False, "clip_range": CLIP_RANGE},
    reference="returns",
)
def _openrlhf_reinforce(
    inp: EstimatorInput, no_std_norm: bool = False, clip_range: tuple[float, float] | None = CLIP_RANGE
) -> EstimatorOutput:
    return _reinforce(inp, clip_range, no_std_norm)


_plain_outcome(
    "rloo",
    "RLOO",
    "OpenRLHF's RLOO: the episode's reward (every reward of the row) minus the mean of the others "
    "in its group, clamped to clip_range, as float32; gamma forced to 1; a group of one is refused.",
    reference="rloo",
)


@_reg(
    "reinforce_baseline",
    "REINFORCE++ baseline",
    "OpenRLHF's reinforce_baseline: reward minus the group mean, on every policy token, then "
    "whitened over the batch's policy tokens in float32 (longer rows weigh more); gamma forced to 1.",
    "outcome",
    ("rewards", "groups"),
    {"no_std_norm": False, "clip_range": CLIP_RANGE},
    reference="reinforce_plus_plus_baseline",
)
def _openrlhf_rfb(
    inp: EstimatorInput, no_std_norm: bool = False, clip_range: tuple[float, float] | None = CLIP_RANGE
) -> EstimatorOutput:
    return _outcome(inp, "reinforce_baseline", clip_range, whiten=True, no_std_norm=no_std_norm)


_plain_outcome(
    "group_norm",
    "GRPO (group_norm)",
    "OpenRLHF's group_norm (GRPO): reward minus the group mean over the unbiased group std + 1e-9 "
    "(an all-equal group keeps its rounding residue over 1e-9), clamped, as float32; gamma forced to 1.",
    reference="grpo",
)


_plain_outcome(
    "dr_grpo",
    "Dr. GRPO",
    "OpenRLHF's dr_grpo: reward minus the group mean, no std and no whitening; clamped, as float32; "
    "gamma forced to 1.",
    reference="dr_grpo",
)


_plain_outcome(
    "flash_reinforce",
    "FlashREINFORCE",
    "OpenRLHF's flash_reinforce: reward minus the mean reward of the whole batch (no groups, no "
    "whitening); clamped, as float32; gamma forced to 1.",
    reads=("rewards",),
)
