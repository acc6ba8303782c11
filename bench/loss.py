"""Benchmark of ``estimators.loss_weights`` (the per-token policy-loss weights) at B=512, T=8192,
float64: ``vanilla``, ``token-mean``, token TIS (threshold 2), against

* a 5-pass memory floor: one elementwise pass (``torch.neg`` into a buffer allocated once) over
  each of the five [B, T] float64 inputs (advantages, log-probs, old and rollout log-probs, the
  mask as float64), measured in the same run; goal: within 2x;
* verl 0.9.1's own ``compute_policy_loss_vanilla`` plus ``backward()`` on the same batch (its
  rollout weights from ``compute_rollout_correction_weights``, outside the timing): goal >= 20x.

Also printed: the torch path (``CREDITLENS_NATIVE=0``), the token states, and the other losses on
the torch path. Medians after a warm-up, timed round-robin so a shared machine's load hits all
alike; ``torch.set_num_threads(2)``; with the server's malloc settings (``app.malloc``).
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from app.malloc import tune_malloc
from estimators import loss_weights, loss_weights_and_states, native


def batch(B: int, T: int, seed: int = 0):
    """advantages, log_prob, old_log_prob, rollout_log_prob (float64) and a bool mask (right
    padding, ~70 % of positions) where clipping and truncation bite."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 3
    lp = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    rollout = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3
    return adv, lp, old, rollout, mask


def _interleaved(fns: dict, rounds: int) -> dict:
    for fn in fns.values():
        fn()
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def _verl():
    try:
        from verl.trainer.ppo import core_algos, rollout_corr_helper
        from verl.workers.config import ActorConfig
    except Exception as exc:  # noqa: BLE001
        print(f"  verl not importable ({type(exc).__name__}: {exc}); skipping the comparison")
        return None
    return core_algos, rollout_corr_helper, ActorConfig


def run(quick: bool = False) -> dict:
    torch.set_num_threads(2)
    out: dict = {"load_average_1min_at_start": round(os.getloadavg()[0], 2)}
    # The server's malloc settings (app/malloc.py), as in bench/estimators.py: without them glibc
    # hands each freed 32 MB output back and the next call faults it in again.
    out["malloc_tuned"] = tune_malloc()
    B, T = (64, 2048) if quick else (512, 8192)
    adv, lp, old, rollout, mask = batch(B, T)
    mf = mask.to(torch.float64)
    out["kernel_built"] = native.loss_kernel() is not None
    kw = dict(rollout_log_prob=rollout, rollout_is="token", rollout_is_threshold=2.0)
    dst = [torch.empty_like(adv) for _ in range(5)]
    srcs = (adv, lp, old, rollout, mf)

    def floor():
        for d, s in zip(dst, srcs, strict=True):
            torch.neg(s, out=d)

    def torch_path():
        with native.disabled():
            return loss_weights(adv, lp, old, mask, **kw)

    fns = {
        "floor": floor,
        "ours": lambda: loss_weights(adv, lp, old, mask, **kw),
        "ours_with_states": lambda: loss_weights_and_states(adv, lp, old, mask, **kw),
        "torch_path": torch_path,
    }
    t = _interleaved(fns, rounds=3 if quick else 9)
    key = f"loss_weights.B{B}_T{T}.vanilla_token_mean_tis"
    out[f"{key}.ours_s"] = round(t["ours"][0], 4)
    out[f"{key}.ours_best_s"] = round(t["ours"][1], 4)
    out[f"{key}.five_pass_floor_s"] = round(t["floor"][0], 4)
    out[f"{key}.ours_over_floor"] = round(t["ours"][0] / t["floor"][0], 2)
    out[f"{key}.with_states_over_floor"] = round(t["ours_with_states"][0] / t["floor"][0], 2)
    out[f"{key}.torch_path_s"] = round(t["torch_path"][0], 4)
    out[f"{key}.torch_path_over_floor"] = round(t["torch_path"][0] / t["floor"][0], 2)

    verl = _verl()
    if verl is not None:
        core, rch, ActorConfig = verl
        config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
        config.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None)
        rw, _ = rch.compute_rollout_correction_weights(
            old - rollout, mask, rollout_is="token", rollout_is_threshold=2.0
        )

        def verl_loss():
            x = lp.clone().requires_grad_(True)
            value, _ = core.compute_policy_loss_vanilla(old, x, adv, mask, "token-mean", config, rw)
            value.backward()
            return x.grad

        tv = _interleaved({"verl": verl_loss, "ours": fns["ours"]}, rounds=3)
        out[f"{key}.verl_loss_backward_s"] = round(tv["verl"][0], 4)
        out[f"{key}.speedup_vs_verl"] = round(tv["verl"][0] / tv["ours"][0], 1)
        err = (verl_loss().neg() - loss_weights(adv, lp, old, mask, **kw)).abs().max().item()
        out[f"{key}.max_abs_diff_vs_verl"] = float(f"{err:.2e}")

    # The other losses and aggregations (torch path, except gpg/cispo), one round each.
    others = {
        "gspo": dict(loss="gspo"),
        "cispo": dict(loss="cispo"),
        "geo_mean": dict(loss="geo_mean"),
        "sapo": dict(loss="sapo"),
        "vanilla_seq_mean_token_mean": dict(agg="seq-mean-token-mean"),
        "vanilla_sequence_icepop": dict(rollout_is="sequence", rollout_is_threshold="0.5_2.0"),
    }
    for name, extra in others.items():
        args = {**kw, **extra}
        to = _interleaved(
            {"x": lambda a=args: loss_weights(adv, lp, old, mask, **a)}, rounds=1 if quick else 3
        )
        out[f"loss_weights.B{B}_T{T}.{name}_s"] = round(to["x"][0], 4)
    out["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<60} {v}")
