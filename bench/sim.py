"""Simulator figures: sampling and critic speed, and the batch statistics the demo shows."""

from __future__ import annotations

import time

# Sizes: tasks x attempts sampled, Monte Carlo rollouts, critic fit steps.
TASKS_N, PER_TASK, ROLLOUTS, CRITIC_STEPS = 20, 8, 16, 80
QUICK = {"TASKS_N": 3, "PER_TASK": 4, "ROLLOUTS": 2, "CRITIC_STEPS": 2}


def run() -> dict:
    from app.sim import truth
    from app.sim.critic import critic_report, fit_critic
    from app.sim.diagnostics import sim_diagnostics
    from app.sim.env import sample_batch, with_mc_turn_values
    from app.sim.make_fixtures import DEMO_SEED
    from app.sim.policy import PolicyParams
    from app.sim.tasks import TASKS

    out: dict = {}
    truth._CACHE.clear()
    t = time.perf_counter()
    for task in TASKS:
        truth.exact_values(task, PolicyParams(), 0.0)
    out["exact_values_20_tasks_s"] = round(time.perf_counter() - t, 4)

    t = time.perf_counter()
    eps = sample_batch(TASKS_N, PER_TASK, seed=DEMO_SEED)
    dt = time.perf_counter() - t
    n_tok = sum(len(e.tokens) for e in eps)
    out["sample_20x8_s"] = round(dt, 3)
    out["sample_tokens_per_s"] = round(n_tok / dt)
    out["mean_tokens_per_episode"] = round(n_tok / len(eps), 1)

    d = sim_diagnostics(eps)
    for key in ("pass_rate", "zero_variance_share", "useless_credit_share", "mean_calls"):
        out[f"demo_{key}"] = None if d[key] is None else round(d[key], 3)  # None: nothing to share

    t = time.perf_counter()
    mc = with_mc_turn_values(eps, PolicyParams(), ROLLOUTS, seed=DEMO_SEED)
    out["mc_turn_values_16_rollouts_s"] = round(time.perf_counter() - t, 3)
    errs = [
        abs(a - b)
        for e in mc
        for a, b in zip(e.meta["turn_values"], e.meta["turn_values_exact"], strict=True)
    ]
    out["mc16_mean_abs_error_vs_exact"] = round(sum(errs) / len(errs), 4)

    fresh = sample_batch(TASKS_N, PER_TASK, seed=DEMO_SEED + 1_000_003)
    t = time.perf_counter()
    model, losses = fit_critic(eps, steps=CRITIC_STEPS, seed=DEMO_SEED)
    out["critic_fit_80_steps_s"] = round(time.perf_counter() - t, 2)
    rep = critic_report(model, eps, fresh, losses)
    out["critic_ev_train"] = rep["explained_variance_train"]
    out["critic_ev_fresh"] = rep["explained_variance_fresh"]
    out["turn_start_ev_fresh_critic"] = rep["turn_start_explained_variance_fresh"]["critic"]
    out["turn_start_ev_fresh_true_values"] = rep["turn_start_explained_variance_fresh"]["true_values"]
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<40} {v}")
