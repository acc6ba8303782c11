"""verl 0.9.1's advantage estimators (``verl/trainer/ppo/core_algos.py``, every name of its
``register_adv_est`` registry), as its trainer calls them (``ray_trainer.compute_advantage``),
vectorised, on our [B, T] layout (verl's own: the response, right padding, ``response_mask`` =
our policy mask).

Where our reference estimators choose differently from verl, the ``verl:`` dialect does what verl
does:

* **Whole-row scores.** Every outcome estimator sums ``token_level_rewards`` over the whole row,
  without the mask: a reward on a tool token (or on padding) counts. GAE, REINFORCE++, ReMax and
  the optimal token baselines mask the rewards instead: a reward on a mask-0 position is dropped
  without a word.
* **Singletons.** ``grpo`` and ``grpo_vectorized``: mean 0, std 1, so ``s / (1 + 1e-6)`` (the sum
  in float32, as verl's ``torch.tensor(1.0) + 1e-6``); ``rloo`` keeps ``s``; ``rloo_vectorized``
  gives 0; ``opo``, ``gpg``, ``reinforce_plus_plus_baseline`` use mean 0; ``grpo_passk`` raises.
* **float32 steps.** ``grpo_vectorized`` computes its group statistics in float32 (verl's
  ``group_mean_std``), so an all-equal group of float64 scores can get a nonzero advantage;
  ``gpg``'s batch factor ``B / #nonzero`` is a float32 division; the whitening's N/(N-1) is an
  integer division (float32), as verl's int64 ``response_mask`` gives it.
* **The trainer's arguments.** ``norm_adv_by_std_in_grpo`` reaches ``grpo`` and ``grpo_passk``
  only; ``grpo_vectorized`` and ``gdpo`` always divide by the std. ``gdpo`` without
  ``gdpo_reward_keys`` has one component, the row's rewards. GAE bootstraps 0 at a truncated
  row's end (``last_value`` is not read). ReMax without ``reward_baselines`` and the optimal token
  baselines without ``sum_pi_squared`` fall back as the reference estimators do (verl's trainer
  always has them).
* Groups: rows with equal labels; when they are contiguous blocks of one size (verl's layout: a
  prompt's ``rollout.n`` samples in a row) the group means and stds run the same reductions as
  verl's ``torch.mean(torch.stack(...))``, so rounding matches too.

Every output is 0 off the policy mask (verl leaves numbers there that its loss masks out).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import groups as G
from .. import native
from .. import token as T
from .. import verl_family as V
from .._scan import compress
from ..groups import group_ids, group_stats
from ..registry import EstimatorInput, EstimatorOutput
from ._common import (
    Dialects,
    broadcast,
    contiguous_size,
    float_dtype,
    policy,
    returns_over,
    whiten_rows,
    whiten_unbiased,
)

VERSION = "0.9.1"
TRAINER = "verl"
EPS = 1e-6
ONE_EPS = float(torch.tensor(1.0) + EPS)  # a singleton's std + eps, float32 as verl adds it


def _scores(inp: EstimatorInput) -> Tensor:
    """[B] ``token_level_rewards.sum(dim=-1)``: the whole row, no mask."""
    return inp.rewards.to(float_dtype(inp)).sum(-1)


def _broadcast(adv: Tensor, inp: EstimatorInput) -> Tensor:
    """``adv.unsqueeze(-1) * response_mask`` as verl writes it."""
    return broadcast(adv, inp.mask)


def _outcome(inp: EstimatorInput, adv: Tensor) -> EstimatorOutput:
    adv = adv.to(float_dtype(inp))
    return EstimatorOutput(advantages=_broadcast(adv, inp), extras={"episode_advantages": adv})


def _group_mean_std(s: Tensor, inp: EstimatorInput, std: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """[B] (group mean, unbiased group std, group size) as verl's loops compute them; a group of
    one: mean 0, std 1 (its ``torch.tensor(0.0)``, ``torch.tensor(1.0)``)."""
    B = s.shape[0]
    n = contiguous_size(inp.groups, B)
    if n is not None and n > 1:
        g = s.view(-1, n)
        mean = g.mean(-1, keepdim=True).expand(-1, n).reshape(-1)
        sd = g.std(-1, keepdim=True).expand(-1, n).reshape(-1) if std else torch.ones_like(s)
        return mean, sd, torch.full((B,), float(n), dtype=s.dtype)
    st = group_stats(s, inp.groups)
    single = st.count == 1
    mean = torch.where(single, 0.0, st.mean).to(s.dtype)
    sd = torch.where(single, 1.0, st.std("sample")).to(s.dtype) if std else torch.ones_like(s)
    return mean, sd, st.count.to(s.dtype)


def whiten_int_mask(x: Tensor, m: Tensor) -> Tensor:
    """verl's ``masked_whiten(x, response_mask) * response_mask`` with its int64 mask (see
    :func:`~estimators.dialects._common.whiten_unbiased`) of an ``x`` that is 0 off-mask (every
    caller's is: a masked scan or a broadcast times the mask); 0 off-mask."""
    return whiten_unbiased(x, m, zero_off=True)


def _grpo_scalars(s: Tensor, inp: EstimatorInput, norm: bool) -> Tensor:
    """verl's ``compute_grpo_outcome_advantage`` per row."""
    mean, sd, cnt = _group_mean_std(s, inp, std=norm)
    if not norm:
        return s - mean
    denom = torch.where(cnt == 1, torch.full_like(sd, ONE_EPS), sd + EPS)
    return (s - mean) / denom


_reg = Dialects(TRAINER, VERSION, reads=("rewards", "groups"), verl_name=True)


# ---- token-level --------------------------------------------------------------------------------


@_reg(
    "gae",
    "GAE",
    "verl's GAE: tool spans skipped (no discount across them, their values unread), a reward on a "
    "mask-0 position silently dropped, 0 bootstrapped at a truncated row's end; whitened over the "
    "batch's policy tokens (N/(N-1) in float32).",
    "token",
    reads=("rewards", "values"),
    reference="token_gae",
    departs=("reward_on_masked_position_dropped",),
)
def _verl_gae(inp: EstimatorInput) -> EstimatorOutput:
    if inp.values is None:
        raise ValueError("verl's gae needs values (a critic)")
    a, ret = T.gae(inp.rewards, inp.values, inp.mask, inp.gamma, inp.lam, None)
    return EstimatorOutput(advantages=whiten_int_mask(a, policy(inp)), value_targets=ret)


@_reg(
    "reinforce_plus_plus",
    "REINFORCE++",
    "verl's REINFORCE++: discounted returns over policy tokens (carried across tool spans without "
    "discount, a reward on a mask-0 position dropped), whitened over the batch's policy tokens.",
    "token",
    reads=("rewards",),
    reference="reinforce_plus_plus",
    departs=("reward_on_masked_position_dropped",),
)
def _verl_rfpp(inp: EstimatorInput) -> EstimatorOutput:
    m = policy(inp)
    g = returns_over(inp.rewards, m, inp.gamma)
    return EstimatorOutput(advantages=whiten_int_mask(g, m), value_targets=g)


@_reg(
    "remax",
    "ReMax",
    "verl's ReMax: undiscounted returns over policy tokens minus the greedy response's reward "
    "(reward_baselines; 0 when absent).",
    "token",
    reads=("rewards",),
    may_read=("reward_baselines",),
    reference="remax",
)
def _verl_remax(inp: EstimatorInput) -> EstimatorOutput:
    b = inp.reward_baselines
    if b is not None:  # one compiled pass writes both (the returns, and the returns minus b)
        fused = native.masked_returns(inp.rewards.to(float_dtype(inp)), inp.mask, 1.0, b)
        if fused is not None and fused[1] is not None:
            return EstimatorOutput(advantages=fused[1], value_targets=fused[0])
    m = policy(inp)
    g = returns_over(inp.rewards, m, 1.0)  # undiscounted, over policy tokens
    b = inp.reward_baselines
    if b is None:
        return EstimatorOutput(advantages=g, value_targets=g)
    a = torch.where(m, g - b.to(g.dtype)[:, None], torch.zeros((), dtype=g.dtype))
    return EstimatorOutput(advantages=a, value_targets=g)


def _otb_inputs(inp: EstimatorInput) -> tuple[Tensor, Tensor]:
    if inp.logprobs is None:
        raise ValueError("the optimal token baseline needs logprobs")
    spp = inp.sum_pi_squared if inp.sum_pi_squared is not None else torch.exp(2 * inp.logprobs)
    return inp.logprobs, spp


@_reg(
    "optimal_token_baseline",
    "optimal token baseline",
    "verl's optimal token baseline: undiscounted returns minus a per-column group baseline weighted "
    "by the cumulative path variance (columns, so tool spans misalign the group); zero tail on.",
    "token",
    reads=("rewards", "logprobs"),
    may_read=("groups", "sum_pi_squared"),
    reference="optimal_token_baseline",
)
def _verl_otb(inp: EstimatorInput) -> EstimatorOutput:
    return _otb(inp, tir=False)


@_reg(
    "tir_optimal_token_baseline",
    "optimal token baseline (multi-turn)",
    "verl's multi-turn optimal token baseline: as optimal_token_baseline but aligned by the ordinal "
    "of the policy token; rows without one leave the group; zero tail on (the code's default).",
    "token",
    reads=("rewards", "logprobs"),
    may_read=("groups", "sum_pi_squared"),
    reference="tir_optimal_token_baseline",
)
def _verl_tir(inp: EstimatorInput) -> EstimatorOutput:
    return _otb(inp, tir=True)


def _otb(inp: EstimatorInput, tir: bool) -> EstimatorOutput:
    """``estimators.verl_family``'s optimal token baselines (zero tail on, eps 1e-8), with the
    undiscounted returns from the one-pass kernel."""
    lp, spp = _otb_inputs(inp)
    fused = _otb_native(inp, lp, spp, tir)
    if fused is not None:
        return fused
    m = policy(inp)
    B, T = m.shape
    g = returns_over(inp.rewards, m, 1.0)
    W = V._otb_weights(lp.to(g.dtype), spp.to(g.dtype), m, None)
    inv, ng = group_ids(inp.groups, B, g.device)
    if not tir:  # baselines per column
        member = torch.ones(B, dtype=torch.bool, device=g.device)
        b = V._group_baseline(g, torch.where(m, W, 0), inv, ng, member, 1e-8)
        if B:
            uniq, second = V._zero_tail_rows(
                m.view(torch.uint8).sum(1, dtype=torch.int32).long(), inv, ng, member
            )
            cnt = torch.zeros(ng, dtype=torch.long).index_add_(0, inv, torch.ones_like(inv))
            cols = torch.arange(T, device=g.device)[None, :]
            b = b.masked_fill((uniq & (cnt[inv] > 1))[:, None] & (cols >= second[:, None]), 0)
        return EstimatorOutput(advantages=(g - b) * m, value_targets=g)
    # TIR: per ordinal of the policy token (the compressed layout), rows without one left out
    lay = compress(m)
    gc, wc = lay.scatter(g), lay.scatter(W)
    member = lay.counts > 0
    b = V._group_baseline(gc, wc, inv, ng, member, 1e-8)
    if B:
        uniq, second = V._zero_tail_rows(lay.counts, inv, ng, member)
        cnt = torch.zeros(ng, dtype=torch.long).index_add_(0, inv, member.long())
        ordinal = torch.arange(lay.width, device=g.device)[None, :] - 1  # column 0 is the dummy
        b = b.masked_fill((uniq & (cnt[inv] > 1))[:, None] & (ordinal >= second[:, None]), 0)
    return EstimatorOutput(advantages=lay.gather(gc - b), value_targets=g)


def _otb_native(inp: EstimatorInput, lp: Tensor, spp: Tensor, tir: bool) -> EstimatorOutput | None:
    """:func:`_otb` through the compiled kernel (``estimators.native.otb``: the same roundings),
    the per-group bookkeeping ([B] and [G] tensors) here; None when the kernel does not apply."""
    dtype = float_dtype(inp)
    counts = native.row_counts(inp.mask)
    if counts is None:
        return None
    B, T = inp.mask.shape
    inv, ng = group_ids(inp.groups, B)
    member = counts > 0 if tir else torch.ones(B, dtype=torch.bool)
    cnt = torch.zeros(ng, dtype=torch.long).index_add_(0, inv, member.long())
    use = member & (cnt[inv] > 1)
    width = max(int(counts.max().item()), 1) if tir and B else T
    tail = torch.full((B,), width, dtype=torch.long)
    if B:
        uniq, second = V._zero_tail_rows(counts, inv, ng, member)
        tail = torch.where(uniq & (cnt[inv] > 1), second, tail)
    r = inp.rewards.to(dtype)
    fused = native.otb(
        r, inp.mask, torch.exp(lp.to(dtype)), spp.to(dtype), inv, member, use, tail, ng, width, tir
    )
    if fused is None:
        return None
    return EstimatorOutput(advantages=fused[0], value_targets=fused[1])


# ---- outcome ------------------------------------------------------------------------------------


@_reg(
    "grpo",
    "GRPO",
    "verl's GRPO: the whole row's reward sum (a reward on a tool token counts) minus the group "
    "mean, over the unbiased std + 1e-6 (norm_adv_by_std_in_grpo); a group of one: s / (1 + 1e-6).",
    "outcome",
    params={"norm_adv_by_std_in_grpo": True},
    reference="grpo",
    departs=("rejected_rows_in_baseline",),
)
def _verl_grpo(inp: EstimatorInput, norm_adv_by_std_in_grpo: bool = True) -> EstimatorOutput:
    return _outcome(inp, _grpo_scalars(_scores(inp), inp, norm_adv_by_std_in_grpo))


@_reg(
    "grpo_vectorized",
    "GRPO (vectorized)",
    "verl's grpo_vectorized: GRPO with the group statistics in float32 (an all-equal group of "
    "float64 scores can get a nonzero advantage); always divides by the std (the trainer passes no "
    "flag); a group of one: s / (1 + 1e-6).",
    "outcome",
    reference="grpo",
    departs=("rejected_rows_in_baseline",),
)
def _verl_grpo_vec(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    B = s.shape[0]
    inv, ng = group_ids(inp.groups, B)
    # verl.utils.groupwise.group_mean_std(scores, gidx, eps=0.0): float32, index_add in row order.
    s32 = s.to(torch.float32)
    ones = torch.ones_like(s32)
    count = torch.zeros(ng, dtype=torch.float32).index_add_(0, inv, ones)
    s1 = torch.zeros(ng, dtype=torch.float32).index_add_(0, inv, s32)
    mean = s1 / count.clamp_min(1.0)
    centered = s32 - mean[inv]
    var_num = torch.zeros(ng, dtype=torch.float32).index_add_(0, inv, centered * centered)
    var = var_num / (count - 1.0).clamp_min(1.0)
    std = torch.sqrt(torch.clamp(var, min=0.0))
    single = count <= 1.0
    mean = torch.where(single, 0.0, mean)
    std = torch.where(single, 1.0, std)
    return _outcome(inp, (s - mean[inv]) / (std[inv] + EPS))


@_reg(
    "rloo",
    "RLOO",
    "verl's rloo: the whole row's reward sum minus the mean of the others in its group; a group of "
    "one keeps its score (rloo_vectorized gives it 0).",
    "outcome",
    reference="rloo",
    departs=("rejected_rows_in_baseline", "singleton_twins_differ"),
)
def _verl_rloo(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    mean, _, n = _group_mean_std(s, inp, std=False)
    nm1 = torch.where(n > 1, n - 1, 1.0)
    a = torch.where(n > 1, s * n / nm1 - mean * n / nm1, s)
    return _outcome(inp, a)


@_reg(
    "rloo_vectorized",
    "RLOO (vectorized)",
    "verl's rloo_vectorized: (c s - group sum) / (c - 1) on the whole row's reward sums; a group "
    "of one gets 0 (verl's rloo keeps the score).",
    "outcome",
    reference="rloo",
    departs=("rejected_rows_in_baseline", "singleton_twins_differ"),
)
def _verl_rloo_vec(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    inv, _ = group_ids(inp.groups, s.shape[0])
    c = torch.bincount(inv)[inv].to(s.dtype)
    tot = torch.bincount(inv, weights=s)[inv]
    return _outcome(inp, ((c * s - tot) / (c - 1).clamp_min(1)) * (c > 1))


@_reg(
    "reinforce_plus_plus_baseline",
    "REINFORCE++ (group baseline)",
    "verl's reinforce_plus_plus_baseline: the whole row's reward sum minus the group mean (a group "
    "of one: mean 0) on every policy token, whitened over the batch's policy tokens.",
    "outcome",
    reference="reinforce_plus_plus_baseline",
    departs=("rejected_rows_in_baseline",),
)
def _verl_rfpp_baseline(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    mean, _, _ = _group_mean_std(s, inp, std=False)
    return EstimatorOutput(advantages=whiten_rows(s - mean, inp.mask))  # one number per row, whitened


@_reg(
    "opo",
    "OPO",
    "verl's OPO: the whole row's reward sum minus its group's length-weighted mean (lengths = "
    "policy tokens); a group of one: baseline 0.",
    "outcome",
    reference="opo",
)
def _verl_opo(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    lengths = inp.mask.sum(-1).to(s.dtype)  # response_mask.sum(-1) (a 0/1 mask)
    B = s.shape[0]
    n = contiguous_size(inp.groups, B)
    if n is None or n == 1:
        return _outcome(inp, G.opo(s, inp.groups, lengths).to(s.dtype))  # s minus the baseline
    lg, sg = lengths.view(-1, n), s.view(-1, n)
    b = ((lg * sg).sum(-1, keepdim=True) / lg.sum(-1, keepdim=True)).expand(-1, n).reshape(-1)
    return _outcome(inp, s - b)


@_reg(
    "gpg",
    "GPG",
    "verl's GPG: alpha (the whole row's reward sum minus the group mean), alpha = B / (rows with a "
    "nonzero sum) as a float32 division; a group of one: mean 0.",
    "outcome",
    reference="gpg",
)
def _verl_gpg(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    alpha = s.shape[0] / torch.count_nonzero(s).clamp(min=1)  # float32, as verl
    mean, _, _ = _group_mean_std(s, inp, std=False)
    return _outcome(inp, alpha * (s - mean) / 1.0)


@_reg(
    "grpo_passk",
    "GRPO pass@k",
    "verl's grpo_passk: only each group's best row gets best minus second best (over the group std "
    "+ 1e-6 with norm_adv_by_std_in_grpo), on the whole row's reward sums; a group of one is refused.",
    "outcome",
    params={"norm_adv_by_std_in_grpo": True},
    reference="grpo_passk",
)
def _verl_passk(inp: EstimatorInput, norm_adv_by_std_in_grpo: bool = True) -> EstimatorOutput:
    s = _scores(inp)
    return _outcome(inp, G.grpo_passk(s, inp.groups, norm=norm_adv_by_std_in_grpo, eps=EPS).to(s.dtype))


@_reg(
    "gdpo",
    "GDPO",
    "verl's gdpo with one reward component (the row's rewards): GRPO on the whole row's reward sums "
    "(always over the std: the trainer passes no flag), then whitened over the batch's policy tokens.",
    "outcome",
    reference="grpo",
)
def _verl_gdpo(inp: EstimatorInput) -> EstimatorOutput:
    s = _scores(inp)
    return EstimatorOutput(advantages=whiten_rows(_grpo_scalars(s, inp, True), inp.mask))
