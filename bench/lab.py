"""The lambda lab's speed: the default lambda sweep (20,000 episodes x 8 lambdas x 3 critics) must
answer in under 3 s. Timed both as a bare computation and through the real app (cache miss, then hit)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path


def _best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


# Query parameters of each timed figure ({}: its defaults, the sizes the docstring names).
LAMBDA: dict = {}
RECOVERY: dict = {"verl": "off"}
RECOVERY_SEEDS: dict = {"verl": "off", "seeds": "10"}
HORIZON: dict = {}
VARIABLE: dict = {}
QUICK = {
    "VARIABLE": {"batch": "20", "seeds": "1"},
    "LAMBDA": {"episodes": "200"},
    "RECOVERY": {"verl": "off", "batch": "50"},
    "RECOVERY_SEEDS": {"verl": "off", "batch": "50", "seeds": "2"},
    "HORIZON": {"batch": "20", "seeds": "1"},
}


def run() -> dict:
    from fastapi.testclient import TestClient

    from app.core.settings import Settings
    from app.lab.compute import (
        PARAMS,
        delayed_horizon,
        difficulty,
        lambda_sweep,
        one_thread,
        recovery,
        variable_horizon,
    )
    from app.lab.params import parse
    from app.main import create_app

    p = parse(PARAMS["lambda"], LAMBDA)
    out: dict = {}
    with one_thread():
        lambda_sweep(p)  # warm-up (first GAE call, allocator)
        out["lambda sweep, default (20k eps x 8 lams x 3 critics), s"] = round(
            _best(lambda: lambda_sweep(p)), 3
        )
        rp = parse(PARAMS["recovery"], RECOVERY)
        out["recovery, batch 2000, ours only, s"] = round(_best(lambda: recovery(rp)), 3)
        rp10 = parse(PARAMS["recovery"], RECOVERY_SEEDS)
        out["recovery, 10 seeds x 2000, ours only, s"] = round(_best(lambda: recovery(rp10), 1), 3)
        hp = parse(PARAMS["delayed_horizon"], HORIZON)
        out["delayed-horizon page, defaults (5 seeds x 500, H 2..16), s"] = round(
            _best(lambda: delayed_horizon(hp), 1), 3
        )
        vp = parse(PARAMS["variable_horizon"], VARIABLE)
        out["variable-horizon page, defaults (5 seeds x 500, 5 p), s"] = round(
            _best(lambda: variable_horizon(vp), 1), 3
        )
        dp = parse(PARAMS["difficulty"], {})
        out["difficulty, G=8, 199 pass rates, s"] = round(_best(lambda: difficulty(dp)), 4)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'bench.db'}")
        with TestClient(create_app(settings)) as client:
            t = time.perf_counter()
            r = client.get("/api/lab/lambda", params=LAMBDA)
            out["GET /api/lab/lambda (cache miss), s"] = round(time.perf_counter() - t, 3)
            assert r.headers["x-lab-cache"] == "miss", r.text
            t = time.perf_counter()
            r = client.get("/api/lab/lambda", params=LAMBDA)
            out["GET /api/lab/lambda (cache hit), s"] = round(time.perf_counter() - t, 4)
            assert r.headers["x-lab-cache"] == "hit"
    return out


if __name__ == "__main__":
    for k, v in run().items():
        print(f"{k:<55} {v}")
