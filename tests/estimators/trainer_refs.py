"""The trainers' own advantage code, imported from their installed packages (``make install`` puts
OpenRLHF 0.11.2 and SkyRL 0.3.0 in the venv with ``--no-deps``, as verl 0.9.1).

Their advantage functions are plain torch, but the packages around them import GPU-sized stacks
at module level. We import the real modules and put stand-ins into ``sys.modules`` only for the
imports that would drag those in, only while importing, and say why for each:

* OpenRLHF: ``openrlhf.models.utils`` does ``import deepspeed`` (used by a ZeRO-3 helper only);
  ``openrlhf.models/__init__`` imports the actor (transformers + deepspeed + flash-attn);
  ``openrlhf.trainer.ray/__init__`` imports vLLM; ``openrlhf.trainer.ray.launcher`` (which
  ``experience_maker`` imports for a type name, ``RayActorGroup``) builds Ray actors over
  deepspeed; ``openrlhf.utils/__init__`` imports the math grader (sympy, pylatexenc). The
  packages are stood in for by empty packages over their real folders, so their submodules
  (``models/utils.py``, ``ppo_utils/*``) are the installed files themselves.
* SkyRL: ``skyrl.backends/__init__`` imports the Tinker API types (pydantic models that need
  Python >= 3.12) and ``skyrl.train.config`` imports ``skyrl_gym`` environments; ``ppo_utils``
  uses ``AlgorithmConfig`` from it only as a type name.

Every function used here is then the trainer's own code, unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any

import pytest
import torch


def _pkg_dir(top: str) -> str:
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{top} is not installed (make install puts it in the venv)")
    return list(spec.submodule_search_locations)[0]


@contextmanager
def _stand_ins(mods: dict[str, types.ModuleType]) -> Iterator[None]:
    """Put ``mods`` into sys.modules while importing; afterwards take them out again (the modules
    imported meanwhile keep what they bound), so nothing else in the process sees them."""
    saved = {k: sys.modules.get(k) for k in mods}
    sys.modules.update(mods)
    try:
        yield
    finally:
        for k, old in saved.items():
            if old is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = old


def _empty_package(name: str, path: str) -> types.ModuleType:
    """A package object over a real folder whose ``__init__`` is not run."""
    mod = types.ModuleType(name)
    mod.__path__ = [path]
    return mod


def _stub(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


@cache
def openrlhf_experience_maker() -> types.ModuleType:
    """``openrlhf.trainer.ppo_utils.experience_maker`` of the installed OpenRLHF 0.11.2."""
    root = _pkg_dir("openrlhf")
    # transformers asks importlib whether deepspeed is installed when these load: let it ask
    # before the stand-in is there (openrlhf.utils.utils imports AutoTokenizer).
    importlib.import_module("transformers.integrations.deepspeed")
    from transformers import AutoTokenizer  # noqa: F401

    mods = {
        "deepspeed": _stub("deepspeed"),
        "openrlhf.models": _empty_package("openrlhf.models", os.path.join(root, "models")),
        "openrlhf.utils": _empty_package("openrlhf.utils", os.path.join(root, "utils")),
        "openrlhf.trainer.ray": _empty_package("openrlhf.trainer.ray", os.path.join(root, "trainer", "ray")),
        "openrlhf.trainer.ray.launcher": _stub("openrlhf.trainer.ray.launcher", RayActorGroup=object),
    }
    with _stand_ins(mods):
        return importlib.import_module("openrlhf.trainer.ppo_utils.experience_maker")


@cache
def openrlhf_experience() -> types.ModuleType:
    """``openrlhf.trainer.ppo_utils.experience`` (the ``Experience`` dataclass)."""
    openrlhf_experience_maker()
    return sys.modules["openrlhf.trainer.ppo_utils.experience"]


@cache
def skyrl_ppo_utils() -> types.ModuleType:
    """``skyrl.backends.skyrl_train.utils.ppo_utils`` of the installed SkyRL 0.3.0."""
    root = _pkg_dir("skyrl")
    pytest.importorskip("jaxtyping")
    pytest.importorskip("loguru")
    mods = {
        "skyrl.backends": _empty_package("skyrl.backends", os.path.join(root, "backends")),
        "skyrl.backends.skyrl_train.utils": _empty_package(
            "skyrl.backends.skyrl_train.utils", os.path.join(root, "backends", "skyrl_train", "utils")
        ),
        "skyrl.train": _empty_package("skyrl.train", os.path.join(root, "train")),
        "skyrl.train.config": _stub("skyrl.train.config", AlgorithmConfig=object),
    }
    with _stand_ins(mods):
        return importlib.import_module("skyrl.backends.skyrl_train.utils.ppo_utils")


# ---- batches ------------------------------------------------------------------------------------

F64 = torch.float64


def agent_rows(
    n_groups: int = 5, n: int = 4, T: int = 40, seed: int = 0, dtype: torch.dtype = F64
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rewards, values, mask int64, groups) for ``n_groups`` contiguous groups of ``n`` rows on our
    layout: each row a few policy calls separated by tool spans, ending at its last policy token,
    right padding after it; small rewards on policy tokens, an outcome on the last policy token,
    rewards on some tool tokens (an environment's step reward) and on nothing after the end.
    Group 1 is all-equal (the outcome 0.75 alone: sums that are exact in binary); rows 2 and 3 of
    group 2 are truncated (cut off mid-call: they end on a policy token with no outcome)."""
    g = torch.Generator().manual_seed(seed)
    B = n_groups * n
    mask = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        L = int(torch.randint(T // 2, T, (1,), generator=g))
        mask[b, :L] = 1
        for _ in range(2):  # two tool spans inside the response
            s = int(torch.randint(2, L - 6, (1,), generator=g))
            mask[b, s : s + int(torch.randint(1, 5, (1,), generator=g))] = 0
        mask[b, L - 1] = 1
    mask[3, 0] = 0  # a row that starts on a template token
    pol = mask.bool()
    # tool tokens: not policy, between a row's first and last policy token
    tool = (~pol) & (torch.cumsum(mask.flip(1), 1).flip(1) > 0) & (torch.cumsum(mask, 1) > 0)
    rewards = torch.randn(B, T, generator=g, dtype=F64) * 0.1 * pol
    rewards += (
        torch.randn(B, T, generator=g, dtype=F64) * 0.3 * (tool & (torch.rand(B, T, generator=g) < 0.3))
    )
    outcome = (torch.rand(B, generator=g) < 0.5).double()
    outcome[2 * n + 2 : 2 * n + 4] = 0.0  # truncated: no outcome (see TRUNCATED)
    last = T - 1 - pol.flip(1).long().argmax(1)
    rewards[torch.arange(B), last] += outcome
    rewards[n : 2 * n] = 0.0
    rewards[torch.arange(n, 2 * n), last[n : 2 * n]] = 0.75
    values = torch.randn(B, T, generator=g, dtype=F64)
    groups = torch.arange(B) // n
    return rewards.to(dtype), values.to(dtype), mask, groups


def truncated_last_value(B: int, n: int = 4) -> torch.Tensor:
    """[B] bootstrap values of :func:`agent_rows`' truncated rows (NaN: terminated). No trainer
    here bootstraps a truncated row; the dialects do not read it either."""
    lv = torch.full((B,), float("nan"), dtype=F64)
    lv[2 * n + 2 : 2 * n + 4] = 0.6
    return lv


def close(
    ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor | None = None, atol: float = 1e-12
) -> None:
    """Equal on the policy tokens (``mask``; everywhere if None) to ``atol``."""
    o, t = ours.double(), theirs.double()
    if mask is not None:
        o, t = o[mask != 0], t[mask != 0]
    torch.testing.assert_close(o, t, rtol=0, atol=atol)


def close_f32(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    """Equal to float32 precision (2e-6 of the largest magnitude), for a trainer computing in float32."""
    o, t = ours.double(), theirs.double()
    if mask is not None:
        o, t = o[mask != 0], t[mask != 0]
    scale = max(t.abs().max().item(), 1e-6)
    assert (o - t).abs().max().item() <= 2e-6 * scale, (o - t).abs().max().item()


# ---- TRL ----------------------------------------------------------------------------------------


@cache
def trl_grpo_trainer() -> Any:
    """A TRL 1.16.0 ``GRPOTrainer`` on CPU over a 1-layer random Llama and a byte-level tokenizer
    trained here (nothing downloaded). Its one reward function returns each input's ``score``
    column, so the trainer's own ``_generate_and_score_completions`` turns the scores we give it
    into advantages."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    from tests.client.trainers import byte_level_tokenizer, tiny_llama

    hf_tok, model = tiny_llama(
        byte_level_tokenizer(["call the tool: search(x)\n", "the answer is 4\n"] * 20, vocab_size=280)
    )

    def score(*, score: list[float], **_columns: Any) -> list[float]:
        return [float(s) for s in score]

    args = trl.GRPOConfig(
        output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "creditlens-trl-ref"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        num_generations=2,
        max_completion_length=2,
        per_device_train_batch_size=2,
        max_steps=1,
        save_strategy="no",
    )
    dataset = datasets.Dataset.from_dict({"prompt": ["call the tool"] * 4, "score": [0.0] * 4})
    return trl.GRPOTrainer(
        model=model, reward_funcs=score, args=args, train_dataset=dataset, processing_class=hf_tok
    )


def trl_advantages(scores: torch.Tensor, num_generations: int, scale_rewards: str = "group") -> torch.Tensor:
    """[B] TRL 1.16.0's GRPO advantages of ``scores`` [B] in contiguous groups of ``num_generations``,
    from ``GRPOTrainer._generate_and_score_completions`` itself (it generates 2 tokens per row with
    the tiny model, scores them with our scores and forms the advantages). ``num_generations`` and
    ``scale_rewards`` are the trainer's config values, which that method reads from the trainer."""
    trainer = trl_grpo_trainer()
    trainer.num_generations = trainer.num_generations_eval = num_generations
    trainer.scale_rewards = scale_rewards
    inputs = [{"prompt": "call the tool", "score": float(s)} for s in scores.tolist()]
    with torch.no_grad():
        out = trainer._generate_and_score_completions(inputs)
    return out["advantages"]
