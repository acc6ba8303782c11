"""Per-token advantage estimators: pure math on torch tensors ([B, T] with a policy-token mask).

Conventions (docs/conventions.md): a reward lives on the policy token that earned it; time
advances only on policy tokens; every recursion carries its state unchanged across mask-0
positions; outputs are 0 off-mask.
"""

# builtin: the built-in estimators register themselves on import, so importing the package (as
# importing any of its modules does) fills the registry, and the registry never imports them back.
from . import builtin, dialects, native  # noqa: F401
from .groups import (
    GroupStats,
    batch_whiten,
    dr_grpo,
    gpg,
    group_center_batch_scale,
    group_mean,
    group_stats,
    grpo,
    grpo_passk,
    opo,
    rloo,
)
from .losses import TokenState, loss_token_states, loss_weights, loss_weights_and_states
from .registry import EstimatorInput, EstimatorOutput, EstimatorSpec, available, compute, get, register
from .stats import explained_variance, masked_mean, masked_var, whiten
from .token import (
    gae,
    nstep_returns,
    outcome_rewards,
    packed_gae,
    per_turn_mean,
    returns_to_go,
    td_errors,
    turn_gae,
    turn_spans,
)
from .verl_family import (
    optimal_token_baseline,
    reinforce_plus_plus,
    reinforce_plus_plus_baseline,
    remax,
    tir_optimal_token_baseline,
)

__all__ = [
    "EstimatorInput",
    "EstimatorOutput",
    "EstimatorSpec",
    "GroupStats",
    "available",
    "batch_whiten",
    "compute",
    "dr_grpo",
    "explained_variance",
    "gae",
    "get",
    "gpg",
    "group_center_batch_scale",
    "group_mean",
    "group_stats",
    "grpo",
    "grpo_passk",
    "loss_token_states",
    "loss_weights",
    "loss_weights_and_states",
    "masked_mean",
    "masked_var",
    "native",
    "nstep_returns",
    "opo",
    "optimal_token_baseline",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "tir_optimal_token_baseline",
    "outcome_rewards",
    "packed_gae",
    "per_turn_mean",
    "register",
    "returns_to_go",
    "rloo",
    "TokenState",
    "td_errors",
    "turn_gae",
    "turn_spans",
    "whiten",
]
