"""Simulator figures: sampling and critic speed, and the batch statistics the demo shows."""

from __future__ import annotations

import time


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
    eps = sample_batch(20, 8, seed=DEMO_SEED)
    dt = time.perf_counter() - t
    n_tok = sum(len(e.tokens) for e in eps)
    out["sample_20x8_s"] = round(dt, 3)
    out["sample_tokens_per_s"] = round(n_tok / dt)
    out["mean_tokens_per_episode"] = round(n_tok / len(eps), 1)

    d = sim_diagnostics(eps)
    out["demo_pass_rate"] = round(d["pass_rate"], 3)
    out["demo_zero_variance_share"] = round(d["zero_variance_share"], 3)
    out["demo_useless_credit_share"] = round(d["useless_credit_share"], 3)
    out["demo_mean_calls"] = round(d["mean_calls"], 2)

    t = time.perf_counter()
    mc = with_mc_turn_values(eps, PolicyParams(), 16, seed=DEMO_SEED)
    out["mc_turn_values_16_rollouts_s"] = round(time.perf_counter() - t, 3)
    errs = [
        abs(a - b)
        for e in mc
        for a, b in zip(e.meta["turn_values"], e.meta["turn_values_exact"], strict=True)
    ]
    out["mc16_mean_abs_error_vs_exact"] = round(sum(errs) / len(errs), 4)

    fresh = sample_batch(20, 8, seed=DEMO_SEED + 1_000_003)
    t = time.perf_counter()
    model, losses = fit_critic(eps, seed=DEMO_SEED)
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
