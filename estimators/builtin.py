"""Importing this module registers every built-in estimator (see registry.py).

Each wrapper adapts one function of ``token.py`` / ``groups.py`` / ``verl_family.py`` to the shared
call shape ``fn(inp: EstimatorInput, **params) -> EstimatorOutput``.

Outcome/group wrappers take one score per episode, ``inp.scores`` = the sum of rewards over
*policy* positions (``score="masked"``, the default). verl sums the whole row without the mask;
``score="unmasked"`` reproduces that. ``groups=None`` means the whole batch is one group. The
per-episode advantage is broadcast onto the row's policy tokens (0 elsewhere) and also returned as
``extras["episode_advantages"]`` [B].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from . import agent as A
from . import groups as G
from . import token as T
from . import verl_family as V
from .registry import EstimatorInput, EstimatorOutput, register
from .stats import whiten


def _mask(inp: EstimatorInput) -> Tensor:
    return inp.mask != 0


def _values(inp: EstimatorInput) -> Tensor:
    """The critic values (the registry checks ``reads`` before calling)."""
    if inp.values is None:
        raise ValueError("this estimator needs values (a critic)")
    return inp.values


def _dtype(inp: EstimatorInput) -> torch.dtype:
    return inp.rewards.dtype if inp.rewards.is_floating_point() else torch.get_default_dtype()


def _whiten_or_zero(x: Tensor, m: Tensor) -> Tensor:
    """verl's global masked whitening, times the mask. With fewer than 2 policy tokens in the
    batch verl raises; here the result is 0 (there is nothing to whiten against)."""
    if int(m.sum().item()) < 2:
        return torch.zeros_like(x)
    return whiten(x, m) * m


def _float_mask(inp: EstimatorInput) -> Tensor:
    """A fresh [B, T] 0/1 copy of the mask in the rewards' dtype (callers may write into it)."""
    mk = inp.mask
    return (mk if mk.dtype == torch.bool else mk != 0).to(_dtype(inp))


def _scores(inp: EstimatorInput, score: str, mf: Tensor | None = None) -> Tensor:
    """[B] episode scores: the sum of rewards on policy positions ("masked", the default; the same
    as ``inp.scores``) or over the whole row as verl does ("unmasked")."""
    if score == "masked":
        if mf is None:
            return inp.scores
        # A batched dot product reads rewards and mask once and writes nothing of size [B, T].
        return torch.bmm(inp.rewards.to(mf.dtype).unsqueeze(1), mf.unsqueeze(2)).reshape(-1)
    if score == "unmasked":
        return inp.rewards.sum(-1)
    raise ValueError(f"score must be 'masked' or 'unmasked', got {score!r}")


def _outcome(
    inp: EstimatorInput, fn: Callable[[Tensor], Tensor], score: str, **extras: Any
) -> EstimatorOutput:
    """Per-episode advantages ``fn(scores) -> [B]`` broadcast onto the policy tokens."""
    mf = _float_mask(inp)
    adv = fn(_scores(inp, score, mf)).to(mf.dtype)
    mf.mul_(adv[:, None])  # reuse the mask copy as the output: one pass
    return EstimatorOutput(advantages=mf, extras={"episode_advantages": adv, **extras})


# ---- token / turn schemes -------------------------------------------------------------------


@register(
    "returns",
    label="returns-to-go",
    description="Discounted sum of the rewards from this policy token on (gamma once per policy token).",
    kind="token",
)
def _returns(inp: EstimatorInput) -> EstimatorOutput:
    g = T.returns_to_go(inp.rewards, inp.mask, inp.gamma)
    return EstimatorOutput(advantages=g, value_targets=g)


@register(
    "td",
    label="TD error",
    description="One-step TD error r + gamma V(next policy token) - V: GAE with lambda = 0.",
    kind="token",
    reads=("rewards", "values"),
    may_read=("last_value",),
)
def _td(inp: EstimatorInput) -> EstimatorOutput:
    d = T.td_errors(inp.rewards, _values(inp), inp.mask, inp.gamma, inp.last_value)
    # torch.where, not "* mask": values off-mask may be NaN/inf and must not leak.
    return EstimatorOutput(advantages=d, value_targets=torch.where(_mask(inp), d + _values(inp), 0))


@register(
    "nstep",
    label="n-step",
    description="n-step return minus V: n real rewards, then bootstrap from the critic.",
    kind="token",
    reads=("rewards", "values"),
    may_read=("last_value",),
    params={"n": 5},
)
def _nstep(inp: EstimatorInput, n: int = 5) -> EstimatorOutput:
    g = T.nstep_returns(inp.rewards, _values(inp), inp.mask, n, inp.gamma, inp.last_value)
    return EstimatorOutput(advantages=torch.where(_mask(inp), g - _values(inp), 0), value_targets=g)


@register(
    "token_gae",
    label="token GAE",
    description="GAE with one step per policy token; tool spans are skipped, not stepped through.",
    kind="token",
    reads=("rewards", "values"),
    may_read=("last_value",),
)
def _token_gae(inp: EstimatorInput) -> EstimatorOutput:
    a, t = T.gae(inp.rewards, _values(inp), inp.mask, inp.gamma, inp.lam, inp.last_value)
    return EstimatorOutput(advantages=a, value_targets=t)


@register(
    "turn_gae",
    label="turn GAE",
    description="GAE with one step per turn (call); each turn's advantage is shared by its tokens.",
    kind="turn",
    reads=("rewards", "values"),
    may_read=("turn_ids", "last_value"),
)
def _turn_gae(inp: EstimatorInput) -> EstimatorOutput:
    a, t = T.turn_gae(inp.rewards, _values(inp), inp.mask, inp.gamma, inp.lam, inp.turn_ids, inp.last_value)
    return EstimatorOutput(advantages=a, value_targets=t)


@register(
    "verl_gae",
    label="GAE (verl, whitened)",
    description="Token GAE followed by verl's global masked whitening (mean 0, unit variance over the batch).",
    kind="token",
    reads=("rewards", "values"),
    may_read=("last_value",),
    verl_name="gae",
)
def _verl_gae(inp: EstimatorInput) -> EstimatorOutput:
    a, t = T.gae(inp.rewards, _values(inp), inp.mask, inp.gamma, inp.lam, inp.last_value)
    m = _mask(inp)
    return EstimatorOutput(advantages=_whiten_or_zero(a, m), value_targets=t, extras={"raw_advantages": a})


# ---- outcome / group schemes ----------------------------------------------------------------

_SCORE = {"score": "masked"}


@register(
    "group_mean",
    label="group mean",
    description="Episode score minus the mean score of its group (singleton: 0).",
    kind="outcome",
    reads=("scores", "groups"),
    params=dict(_SCORE),
)
def _group_mean(inp: EstimatorInput, score: str = "masked") -> EstimatorOutput:
    return _outcome(inp, lambda s: G.group_mean(s, inp.groups), score)


@register(
    "grpo",
    label="GRPO",
    description="Score minus group mean, divided by the group's std (+1e-6).",
    kind="outcome",
    reads=("scores", "groups"),
    params={"std": "sample", "eps": 1e-6, **_SCORE},
    verl_name="grpo",
)
def _grpo(
    inp: EstimatorInput, std: str = "sample", eps: float = 1e-6, score: str = "masked"
) -> EstimatorOutput:
    return _outcome(inp, lambda s: G.grpo(s, inp.groups, std=std, eps=eps), score)


@register(
    "dr_grpo",
    label="Dr. GRPO",
    description="Score minus group mean, no std division (singleton keeps its score, as verl).",
    kind="outcome",
    reads=("scores", "groups"),
    params=dict(_SCORE),
    verl_name="grpo (norm_adv_by_std_in_grpo=False)",
)
def _dr_grpo(inp: EstimatorInput, score: str = "masked") -> EstimatorOutput:
    return _outcome(inp, lambda s: G.dr_grpo(s, inp.groups), score)


@register(
    "rloo",
    label="RLOO",
    description="Score minus the mean of the other group members (= G/(G-1) x group mean advantage).",
    kind="outcome",
    reads=("scores", "groups"),
    params={"singleton": "score", **_SCORE},
    verl_name="rloo",
)
def _rloo(inp: EstimatorInput, singleton: str = "score", score: str = "masked") -> EstimatorOutput:
    return _outcome(inp, lambda s: G.rloo(s, inp.groups, singleton=singleton), score)


@register(
    "batch_whiten",
    label="batch whitening",
    description="Score whitened across the whole batch (groups ignored): compares attempts at different tasks.",
    kind="outcome",
    reads=("scores",),
    params={"std": "sample", "eps": 1e-6, **_SCORE},
)
def _batch_whiten(
    inp: EstimatorInput, std: str = "sample", eps: float = 1e-6, score: str = "masked"
) -> EstimatorOutput:
    return _outcome(inp, lambda s: G.batch_whiten(s, None, std=std, eps=eps), score)


@register(
    "group_center_batch_scale",
    label="group-centred, batch-scaled",
    description="Score minus group mean, divided by one batch-wide std (no per-group difficulty weighting).",
    kind="outcome",
    reads=("scores", "groups"),
    params={"scale_of": "scores", "std": "sample", "eps": 1e-6, **_SCORE},
)
def _gcbs(
    inp: EstimatorInput,
    scale_of: str = "scores",
    std: str = "sample",
    eps: float = 1e-6,
    score: str = "masked",
) -> EstimatorOutput:
    return _outcome(
        inp, lambda s: G.group_center_batch_scale(s, inp.groups, scale_of=scale_of, std=std, eps=eps), score
    )


# ---- the rest of verl 0.9.1's registry ------------------------------------------------------


@register(
    "reinforce_plus_plus",
    label="REINFORCE++",
    description="Discounted returns-to-go, whitened over all policy tokens of the batch (no groups).",
    kind="token",
    verl_name="reinforce_plus_plus",
)
def _rfpp(inp: EstimatorInput) -> EstimatorOutput:
    a, g = V.reinforce_plus_plus(inp.rewards, inp.mask, inp.gamma)
    return EstimatorOutput(advantages=a, value_targets=g)


@register(
    "reinforce_plus_plus_baseline",
    label="REINFORCE++ (group baseline)",
    description="Score minus group mean, then whitened over all policy tokens of the batch.",
    kind="outcome",
    reads=("scores", "groups", "lengths"),
    params=dict(_SCORE),
    verl_name="reinforce_plus_plus_baseline",
)
def _rfpp_baseline(inp: EstimatorInput, score: str = "masked") -> EstimatorOutput:
    lengths = inp.lengths
    if lengths is not None:  # rows standing for whole episodes: each weighs its policy tokens
        return _outcome(inp, lambda s: V.reinforce_plus_plus_baseline_rows(s, inp.groups, lengths), score)
    a = V.reinforce_plus_plus_baseline(_scores(inp, score, _float_mask(inp)), inp.mask, inp.groups)
    return EstimatorOutput(advantages=a.to(_dtype(inp)))


@register(
    "remax",
    label="ReMax",
    description="Undiscounted return-to-go minus the greedy response's reward (inp.reward_baselines; 0 if absent).",
    kind="token",
    may_read=("reward_baselines",),
    verl_name="remax",
)
def _remax(inp: EstimatorInput) -> EstimatorOutput:
    b = inp.reward_baselines
    if b is None:
        b = torch.zeros(inp.rewards.shape[0], dtype=_dtype(inp))
    a, g = V.remax(inp.rewards, inp.mask, b)
    return EstimatorOutput(advantages=a, value_targets=g)


@register(
    "opo",
    label="OPO",
    description="Score minus the length-weighted mean score of its group.",
    kind="outcome",
    reads=("scores", "groups", "lengths"),
    params=dict(_SCORE),
    verl_name="opo",
)
def _opo(inp: EstimatorInput, score: str = "masked") -> EstimatorOutput:
    return _outcome(inp, lambda s: G.opo(s, inp.groups, inp.policy_lengths), score)


@register(
    "gpg",
    label="GPG",
    description="Score minus group mean, scaled by B / (number of rows with a nonzero score).",
    kind="outcome",
    reads=("scores", "groups"),
    params={"f_norm": 1.0, **_SCORE},
    verl_name="gpg",
)
def _gpg(inp: EstimatorInput, f_norm: float = 1.0, score: str = "masked") -> EstimatorOutput:
    return _outcome(inp, lambda s: G.gpg(s, inp.groups, f_norm=f_norm), score)


@register(
    "grpo_passk",
    label="GRPO pass@k",
    description="Only the best attempt of each group gets credit: best minus second best (over the group std).",
    kind="outcome",
    reads=("scores", "groups"),
    params={"norm": True, "eps": 1e-6, **_SCORE},
    verl_name="grpo_passk",
)
def _passk(
    inp: EstimatorInput, norm: bool = True, eps: float = 1e-6, score: str = "masked"
) -> EstimatorOutput:
    return _outcome(inp, lambda s: G.grpo_passk(s, inp.groups, norm=norm, eps=eps), score)


def _otb_with(
    baseline: Callable[..., tuple[Tensor, Tensor]], inp: EstimatorInput, handle_zero_tail: bool
) -> EstimatorOutput:
    """``baseline`` (one of ``verl_family``'s optimal token baselines) on ``inp``."""
    if inp.logprobs is None:
        raise ValueError("the optimal token baseline needs logprobs")
    spp = inp.sum_pi_squared
    if spp is None:
        # Without the vocabulary sum, pi^2 of the chosen token is its lower bound.
        spp = torch.exp(2 * inp.logprobs)
    a, g = baseline(inp.rewards, inp.mask, inp.groups, inp.logprobs, spp, handle_zero_tail=handle_zero_tail)
    return EstimatorOutput(advantages=a, value_targets=g)


@register(
    "optimal_token_baseline",
    label="optimal token baseline",
    description="Return-to-go minus a per-position group baseline weighted by cumulative path variance.",
    kind="token",
    reads=("rewards", "logprobs"),
    may_read=("groups", "sum_pi_squared"),
    params={"handle_zero_tail": True},
    verl_name="optimal_token_baseline",
)
def _otb(inp: EstimatorInput, handle_zero_tail: bool = True) -> EstimatorOutput:
    return _otb_with(V.optimal_token_baseline, inp, handle_zero_tail)


@register(
    "tir_optimal_token_baseline",
    label="optimal token baseline (multi-turn)",
    description="Optimal token baseline aligned by policy-token ordinal, so tool spans do not misalign the group.",
    kind="token",
    reads=("rewards", "logprobs"),
    may_read=("groups", "sum_pi_squared"),
    params={"handle_zero_tail": True},
    verl_name="tir_optimal_token_baseline",
)
def _tir(inp: EstimatorInput, handle_zero_tail: bool = True) -> EstimatorOutput:
    return _otb_with(V.tir_optimal_token_baseline, inp, handle_zero_tail)


# ---- multi-turn agents (estimators/agent.py) ------------------------------------------------


@register(
    "gigpo",
    label="GiGPO",
    description=(
        "Episode score normalised in its group, plus omega x the discounted step return normalised "
        "among the group's turns that start from the same anchor state (verl-agent's GiGPO)."
    ),
    kind="turn",
    reads=("rewards", "groups", "turn_states"),
    may_read=("turn_ids",),
    params={"gamma": 0.95, "omega": 1.0, "mode": "mean_std_norm", "eps": 1e-6},
    verl_name="gigpo (verl-agent, gigpo/core_gigpo.py)",
)
def _gigpo(
    inp: EstimatorInput,
    gamma: float = 0.95,
    omega: float = 1.0,
    mode: str = "mean_std_norm",
    eps: float = 1e-6,
) -> EstimatorOutput:
    if inp.turn_states is None:
        raise ValueError("gigpo needs turn_states ([B, K] anchor-state id of each turn)")
    view = A.turn_view(inp.rewards, inp.mask, inp.turn_ids)
    # The episode score is the sum of its turns' rewards (= inp.scores, without another [B, T] pass).
    res = A.gigpo(
        view.rewards.sum(1), view.rewards, view.present, inp.turn_states, inp.groups, gamma, omega, mode, eps
    )
    dtype = _dtype(inp)
    return EstimatorOutput(
        advantages=view.broadcast(res.advantages.to(dtype)),
        extras={
            "episode_advantages": res.episode.to(dtype),
            "turn_advantages": res.advantages.to(dtype),
            "step_advantages": res.step.to(dtype),
            "step_returns": res.step_returns.to(dtype),
            "step_group_size": res.step_group_size,
        },
    )


@register(
    "turn_loo",
    label="turn leave-one-out",
    description=(
        "Episode score minus the mean score of the other episodes of its group that reached the "
        "same turn (AgentCreditBench's TurnLOO); the score itself when none did."
    ),
    kind="turn",
    reads=("rewards", "groups"),
    may_read=("turn_ids",),
)
def _turn_loo(inp: EstimatorInput) -> EstimatorOutput:
    view = A.turn_view(inp.rewards, inp.mask, inp.turn_ids)
    credit = A.turn_loo(view.rewards.sum(1), view.present, inp.groups).to(_dtype(inp))
    return EstimatorOutput(advantages=view.broadcast(credit), extras={"turn_advantages": credit})


@register(
    "monte_carlo",
    label="Monte Carlo (rollout values)",
    description=(
        "r + gamma V(next turn) - V(this turn) with V the Monte Carlo value of each turn's prefix "
        "(inp.turn_values, e.g. the mean return of sampled continuations)."
    ),
    kind="turn",
    reads=("rewards", "turn_values"),
    may_read=("turn_ids", "last_value"),
)
def _monte_carlo(inp: EstimatorInput) -> EstimatorOutput:
    if inp.turn_values is None:
        raise ValueError("monte_carlo needs turn_values ([B, K] Monte Carlo value before each turn)")
    view = A.turn_view(inp.rewards, inp.mask, inp.turn_ids)
    adv = A.monte_carlo(view.rewards, view.present, inp.turn_values, inp.gamma, inp.last_value)
    adv = adv.to(_dtype(inp))
    return EstimatorOutput(advantages=view.broadcast(adv), extras={"turn_advantages": adv})
