"""AReaL 1.0.4's own advantage code, imported for the tests without its runtime.

``areal`` is installed with ``--no-deps`` (see the Makefile). Importing ``areal.trainer.ppo.actor``
the ordinary way runs ``areal/__init__.py``, which starts its inference/RPC stack (aiohttp, tenacity,
hydra, numba, torchdata, einops, ...), none of which the advantage code uses. So this helper:

- skips the ``__init__.py`` of every ``areal`` package (the package objects are placeholders whose
  ``__path__`` is the real folder, so the real modules ``areal.trainer.ppo.actor``,
  ``areal.utils.data`` and ``areal.api.cli_args`` load from AReaL's own files), and
- stands in for the third-party modules that are not installed, for the time of the import only
  (they are taken out of ``sys.modules`` afterwards, so no other test sees them).

What runs is AReaL's code: ``PPOActor._compute_advantages``, ``Normalization`` and ``NormConfig``.
The placeholders only answer the names those modules import at the top (loggers, tracers, RPC
controllers), which the advantage code never calls in a way that matters.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from typing import Any

import torch

# Third-party modules areal's top-level imports name but the advantage code never uses.
_MISSING_OK = ("aiohttp", "tenacity", "hydra", "numba", "torchdata", "einops", "uvloop", "colorlog")


class _Placeholder(types.ModuleType):
    """A module whose every attribute is another placeholder (callable, subclassable, indexable)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _Placeholder(f"{self.__name__}.{name}")
        value.__path__ = []
        setattr(self, name, value)
        return value

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ARG002
        return _Placeholder(f"{self.__name__}()")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __or__(self, other: Any) -> Any:
        return self

    def __ror__(self, other: Any) -> Any:
        return self

    def __getitem__(self, key: Any) -> Any:
        return self


class _ColoredFormatter(logging.Formatter):
    """colorlog.ColoredFormatter's constructor shape (areal/utils/logging.py subclasses it)."""

    def __init__(
        self,
        fmt: str | None = None,
        datefmt: str | None = None,
        style: Any = "%",
        *a: Any,  # noqa: ARG002
        **k: Any,  # noqa: ARG002
    ):
        super().__init__(fmt, datefmt, style)


class _Finder(MetaPathFinder, Loader):
    def __init__(self, site: str, missing: set[str]):
        self.site = site
        self.missing = missing

    def find_spec(self, name: str, path: Any, target: Any = None) -> ModuleSpec | None:  # noqa: ARG002
        top = name.split(".")[0]
        if top in self.missing:
            return ModuleSpec(name, self, is_package=True)
        if top == "areal":
            folder = os.path.join(self.site, *name.split("."))
            if os.path.isdir(folder):  # a package: skip its __init__.py
                spec = ModuleSpec(name, self, is_package=True)
                spec.submodule_search_locations = [folder]
                return spec
        return None  # a real module file: the ordinary finders load it

    def create_module(self, spec: ModuleSpec) -> types.ModuleType:
        module = _Placeholder(spec.name)
        module.__path__ = list(spec.submodule_search_locations or [])
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if module.__name__ == "colorlog":
            module.ColoredFormatter = _ColoredFormatter  # type: ignore[attr-defined]


_CACHE: dict[str, types.ModuleType] = {}


def areal_modules() -> tuple[types.ModuleType, types.ModuleType, types.ModuleType]:
    """(``areal.trainer.ppo.actor``, ``areal.utils.data``, ``areal.api.cli_args``) of the installed
    areal; ImportError if areal is not installed."""
    if not _CACHE:
        spec = importlib.util.find_spec("areal")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("areal is not installed (pip install --no-deps areal==1.0.4)")
        site = os.path.dirname(list(spec.submodule_search_locations)[0])
        missing = {m for m in _MISSING_OK if importlib.util.find_spec(m) is None}
        finder = _Finder(site, missing)
        sys.meta_path.insert(0, finder)
        try:
            _CACHE["actor"] = importlib.import_module("areal.trainer.ppo.actor")
            _CACHE["data"] = importlib.import_module("areal.utils.data")
            _CACHE["cli_args"] = importlib.import_module("areal.api.cli_args")
        finally:
            sys.meta_path.remove(finder)
            for name in [n for n in sys.modules if n.split(".")[0] in missing]:
                del sys.modules[name]
    return _CACHE["actor"], _CACHE["data"], _CACHE["cli_args"]


def compute_advantages(
    *,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    attention_mask: torch.Tensor,
    values: torch.Tensor | None,
    discount: float,
    gae_lambda: float,
    reward_norm: dict[str, Any] | None = None,
    adv_norm: dict[str, Any] | None = None,
    reward_scaling: float = 1.0,
    reward_bias: float = 0.0,
    reward_clip: float = 20.0,
    mask_no_eos_with_zero: bool = False,
) -> dict[str, Any]:
    """Run AReaL 1.0.4's ``PPOActor._compute_advantages`` on one padded batch (AReaL's own layout:
    ``loss_mask`` and ``attention_mask`` unrolled [B, T], ``values`` in its rolled coordinates) and
    return its output dict. kl_ctl = 0 and no reference model; the log-probs are zeros."""
    actor, _, cli = areal_modules()
    norm = cli.NormConfig
    config = types.SimpleNamespace(
        reward_bias=reward_bias,
        reward_scaling=reward_scaling,
        reward_clip=reward_clip,
        kl_ctl=0.0,
        kl_estimator="k1",
        adv_norm=norm(**adv_norm) if adv_norm is not None else None,
        reward_norm=norm(**reward_norm) if reward_norm is not None else None,
        discount=discount,
        gae_lambda=gae_lambda,
        mask_no_eos_with_zero=mask_no_eos_with_zero,
        temperature=1.0,
        m2_threshold=None,
        use_decoupled_loss=False,
        recompute_logprob=False,
        rejection_sampling=None,
        eps_clip=0.2,
        overlong_reward_penalty=False,
    )
    ppo = actor.PPOActor.__new__(actor.PPOActor)
    actor.PPOActor.__init__(ppo, config, engine=None)
    B, T = loss_mask.shape
    data: dict[str, Any] = {
        "input_ids": torch.zeros(B, T, dtype=torch.long),
        "attention_mask": attention_mask,
        "loss_mask": loss_mask,
        "rewards": rewards,
        "logprobs": torch.zeros(B, T, dtype=torch.float32),
    }
    if values is not None:
        data["values"] = values
    result: dict[str, Any] = ppo._compute_advantages(data)
    return result
