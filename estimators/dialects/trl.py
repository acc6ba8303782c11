"""TRL 1.16.0's GRPO advantages (``trl/trainer/grpo_trainer.py``,
``GRPOTrainer._generate_and_score_completions``), on our [B, T] layout.

TRL scores each completion with its reward functions (one number per completion, so the dialect's
reward is the sum of every reward of the row: a reward on a tool token counts), in a float32
tensor, and groups completions by ``rewards.view(-1, num_generations)``:

* ``scale_rewards="group"`` (the default; ``True`` means the same): ``(r - group mean) / (group
  std + 1e-4)`` with the unbiased std (``trl.trainer.utils.nanstd``);
* ``"batch"``: the group mean, the std of the whole batch;
* ``"none"`` (``False``): ``r - group mean``.

A group of one has a NaN std (n - 1 = 0), which ``nan_to_num`` turns into an advantage of 0 (TRL
itself never forms one in training: ``num_generations >= 2``). The advantage is one number per
completion; TRL's loss mask is ``completion_mask * tool_mask``, so it lands on the policy tokens,
0 elsewhere here. Groups come from ``inp.groups``; when they are contiguous blocks of one size
(TRL's own layout) the same float32 reductions run, so rounding matches too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..groups import group_ids
from ..registry import EstimatorInput, EstimatorOutput
from ._common import Dialects, broadcast, contiguous_size, float_dtype, row_sums

VERSION = "1.16.0"
_reg = Dialects("trl", VERSION)
EPS = 1e-4  # TRL's GRPO epsilon, added to the std
SCALES = ("group", "batch", "none")


def nanstd(x: Tensor, dim: int | None = None) -> Tensor:
    """TRL's ``nanstd`` (the same ops): unbiased, NaN where fewer than 2 values."""
    mean = torch.nanmean(x, dim=dim, keepdim=True)
    variance = torch.nanmean((x - mean) ** 2, dim=dim, keepdim=True)
    count = torch.sum(~torch.isnan(x), dim=dim, keepdim=True)
    correction = count / (count - 1)
    correction = torch.where(count > 1, correction, torch.full_like(correction, float("nan")))
    variance *= correction
    std = torch.sqrt(variance)
    return std.squeeze(dim) if dim is not None else std.reshape(())


def _group_stats_f32(r: Tensor, inp: EstimatorInput) -> tuple[Tensor, Tensor]:
    """[B] group mean and unbiased group std (NaN for a group of one) in float32, for groups that
    are not contiguous blocks of one size."""
    B = r.shape[0]
    inv, G = group_ids(inp.groups, B, r.device)
    cnt = torch.zeros(G, dtype=torch.float32).index_add_(0, inv, torch.ones_like(r))
    mean = torch.zeros(G, dtype=torch.float32).index_add_(0, inv, r) / cnt
    c = r - mean[inv]
    m2 = torch.zeros(G, dtype=torch.float32).index_add_(0, inv, c * c)
    std = torch.sqrt(m2 / cnt * (cnt / (cnt - 1)))
    std = torch.where(cnt > 1, std, float("nan"))
    return mean[inv], std[inv]


def advantages(inp: EstimatorInput, scale_rewards: str | bool = "group") -> Tensor:
    """[B] float32 TRL GRPO advantages of the rows of ``inp`` (see the module docstring)."""
    # GRPOConfig turns the older bool into a level; a config file or a link spells it as text.
    scale = "group" if scale_rewards in (True, "true", "True") else scale_rewards
    scale = "none" if scale in (False, "false", "False") else scale
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}, got {scale_rewards!r}")
    r = row_sums(inp).to(torch.float32)  # rewards_per_func is a float32 tensor
    B = r.shape[0]
    if B == 0:
        return r
    n = contiguous_size(inp.groups, B)
    if n is not None:  # TRL's own reductions on the view(-1, num_generations) layout
        mean = torch.nanmean(r.view(-1, n), dim=1).repeat_interleave(n, dim=0)
        std = nanstd(r.view(-1, n), dim=1).repeat_interleave(n, dim=0) if n > 1 else torch.zeros_like(r)
    else:
        mean, std = _group_stats_f32(r, inp)
    if scale == "batch":
        std = nanstd(r).expand_as(r) if B > 1 else torch.zeros_like(r)
    adv = r - mean
    if scale != "none":
        adv = adv / (std + EPS)
    return torch.nan_to_num(adv, nan=0.0)


@_reg(
    "grpo",
    label="GRPO",
    description=(
        "TRL's GRPO: the completion's reward (every reward of the row) minus its group's mean, over "
        "the group's unbiased std + 1e-4 (scale_rewards='group'; 'batch': the batch std; 'none': no "
        "scaling), in float32; a group of one gets 0. The 1e-4 shrinks low-variance groups: "
        "0.47x verl's advantages where the group std is 8.5e-5."
    ),
    kind="outcome",
    reads=("rewards", "groups"),
    params={"scale_rewards": "group"},
    reference="grpo",
)
def _trl_grpo(inp: EstimatorInput, scale_rewards: str | bool = "group") -> EstimatorOutput:
    adv = advantages(inp, scale_rewards)
    dtype = float_dtype(inp)
    return EstimatorOutput(
        advantages=broadcast(adv, inp.mask, dtype), extras={"episode_advantages": adv.to(dtype)}
    )
