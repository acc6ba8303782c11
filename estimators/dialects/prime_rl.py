"""prime-rl 0.8.1.dev's group advantages on our [B, T] layout (read, not run: not on PyPI).

Code read (PrimeIntellect-ai/prime-rl; docs/conventions.md, "prime-rl", names the commits):
``src/prime_rl/orchestrator/algo/grpo.py`` (``GRPOAlgorithm.assign_advantages`` ->
``assign_group_norm``), ``src/prime_rl/orchestrator/algo/advantage.py`` (``default_advantage_fn``,
``max_rl_advantage_fn``, ``AdvantageInputs.broadcast``) and ``src/prime_rl/orchestrator/algo/max_rl.py``.

- **grpo**: the group's rewards as a float32 tensor, minus their mean; no std division, no
  epsilon. A group of one gets 0 (r - r), an all-equal group 0.
- **max_rl** (arXiv:2602.02710): ``(r - mean) / mean`` in float32; a group whose mean reward is
  <= 0 gets 0 everywhere.

Both are one number per rollout, broadcast by ``AdvantageInputs.broadcast`` over every completion
token, interleaved environment-observation (tool) tokens included: prime-rl's loss mask removes
those, ours are 0 there. No discount: gamma and lambda are not read. The rollout's reward is the
sum of the row's rewards at every position (the environment scores a rollout with one number). The
optional ``length_penalty`` shaping (off by default) is not reproduced.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..groups import group_ids
from ..registry import EstimatorInput, EstimatorOutput
from ._common import Dialects, float_dtype, on_policy, policy, row_sums

__all__ = ["group_mean32"]

_TRAINER = "prime_rl"
_VERSION = "0.8.1.dev"
_reg = Dialects(_TRAINER, _VERSION)
F32 = torch.float32


def group_mean32(r: Tensor, groups: object) -> tuple[Tensor, Tensor]:
    """(rewards as float32 [B], each row's group mean in float32 [B])."""
    r32 = r.to(F32)
    B = r32.shape[0]
    inv, G = group_ids(groups, B, r32.device)  # type: ignore[arg-type]
    zeros = torch.zeros(G, dtype=F32, device=r32.device)
    mean = zeros.index_add(0, inv, r32) / zeros.index_add(0, inv, torch.ones_like(r32))
    return r32, mean[inv]


def _out(inp: EstimatorInput, adv32: Tensor) -> EstimatorOutput:
    dtype = float_dtype(inp)
    adv = adv32.to(dtype)
    return EstimatorOutput(advantages=on_policy(adv, policy(inp)), extras={"episode_advantages": adv})


@_reg(
    "grpo",
    label="GRPO",
    description="The row's reward minus its group mean in float32: no std division (a group of one gets 0).",
    kind="outcome",
    reads=("rewards", "groups"),
    reference="dr_grpo",
)
def _grpo(inp: EstimatorInput) -> EstimatorOutput:
    r, mean = group_mean32(row_sums(inp), inp.groups)
    return _out(inp, r - mean)


@_reg(
    "max_rl",
    label="MaxRL",
    description=(
        "(reward - group mean) / group mean in float32; 0 for a group whose mean reward is <= 0 "
        "(meant for non-negative, usually binary rewards)."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
)
def _max_rl(inp: EstimatorInput) -> EstimatorOutput:
    r, mean = group_mean32(row_sums(inp), inp.groups)
    positive = mean > 0
    adv = torch.where(positive, (r - mean) / torch.where(positive, mean, torch.ones_like(mean)), 0.0)
    return _out(inp, adv)
