"""The trainers' own policy-loss code for the loss-weight tests, imported from their installed
packages (OpenRLHF 0.11.2, SkyRL 0.3.0: ``make install`` puts them in the venv with
``--no-deps``), with the stand-ins of tests/estimators/trainer_refs.py for the imports that would
drag a GPU stack in, only while importing:

* ``openrlhf.models.loss`` imports ``openrlhf.models.utils``, which does ``import deepspeed`` (used
  by a ZeRO-3 helper only), and its package ``__init__`` imports the actor (transformers,
  deepspeed, flash-attn): ``deepspeed`` is an empty module and ``openrlhf.models`` an empty package
  over its real folder, so ``loss.py`` and ``utils.py`` are the installed files themselves.
* SkyRL: trainer_refs.skyrl_ppo_utils (its reasons are written there).

Plus a batch with tool spans for every trainer's loss test, and autograd of a loss."""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable
from functools import cache

import torch

from tests.estimators.trainer_refs import _empty_package, _pkg_dir, _stand_ins, _stub, skyrl_ppo_utils

F64 = torch.float64
__all__ = ["F64", "autograd_weights", "make_batch", "openrlhf_loss", "skyrl_ppo_utils"]


@cache
def openrlhf_loss() -> types.ModuleType:
    """``openrlhf.models.loss`` of the installed OpenRLHF 0.11.2."""
    root = _pkg_dir("openrlhf")
    mods = {
        "deepspeed": _stub("deepspeed"),
        "openrlhf.models": _empty_package("openrlhf.models", os.path.join(root, "models")),
    }
    with _stand_ins(mods):
        return importlib.import_module("openrlhf.models.loss")


def make_batch(seed: int, B: int = 12, T: int = 30) -> tuple[torch.Tensor, ...]:
    """(advantages, log_prob, old_log_prob, rollout_log_prob, mask float64): right padding, two tool
    spans per row, a fully masked row (3), outcome-style rows (0, 1), ratios and train/rollout
    ratios that clip, finite garbage off the mask."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=F64)
    for b in range(B):
        L = int(torch.randint(3, T, (1,), generator=g))
        mask[b, :L] = 1
        for _ in range(2):
            s = int(torch.randint(1, L, (1,), generator=g))
            mask[b, s : s + int(torch.randint(1, 4, (1,), generator=g))] = 0
    mask[3] = 0
    adv = torch.randn(B, T, generator=g, dtype=F64)
    adv[0], adv[1] = 0.8, -1.3
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3 - 0.05
    lp = old + torch.randn(B, T, generator=g, dtype=F64) * 0.4
    rollout = old + torch.randn(B, T, generator=g, dtype=F64) * 0.5
    off = mask == 0
    return torch.where(off, 0.3, adv), torch.where(off, -2.0, lp), torch.where(off, -2.0, old), rollout, mask


def autograd_weights(loss_of: Callable[[torch.Tensor], torch.Tensor], lp: torch.Tensor) -> torch.Tensor:
    """``-d loss / d log_prob`` of a trainer's loss ``loss_of(log_prob)`` by backward()."""
    x = lp.clone().requires_grad_(True)
    loss_of(x).backward()
    assert x.grad is not None
    return -x.grad
