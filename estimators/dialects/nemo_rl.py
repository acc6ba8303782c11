"""NeMo-RL 0.7.0's advantage estimators on our [B, T] layout (read, not run: not on PyPI).

Code read (NVIDIA-NeMo/RL; docs/conventions.md, "NeMo-RL", names the commits):
``nemo_rl/algorithms/advantage_estimator.py`` (``GRPOAdvantageEstimator``,
``ReinforcePlusPlusAdvantageEstimator``, ``RawRewardAdvantageEstimator``,
``GeneralizedAdvantageEstimator``) and ``nemo_rl/algorithms/utils.py``
(``calculate_baseline_and_std_per_prompt``, ``masked_mean``).

- **GRPO**: baseline and std per prompt from ``calculate_baseline_and_std_per_prompt``. With the
  leave-one-out baseline (the default) both the baseline and the std are those of the *other*
  members: the std is ``sqrt((E_others[r^2] - E_others[r]^2) * nv / (nv - 1))`` with ``nv = n - 1``,
  NaN turned into 0, so a group of two has std 0 and is not divided. A group of one gets its own
  reward as baseline: advantage 0. Division by ``std + 1e-6`` only where ``std > 0``.
- **REINFORCE++**: reward minus the plain group mean (a group of one: 0), broadcast, then whitened
  over the batch's policy tokens (population variance, ``clamp(min=1e-8).rsqrt()``). No discount:
  gamma is not read.
- **raw_reward**: the reward broadcast, whitened the same way (``normalize_advantages``).
- **GAE**: the reward on the last mask=1 token, carry-forward masking (a mask-0 position keeps
  ``next_values`` and ``last_gae_lam``: tool spans are skipped), V = 0 after the row (no
  bootstrap), optional VAPO decoupled lambdas (``gae_lambda_value`` for the value targets,
  ``gae_lambda_policy`` for the advantages) and a length-adaptive policy lambda
  ``1 - 1 / max(alpha * l, 1)`` with l the row's policy tokens; ``normalize_advantages`` whitens
  with ``masked_mean`` (denominator ``n + 1e-8``) and ``rsqrt(var + 1e-8)``.

The sample's reward is the sum of the row's rewards at every position (NeMo-RL's multi-turn rollout
adds up each turn's reward into one number per sample). gamma and lambda come from
``EstimatorInput`` (``gae_gamma``, ``gae_lambda``); both decoupled lambdas default to ``inp.lam``,
which is NeMo-RL's own fallback (``None`` -> ``gae_lambda``). Computations run in the rewards'
dtype, as NeMo-RL's. GDPO is not registered: it needs one reward column per component.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import token as T
from ..groups import group_ids
from ..registry import EstimatorInput, EstimatorOutput
from ._common import Dialects, float_dtype, on_policy, policy, row_sums

__all__ = ["baseline_and_std"]

_TRAINER = "nemo_rl"
_VERSION = "0.7.0"
_reg = Dialects(_TRAINER, _VERSION)


def baseline_and_std(r: Tensor, groups: object, leave_one_out: bool = True) -> tuple[Tensor, Tensor]:
    """NeMo-RL's ``calculate_baseline_and_std_per_prompt`` (every sample valid), vectorised over
    group labels: ([B] baselines, [B] stds) in ``r``'s dtype."""
    B = r.shape[0]
    inv, G = group_ids(groups, B, r.device)  # type: ignore[arg-type]
    zeros = torch.zeros(G, dtype=r.dtype, device=r.device)
    n = zeros.index_add(0, inv, torch.ones_like(r))[inv]
    s1 = zeros.index_add(0, inv, r)[inv]
    s2 = zeros.index_add(0, inv, r * r)[inv]
    if leave_one_out:
        nv = n - 1
        s1, s2 = s1 - r, s2 - r * r
    else:
        nv = n
    safe = torch.where(nv > 0, nv, torch.ones_like(nv))
    baseline = s1 / safe
    sq = s2 / safe
    # (E[r^2] - E[r]^2) * nv / (nv - 1), sqrt, NaN -> 0. With nv = 1 NeMo-RL multiplies an exact 0
    # by inf (NaN -> 0): std 0.
    factor = nv / torch.where(nv > 1, nv - 1, torch.ones_like(nv))
    std = ((sq - baseline.square()) * factor).sqrt().nan_to_num(0.0)
    std = torch.where(nv > 1, std, torch.zeros_like(std))
    single = n <= 1  # "no valid responses": baseline = reward, std 0
    baseline = torch.where(single, r, baseline)
    std = torch.where(single, torch.zeros_like(std), std)
    return baseline, std


def _batch_norm(adv: Tensor, m: Tensor, clamp_count: bool) -> Tensor:
    """NeMo-RL's global normalisation over policy tokens: population variance,
    ``var.clamp(min=1e-8).rsqrt()``; ``clamp_count`` divides by ``max(n, 1)`` (raw_reward)."""
    mf = m.to(adv.dtype)
    n = mf.sum()
    if clamp_count:
        n = n.clamp(min=1)
    mean = (adv * mf).sum() / n
    var = ((adv - mean).pow(2) * mf).sum() / n
    return (adv - mean) * var.clamp(min=1e-8).rsqrt()


@_reg(
    "grpo",
    label="GRPO",
    description=(
        "Reward minus the mean of the other group members, over the others' std + 1e-6 where it is "
        "positive (a group of two has std 0, a group of one gets 0)."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
    params={"normalize_rewards": True, "use_leave_one_out_baseline": True},
    reference="grpo",
)
def _grpo(
    inp: EstimatorInput, normalize_rewards: bool = True, use_leave_one_out_baseline: bool = True
) -> EstimatorOutput:
    r = row_sums(inp)
    baseline, std = baseline_and_std(r, inp.groups, use_leave_one_out_baseline)
    adv = r - baseline
    if normalize_rewards:
        adv = torch.where(std > 0, adv / (std + 1e-6), adv)
    return EstimatorOutput(advantages=on_policy(adv, policy(inp)), extras={"episode_advantages": adv})


@_reg(
    "reinforce_plus_plus",
    label="REINFORCE++",
    description=(
        "Reward minus its group mean (minus_baseline; a group of one gets 0), broadcast and whitened "
        "over the batch's policy tokens; no discount."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
    params={"minus_baseline": True},
    reference="reinforce_plus_plus_baseline",
)
def _rfpp(inp: EstimatorInput, minus_baseline: bool = True) -> EstimatorOutput:
    m = policy(inp)
    r = row_sums(inp)
    adv = r - baseline_and_std(r, inp.groups, leave_one_out=False)[0] if minus_baseline else r
    tok = _batch_norm(adv[:, None].expand(m.shape), m, clamp_count=False)
    return EstimatorOutput(advantages=torch.where(m, tok, torch.zeros((), dtype=tok.dtype)))


@_reg(
    "raw_reward",
    label="raw reward",
    description="The row's reward on every policy token, whitened over the batch's policy tokens.",
    kind="outcome",
    params={"normalize_advantages": True},
)
def _raw(inp: EstimatorInput, normalize_advantages: bool = True) -> EstimatorOutput:
    m = policy(inp)
    r = row_sums(inp)
    tok = r[:, None].expand(m.shape)
    if normalize_advantages:
        tok = _batch_norm(tok, m, clamp_count=True)
    return EstimatorOutput(advantages=torch.where(m, tok, torch.zeros((), dtype=tok.dtype)))


def _lambda_policy(
    m: Tensor, lam: float, gae_lambda_policy: float | None, length_adaptive_alpha: float
) -> Tensor | float:
    if length_adaptive_alpha > 0:
        lengths = m.sum(1).to(torch.float32)
        return (1.0 - 1.0 / (length_adaptive_alpha * lengths).clamp(min=1.0)).clamp(min=0.0, max=1.0)
    return lam if gae_lambda_policy is None else gae_lambda_policy


def _gae_rows(r: Tensor, v: Tensor, m: Tensor, gamma: float, lam: Tensor | float) -> tuple[Tensor, Tensor]:
    """GAE with a per-row lambda: rows grouped by their lambda (few distinct values)."""
    if not isinstance(lam, Tensor):
        return T.gae(r, v, m, gamma, float(lam))
    adv = torch.zeros_like(r)
    ret = torch.zeros_like(r)
    for value in torch.unique(lam).tolist():
        rows = (lam == value).nonzero().squeeze(1)
        a, t = T.gae(r[rows], v[rows], m[rows], gamma, float(value))
        adv[rows], ret[rows] = a, t
    return adv, ret


@_reg(
    "gae",
    label="GAE",
    description=(
        "GAE with carry-forward masking (tool spans skipped), the reward on the last policy token, "
        "no bootstrap; decoupled lambdas (gae_lambda_value for targets, gae_lambda_policy or a "
        "length-adaptive lambda for advantages); whitened over policy tokens by default."
    ),
    kind="token",
    reads=("rewards", "values"),
    params={
        "gae_lambda_value": None,
        "gae_lambda_policy": None,
        "length_adaptive_alpha": 0.0,
        "normalize_advantages": True,
    },
    reference="token_gae",
)
def _gae(
    inp: EstimatorInput,
    gae_lambda_value: float | None = None,
    gae_lambda_policy: float | None = None,
    length_adaptive_alpha: float = 0.0,
    normalize_advantages: bool = True,
) -> EstimatorOutput:
    if inp.values is None:
        raise ValueError("nemo_rl:gae needs values (a critic)")
    m = policy(inp)
    dtype = float_dtype(inp)
    rewards = T.outcome_rewards(m, row_sums(inp))
    v = inp.values.to(dtype)
    gamma, lam = float(inp.gamma), float(inp.lam)
    lam_value = lam if gae_lambda_value is None else gae_lambda_value
    lam_policy = _lambda_policy(m, lam, gae_lambda_policy, length_adaptive_alpha)
    decoupled = gae_lambda_value is not None or gae_lambda_policy is not None or length_adaptive_alpha > 0
    if decoupled:
        _, targets = T.gae(rewards, v, m, gamma, float(lam_value))
        adv, _ = _gae_rows(rewards, v, m, gamma, lam_policy)
    else:
        adv, targets = T.gae(rewards, v, m, gamma, lam)
    if normalize_advantages:
        mf = m.to(dtype)
        n = mf.sum() + 1e-8  # masked_mean's denominator
        mean = (adv * mf).sum() / n
        var = ((adv - mean).pow(2) * mf).sum() / n
        adv = (adv - mean) * torch.rsqrt(var + 1e-8)
    zero = torch.zeros((), dtype=dtype)
    return EstimatorOutput(advantages=torch.where(m, adv, zero), value_targets=targets)
