"""Benchmarks of the estimator engine against verl 0.9.1 and against the memory floor.

* Masked token-level GAE at B=256, T=8192, float32, with tool spans in the mask: our ``gae`` (the
  compiled one-pass kernel when it is built), the vectorised torch path it falls back to, verl's
  ``compute_gae_advantage_return`` on the same input, and the time to merely copy the inputs
  (rewards, values, mask into buffers allocated once: the memory floor; cloning them, which also
  allocates, is printed too).
* Turn-level GAE at the same size.
* GRPO / RLOO at B=4096 in groups of 8 (T=4096 for verl's token broadcast) against verl's
  ``grpo_vectorized`` / ``rloo_vectorized``.

GAE is timed twice: with glibc's default malloc settings, then with the server's
(``app.malloc.tune_malloc``); the headline figures are the second, both are printed.

Times are medians of several runs after a warm-up, timed round-robin (floor, ours, verl) so that
the load of a shared machine hits all alike, with ``torch.set_num_threads(2)``; the load average
is printed with the figures. ``*_best_s`` is the fastest run.
"""

from __future__ import annotations

import os
import statistics
import time

import torch

from app.malloc import tune_malloc
from estimators import EstimatorInput, compute, gae, grpo, native, rloo, turn_gae


def agent_batch(B: int, T: int, seed: int = 0):
    """rewards, values (float32) and an int64 mask: a prompt, calls of 20-200 policy tokens
    separated by tool outputs of 10-400 tokens, right padding."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        t = int(torch.randint(50, 300, (1,), generator=g))
        end = T - int(torch.randint(0, T // 4, (1,), generator=g))
        while t < end:
            call = int(torch.randint(20, 200, (1,), generator=g))
            mask[b, t : min(t + call, end)] = 1
            t += call + int(torch.randint(10, 400, (1,), generator=g))
    rewards = torch.zeros(B, T)
    rewards[:, -1] = 0.0
    rewards += torch.randn(B, T, generator=g) * 0.01 * mask
    values = torch.randn(B, T, generator=g)
    return rewards, values, mask


def _verl():
    try:
        from verl.trainer.ppo import core_algos
    except Exception as exc:  # noqa: BLE001
        print(f"  verl not importable ({type(exc).__name__}: {exc}); skipping the comparison")
        return None
    return core_algos


# Sizes: token-level GAE [B, T]; the outcome estimators [BG, TG]; timed rounds.
B, T, BG, TG, ROUNDS = 256, 8192, 4096, 4096, 9
COMPARE_VERL = True  # time verl's functions beside ours (importing verl takes seconds)
QUICK = {"B": 8, "T": 512, "BG": 64, "TG": 256, "ROUNDS": 1, "COMPARE_VERL": False}


def _interleaved(fns: dict, rounds: int) -> dict:
    """Median and best seconds of each fn, timed round-robin so load changes hit all alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v), v) for k, v in times.items()}


def run() -> dict:
    torch.set_num_threads(2)
    out: dict = {"load_average_1min_at_start": round(os.getloadavg()[0], 2)}
    rewards, values, mask = agent_batch(B, T)
    out["gae.policy_token_share"] = round(mask.float().mean().item(), 3)
    verl = _verl() if COMPARE_VERL else None

    def torch_path():
        with native.disabled():
            return gae(rewards, values, mask, 0.99, 0.95)

    out["gae.native_kernel"] = native.enabled()
    # The memory floor: copy the inputs into buffers allocated once, so that neither malloc nor
    # first-touch page faults (which come and go with the heap's state) are counted in it.
    dst = (torch.empty_like(rewards), torch.empty_like(values), torch.empty_like(mask))

    def floor():
        for d, s in zip(dst, (rewards, values, mask), strict=True):
            d.copy_(s)

    fns = {
        "floor": floor,
        "floor_clone": lambda: (rewards.clone(), values.clone(), mask.clone()),
        "ours": lambda: gae(rewards, values, mask, 0.99, 0.95),
        "torch_path": torch_path,
        "turn": lambda: turn_gae(rewards, values, mask, 0.99, 0.95),
    }
    # First with glibc's default malloc settings, then with the server's (app/malloc.py), which
    # stop freed output buffers from being handed back to the kernel and faulted in again.
    t0 = _interleaved(fns, rounds=ROUNDS)
    for k in ("ours", "torch_path", "turn", "floor_clone"):
        out[f"gae.B256_T8192.default_malloc.{k}_s"] = round(t0[k][0], 4)
    out["gae.B256_T8192.default_malloc.ours_over_floor"] = round(t0["ours"][0] / t0["floor"][0], 2)
    out["malloc_tuned"] = tune_malloc()
    t = _interleaved(fns, rounds=ROUNDS)
    # verl's loop takes seconds: time it in fewer rounds, interleaved with ours.
    if verl is not None:
        tv = _interleaved(
            {
                "verl": lambda: verl.compute_gae_advantage_return(rewards, values, mask, 0.99, 0.95),
                "ours": fns["ours"],
                "floor": fns["floor"],
            },
            rounds=max(1, ROUNDS // 3),
        )
    floor, ours = t["floor"][0], t["ours"][0]
    out["gae.B256_T8192.ours_s"] = round(ours, 4)
    out["gae.B256_T8192.ours_best_s"] = round(t["ours"][1], 4)
    out["gae.B256_T8192.copy_floor_s"] = round(floor, 4)
    out["gae.B256_T8192.copy_floor_best_s"] = round(t["floor"][1], 4)
    out["gae.B256_T8192.clone_inputs_s"] = round(t["floor_clone"][0], 4)
    out["gae.B256_T8192.ours_over_floor"] = round(ours / floor, 2)
    out["gae.B256_T8192.torch_path_s"] = round(t["torch_path"][0], 4)
    out["gae.B256_T8192.torch_path_over_floor"] = round(t["torch_path"][0] / floor, 2)
    if verl is not None:
        out["gae.B256_T8192.verl_s"] = round(tv["verl"][0], 4)
        out["gae.B256_T8192.verl_best_s"] = round(tv["verl"][1], 4)
        # Ratio of medians, our runs pooled over both sets of rounds.
        pooled = statistics.median(t["ours"][2] + tv["ours"][2])
        out["gae.B256_T8192.speedup_vs_verl"] = round(tv["verl"][0] / pooled, 1)
        out["gae.B256_T8192.speedup_vs_verl_best"] = round(
            tv["verl"][1] / min(t["ours"][1], tv["ours"][1]), 1
        )
        # Same numbers (before verl's whitening), as a sanity check of what was timed.
        _, ret = verl.compute_gae_advantage_return(rewards, values, mask, 0.99, 0.95)
        a, _ = gae(rewards, values, mask, 0.99, 0.95)
        m = mask.bool()
        err = ((ret - values)[m] - a[m]).abs().max().item() / (ret - values)[m].abs().max().item()
        out["gae.B256_T8192.max_rel_diff_vs_verl_raw"] = float(f"{err:.2e}")
    # The same with one thread: on an oversubscribed machine (load average above the core count),
    # every parallel op waits for its second thread to be scheduled; this shows how much of the
    # 2-thread time is that wait rather than work.
    torch.set_num_threads(1)
    t1 = _interleaved({"floor": fns["floor"], "ours": fns["ours"]}, rounds=ROUNDS)
    torch.set_num_threads(2)
    out["gae.B256_T8192.one_thread.ours_s"] = round(t1["ours"][0], 4)
    out["gae.B256_T8192.one_thread.copy_floor_s"] = round(t1["floor"][0], 4)
    out["gae.B256_T8192.one_thread.ours_over_floor"] = round(t1["ours"][0] / t1["floor"][0], 2)
    if verl is not None:
        out["gae.B256_T8192.one_thread.speedup_vs_verl_2threads"] = round(tv["verl"][0] / t1["ours"][0], 1)
    out["turn_gae.B256_T8192.ours_s"] = round(t["turn"][0], 4)
    out["turn_gae.B256_T8192.ours_over_floor"] = round(t["turn"][0] / floor, 2)

    # Outcome estimators: B = 4096 in groups of 8.
    Bg, Tg = BG, TG
    g = torch.Generator().manual_seed(1)
    scores = (torch.rand(Bg, generator=g) < 0.3).float()
    labels = torch.arange(Bg) // 8
    ts = _interleaved(
        {"grpo": lambda: grpo(scores, labels), "rloo": lambda: rloo(scores, labels)}, rounds=ROUNDS
    )
    out["grpo.B4096.scores_only_ours_s"] = round(ts["grpo"][0], 5)
    out["rloo.B4096.scores_only_ours_s"] = round(ts["rloo"][0], 5)
    rmask = torch.zeros(Bg, Tg, dtype=torch.int64)
    lengths = torch.randint(100, Tg, (Bg,), generator=g)
    rmask[torch.arange(Tg)[None, :] < lengths[:, None]] = 1
    r_tok = torch.zeros(Bg, Tg)
    r_tok[torch.arange(Bg), lengths - 1] = scores
    inp = EstimatorInput(rewards=r_tok, mask=rmask, groups=labels)
    idx = labels.numpy()
    fns = {"grpo": lambda: compute("grpo", inp), "rloo": lambda: compute("rloo", inp)}
    if verl is not None:
        fns["verl_grpo"] = lambda: verl.compute_grpo_vectorized_outcome_advantage(r_tok, rmask, idx)
        fns["verl_rloo"] = lambda: verl.compute_rloo_vectorized_outcome_advantage(r_tok, rmask, idx)
    t = _interleaved(fns, rounds=max(1, ROUNDS // 2))
    for name in ("grpo", "rloo"):
        out[f"{name}.B4096_T4096.ours_s"] = round(t[name][0], 4)
        if verl is not None:
            out[f"{name}.B4096_T4096.verl_vectorized_s"] = round(t[f"verl_{name}"][0], 4)
            out[f"{name}.B4096_T4096.speedup_vs_verl"] = round(t[f"verl_{name}"][0] / t[name][0], 2)
    out["load_average_1min_at_end"] = round(os.getloadavg()[0], 2)
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<50} {v}")
