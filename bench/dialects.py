"""The trainers' dialects (``estimators/dialects/``) against the trainers' own functions, on one
agent batch: B=256, T=8192, float32, calls of 20-200 policy tokens between tool outputs of
10-400 tokens (``bench.estimators.agent_batch``), groups of 8, an outcome on each row's last
policy token, critic values.

Each dialect runs through the registry (``estimators.compute``), timed round-robin with the
function of the installed trainer that computes the same thing, on the same tensors in the
layout that trainer reads (verl 0.9.1: its functions with uuid labels and the int64 mask;
OpenRLHF 0.11.2: ``RemoteExperienceMaker.compute_advantages_and_returns`` on ``Experience``
micro-batches of 8 rows; SkyRL 0.3.0: ``ppo_utils.compute_advantages_and_returns`` with its
response mask). TRL computes its GRPO advantages inline in ``GRPOTrainer``: only ours is timed.
A trainer that is not installed is skipped (``make install`` installs them all).

Figures: ``<dialect>.ours_s``, ``.trainer_s`` (medians after a warm-up, ours and the trainer's
timed round-robin; a trainer's function that takes over half a second runs LOOP_ROUNDS times),
``.speedup`` (trainer / ours) and, per dialect, whether the trainer's function loops in Python
(over tokens, rows or groups) or is vectorised (``.trainer_kind``): the goal is >= 20x over loops,
>= 1x over vectorised code. ``.max_diff`` is the largest difference between the two results' advantages on
the policy tokens over the largest magnitude (the timed calls compute the same thing: float32, so
~1e-7 to 1e-6; the whitened ones sum 600,000 float32 numbers). Then verl's ``grpo_vectorized`` /
``rloo_vectorized`` at B=4096, T=4096 against the ``verl:`` GRPO and RLOO dialects. One torch
thread throughout, the server's malloc settings (``app.malloc.tune_malloc``); nothing is cached
between calls (each call allocates its outputs).
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import time
from collections.abc import Callable
from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import torch

from app.malloc import tune_malloc
from bench.estimators import agent_batch
from estimators import EstimatorInput, compute
from estimators.dialects._common import response_span

B, T, GROUP, ROUNDS, LOOP_ROUNDS = 256, 8192, 8, 9, 1
BG, TG = 4096, 4096  # verl's vectorised GRPO/RLOO against the dialects at this size too
COMPARE = True  # time the trainers' functions (their loops over T=8192 take seconds)
QUICK = {"B": 16, "T": 256, "BG": 64, "TG": 128, "ROUNDS": 1, "LOOP_ROUNDS": 1, "COMPARE": False}

Fn = Callable[[], Any]


def _interleaved(fns: dict[str, Fn], rounds: int) -> dict[str, float]:
    """Median seconds of each fn after a warm-up, timed round-robin (a load change hits all alike)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _once(fn: Fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


SLOW = 0.5  # seconds: a trainer's function slower than this runs LOOP_ROUNDS times, not ROUNDS


def _max_diff(ours: torch.Tensor, theirs: Any, mask: torch.Tensor) -> float | None:
    """max |ours - theirs| on the policy tokens over max |theirs|; ``theirs`` is a trainer's
    (advantages, returns) or OpenRLHF's list of ``Experience`` micro-batches. None if neither."""
    if isinstance(theirs, tuple):
        adv = theirs[0]
    elif isinstance(theirs, list) and theirs and hasattr(theirs[0], "advantages"):
        adv = torch.cat([e.advantages for e in theirs])
    else:
        return None
    on = mask != 0
    a, b = ours.double()[on], adv.double()[on]
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def _batch() -> tuple[EstimatorInput, dict[str, Any]]:
    rewards, values, mask = agent_batch(B, T, seed=3)
    g = torch.Generator().manual_seed(4)
    m = mask.bool()
    last = T - 1 - m.flip(1).to(torch.uint8).argmax(1)
    outcome = (torch.rand(B, generator=g) < 0.4).float()
    rewards[torch.arange(B), last] += outcome
    groups = torch.arange(B) // GROUP
    logp = -torch.rand(B, T, generator=g) * 3
    spp = torch.exp(2 * logp) + torch.rand(B, T, generator=g) * 0.2
    inp = EstimatorInput(
        rewards=rewards,
        mask=mask,
        values=values,
        groups=groups,
        gamma=0.99,
        lam=0.95,
        logprobs=logp,
        sum_pi_squared=spp,
        reward_baselines=torch.rand(B, generator=g),
    )
    uids = np.array([f"uid-{int(x)}" for x in groups], dtype=object)
    return inp, {"uids": uids, "span": response_span(m)}


def _verl_fns(inp: EstimatorInput, uids: np.ndarray) -> dict[str, tuple[Fn, str]]:
    try:
        from omegaconf import OmegaConf
        from verl.trainer.ppo import core_algos as v
    except Exception as exc:  # noqa: BLE001
        print(f"  verl not importable ({type(exc).__name__}: {exc}); skipping it")
        return {}
    r, m, vals = inp.rewards, inp.mask, inp.values
    cfg = OmegaConf.create({"gamma": inp.gamma, "norm_adv_by_std_in_grpo": True})
    lp, spp, rb = inp.logprobs, inp.sum_pi_squared, inp.reward_baselines
    return {
        "gae": (lambda: v.compute_gae_advantage_return(r, vals, m, inp.gamma, inp.lam), "loop"),
        "reinforce_plus_plus": (lambda: v.compute_reinforce_plus_plus_outcome_advantage(r, m, cfg), "loop"),
        "grpo": (lambda: v.compute_grpo_outcome_advantage(r, m, uids), "loop"),
        "rloo": (lambda: v.compute_rloo_outcome_advantage(r, m, uids), "loop"),
        "opo": (lambda: v.compute_opo_outcome_advantage(r, m, uids), "loop"),
        "gpg": (lambda: v.compute_gpg_outcome_advantage(r, m, uids), "loop"),
        "reinforce_plus_plus_baseline": (
            lambda: v.compute_reinforce_plus_plus_baseline_outcome_advantage(r, m, uids),
            "loop",
        ),
        "gdpo": (lambda: v.compute_gdpo_outcome_advantage(r, m, uids), "loop"),
        "grpo_passk": (lambda: v.compute_grpo_passk_outcome_advantage(r, m, uids, config=cfg), "loop"),
        "grpo_vectorized": (lambda: v.compute_grpo_vectorized_outcome_advantage(r, m, uids), "vectorised"),
        "rloo_vectorized": (lambda: v.compute_rloo_vectorized_outcome_advantage(r, m, uids), "vectorised"),
        "remax": (lambda: v.compute_remax_outcome_advantage(r, rb, m), "vectorised"),
        "optimal_token_baseline": (
            lambda: v.compute_optimal_token_baseline_advantage(r, m, uids, lp, spp),
            "loop",
        ),
        "tir_optimal_token_baseline": (
            lambda: v.compute_multi_turn_optimal_token_baseline_advantage(r, m, uids, lp, spp),
            "loop",
        ),
    }


def _trainer_refs() -> Any:
    """The test helper that imports OpenRLHF's and SkyRL's installed code without their GPU stacks."""
    from tests.estimators import trainer_refs

    return trainer_refs


def _openrlhf_fns(inp: EstimatorInput) -> dict[str, tuple[Fn, str]]:
    if importlib.util.find_spec("openrlhf") is None:
        print("  OpenRLHF not installed; skipping it")
        return {}
    refs = _trainer_refs()
    mod = refs.openrlhf_experience_maker()
    Experience = refs.openrlhf_experience().Experience
    scores = inp.rewards.sum(-1)
    am = inp.mask.bool()
    kl = torch.zeros(B, T)

    def run(estimator: str) -> Any:
        args = NS(
            algo=NS(advantage=NS(estimator=estimator, gamma=inp.gamma, lambd=inp.lam, no_std_norm=False)),
            rollout=NS(n_samples_per_prompt=GROUP),
            reward=NS(clip_range=(-10, 10), overlong_buffer_len=None, stop_properly_penalty_coef=None),
        )
        maker = mod.RemoteExperienceMaker.__new__(mod.RemoteExperienceMaker)
        maker.strategy, maker.args, maker.advantage_estimator = NS(args=args), args, estimator
        maker.kl_ctl = NS(value=0.0)
        exps = [
            Experience(
                action_mask=am[s : s + 8],
                values=inp.values[s : s + 8],
                rewards=scores[s : s + 8],
                kl=kl[s : s + 8],
                index=list(range(s, min(s + 8, B))),
                info={},
            )
            for s in range(0, B, 8)
        ]
        return maker.compute_advantages_and_returns(exps)

    names = ("gae", "reinforce", "rloo", "reinforce_baseline", "group_norm", "dr_grpo", "flash_reinforce")
    return {n: ((lambda n=n: run(n)), "loop") for n in names}


def _skyrl_fns(inp: EstimatorInput, uids: np.ndarray, span: torch.Tensor) -> dict[str, tuple[Fn, str]]:
    if importlib.util.find_spec("skyrl") is None:
        print("  SkyRL not installed; skipping it")
        return {}
    p = _trainer_refs().skyrl_ppo_utils()
    r = torch.where(span, inp.rewards, 0.0)
    v = torch.where(span, inp.values, 0.0)
    rm = span.long()

    def run(estimator: str) -> Any:
        return p.compute_advantages_and_returns(
            token_level_rewards=r,
            response_mask=rm,
            index=uids,
            adv_estimator=estimator,
            config=None,
            values=v,
            gamma=inp.gamma,
            lambd=inp.lam,
        )

    return {n: ((lambda n=n: run(n)), "loop") for n in ("gae", "reinforce++", "grpo", "rloo", "maxrl")}


def _passes(inp: EstimatorInput, out: dict[str, Any]) -> None:
    """The [B, T] passes both sides make, timed alone: what bounds a ratio where the trainer's
    loop is short. ``write_BT``: a fresh float32 [B, T] output written once (the allocation's page
    faults included: every dialect returns one); ``row_sums``: ``rewards.sum(-1)``;
    ``broadcast_int64_mask``: ``s.unsqueeze(-1) * response_mask`` as verl and SkyRL end their
    outcome estimators (torch converts the int64 mask to float first); ``ours_broadcast``: the
    dialects' compiled broadcast of the same; ``exp``: ``torch.exp(logprobs)`` (the optimal token
    baselines)."""
    from estimators.dialects._common import broadcast

    s = inp.rewards.sum(-1)
    lp = inp.logprobs
    assert lp is not None
    t = _interleaved(
        {
            "write_BT": lambda: torch.empty(B, T).fill_(1.0),
            "row_sums": lambda: inp.rewards.sum(-1),
            "broadcast_int64_mask": lambda: s.unsqueeze(-1) * inp.mask,
            "ours_broadcast": lambda: broadcast(s, inp.mask),
            "exp": lambda: torch.exp(lp),
        },
        ROUNDS,
    )
    for k, v in t.items():
        out[f"passes.{k}_s"] = round(v, 5)


def _vectorised_at_scale(out: dict[str, Any]) -> None:
    """verl's ``grpo_vectorized`` / ``rloo_vectorized`` against ``verl:grpo``, ``verl:rloo`` and
    their vectorised twins at B=BG, T=TG in groups of 8 (one outcome per row, right padding)."""
    try:
        from verl.trainer.ppo import core_algos as v
    except Exception:  # noqa: BLE001
        return
    g = torch.Generator().manual_seed(1)
    scores = (torch.rand(BG, generator=g) < 0.3).float()
    rmask = torch.zeros(BG, TG, dtype=torch.int64)
    lengths = torch.randint(100, TG, (BG,), generator=g)
    rmask[torch.arange(TG)[None, :] < lengths[:, None]] = 1
    r_tok = torch.zeros(BG, TG)
    r_tok[torch.arange(BG), lengths - 1] = scores
    labels = torch.arange(BG) // GROUP
    inp = EstimatorInput(rewards=r_tok, mask=rmask, groups=labels)
    idx = labels.numpy()
    t = _interleaved(
        {
            "verl_grpo_vectorized": lambda: v.compute_grpo_vectorized_outcome_advantage(r_tok, rmask, idx),
            "verl_rloo_vectorized": lambda: v.compute_rloo_vectorized_outcome_advantage(r_tok, rmask, idx),
            "verl:grpo": lambda: compute("verl:grpo", inp),
            "verl:grpo_vectorized": lambda: compute("verl:grpo_vectorized", inp),
            "verl:rloo": lambda: compute("verl:rloo", inp),
            "verl:rloo_vectorized": lambda: compute("verl:rloo_vectorized", inp),
        },
        ROUNDS,
    )
    size = f"B{BG}_T{TG}"
    for name in ("grpo", "rloo"):
        theirs = t[f"verl_{name}_vectorized"]
        out[f"{size}.verl_{name}_vectorized_s"] = round(theirs, 5)
        for ours in (f"verl:{name}", f"verl:{name}_vectorized"):
            out[f"{size}.{ours}.ours_s"] = round(t[ours], 5)
            out[f"{size}.{ours}.speedup"] = round(theirs / t[ours], 2)


def run() -> dict[str, Any]:
    # One thread: the trainers' Python loops run on one, and on a shared 2-core machine an op on
    # two threads waits for both to be scheduled (bench/estimators.py shows both).
    torch.set_num_threads(1)
    out: dict[str, Any] = {"load_average_1min_at_start": round(os.getloadavg()[0], 2)}
    # The server's malloc settings (app/malloc.py), as bench/estimators.py and bench/loss.py: the
    # dialects run in the server, and without them glibc hands each freed [B, T] block back to the
    # kernel, so every call (ours and the trainer's alike) faults its outputs in page by page.
    out["malloc_tuned"] = tune_malloc()
    inp, extra = _batch()
    out["policy_token_share"] = round(inp.mask.float().mean().item(), 3)
    trainers: dict[str, dict[str, tuple[Fn, str]]] = {"trl": {}}
    if COMPARE:
        trainers["verl"] = _verl_fns(inp, extra["uids"])
        trainers["openrlhf"] = _openrlhf_fns(inp)
        trainers["skyrl"] = _skyrl_fns(inp, extra["uids"], extra["span"])
    else:
        trainers.update({"verl": {}, "openrlhf": {}, "skyrl": {}})
    from estimators import available

    for name, spec in available().items():
        if spec.trainer not in trainers:
            continue
        short = name.split(":", 1)[1]
        ours: Fn = lambda name=name: compute(name, inp)  # noqa: E731
        theirs = trainers[spec.trainer].get(short)
        if theirs is None:
            out[f"{name}.ours_s"] = round(_interleaved({"ours": ours}, ROUNDS)["ours"], 5)
            continue
        fn, kind = theirs
        first = _once(fn)  # also the warm-up
        if first > SLOW:
            # A Python loop over T=8192 takes seconds to tens of seconds: LOOP_ROUNDS more calls.
            t = _interleaved({"ours": ours}, ROUNDS)
            t["trainer"] = statistics.median(_once(fn) for _ in range(LOOP_ROUNDS))
        else:
            t = _interleaved({"ours": ours, "trainer": fn}, ROUNDS)
        diff = _max_diff(compute(name, inp).advantages, fn(), inp.mask)
        if diff is not None:
            out[f"{name}.max_diff"] = float(f"{diff:.2g}")
        out[f"{name}.ours_s"] = round(t["ours"], 5)
        out[f"{name}.trainer_s"] = round(t["trainer"], 5)
        out[f"{name}.trainer_kind"] = kind
        out[f"{name}.speedup"] = round(t["trainer"] / t["ours"], 2)
    _passes(inp, out)
    if COMPARE:
        _vectorised_at_scale(out)
    out["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<60} {v}")
