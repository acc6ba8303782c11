"""The audit's speed: a 512 x 4,096-token batch with tool spans must be audited in under 5 s.

Three uploads are timed: a trainer whose advantages are verl-style whitened GAE (the search has to
go through the token family), the same computed and uploaded in float64 (precise enough that both
whitening factors are searched), and one whose GAE stepped through the tool spans (a bug
hypothesis has to win). The number of configurations searched is printed beside each time.
"""

from __future__ import annotations

import time

import torch

B, T = 512, 4096
QUICK = {"B": 16, "T": 1024}


def batch(seed: int = 0):
    """(EstimatorInput, kinds [B, T]) of multi-turn episodes: a prompt, policy turns and tool spans."""
    from estimators.audit import KIND_PAD, KIND_POLICY, KIND_PROMPT, KIND_TOOL
    from estimators.registry import EstimatorInput

    g = torch.Generator().manual_seed(seed)
    kinds = torch.full((B, T), KIND_PAD, dtype=torch.uint8)
    rewards = torch.zeros(B, T)
    for i in range(B):
        length = int(torch.randint(T // 2, T + 1, (1,), generator=g))
        t = int(torch.randint(64, 256, (1,), generator=g))
        kinds[i, :t] = KIND_PROMPT
        last = t
        while t < length:
            n = int(torch.randint(100, 600, (1,), generator=g))
            kinds[i, t : min(t + n, length)] = KIND_POLICY
            last = min(t + n, length) - 1
            t += n
            n = int(torch.randint(50, 300, (1,), generator=g))
            if t + n < length:
                kinds[i, t : t + n] = KIND_TOOL
            t += n
        rewards[i, last] = float(torch.randint(0, 2, (1,), generator=g))
    values = torch.randn(B, T, generator=g) * 0.3 + 0.4
    groups = torch.arange(B) // 8
    inp = EstimatorInput(rewards=rewards, mask=kinds == KIND_POLICY, values=values, groups=groups)
    return inp, kinds


def run() -> dict:
    from estimators import compute
    from estimators.audit import KIND_PAD, audit
    from estimators.registry import EstimatorInput

    inp, kinds = batch()
    out: dict = {}
    clean = compute("verl_gae", EstimatorInput(**{**inp.__dict__, "gamma": 0.99, "lam": 0.95})).advantages
    f64 = {**inp.__dict__, "rewards": inp.rewards.double(), "values": inp.values.double()}
    clean64 = compute("verl_gae", EstimatorInput(**{**f64, "gamma": 0.99, "lam": 0.95})).advantages
    resp = (kinds != KIND_PAD) & (torch.cumsum(inp.mask.int(), 1) > 0)
    bug = compute("verl_gae", EstimatorInput(**{**inp.__dict__, "mask": resp, "gamma": 1.0, "lam": 0.95}))
    bug_adv = bug.advantages * resp
    cases = (
        ("clean verl GAE", clean.float()),
        ("clean verl GAE, float64 upload", clean64),
        ("GAE through tool spans", bug_adv.float()),
    )
    for label, up in cases:
        audit(inp, up, kinds)  # warm-up (allocator, kernel threads)
        t, c = time.perf_counter(), time.process_time()
        res = audit(inp, up, kinds)
        dt, dc = time.perf_counter() - t, time.process_time() - c
        bm = res.best_match
        out[f"audit 512x4096, {label}, s"] = round(dt, 3)
        out[f"audit 512x4096, {label}, CPU s"] = round(dc, 3)
        out[f"audit 512x4096, {label}, configurations searched"] = res.searched
        out[f"audit 512x4096, {label}, best match"] = f"{bm['scheme']} {bm['params']}"
        out[f"audit 512x4096, {label}, findings"] = [f["code"] for f in res.findings]
    out.update(_service(inp, kinds, bug_adv))
    return out


def _service(inp, kinds, uploaded) -> dict:
    """The service's glue (app/compute/audit.py run_audit: padding per-episode arrays, the audit, each
    episode's reference back out) on the tool-span bug batch: what GET .../audit spends computing."""
    import numpy as np

    from app.compute.audit import run_audit
    from app.core.arrays import EpisodeArrays

    arrays = []
    for b in range(kinds.shape[0]):
        n = int((kinds[b] != 0).sum())
        k = (kinds[b, :n].numpy() - 1).astype(np.uint8)
        arrays.append(
            EpisodeArrays(
                tokens=[],
                kinds=k,
                rewards=inp.rewards[b, :n].double().numpy(),
                values=inp.values[b, :n].double().numpy(),
                logprobs=None,
                turn_ids=np.full(n, -1, dtype=np.int32),
                advantages=uploaded[b, :n].double().numpy(),
                group=str(int(inp.groups[b])),
            )
        )
    t = time.perf_counter()
    body, refs = run_audit(arrays)
    dt = time.perf_counter() - t
    return {
        "service audit 512x4096 (app/compute/audit.py glue), s": round(dt, 3),
        "service audit 512x4096, configurations searched": body["searched"],
        "service audit 512x4096, findings": [f["code"] for f in body["findings"]],
    }


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<55} {v}")
