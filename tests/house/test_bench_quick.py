"""`python -m bench --quick` runs every benchmark module at small sizes, as a subprocess, so a
benchmark cannot break unseen (bench/bigbatch.py once crashed `make bench` on a 422 and every
benchmark after it went unrun). Goal: under 60 s on an idle 2-core machine; the timeout leaves
room for a shared one."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300


@pytest.mark.timeout(TIMEOUT_S + 30)
def test_every_benchmark_runs_in_quick_mode():
    import bench

    modules = [m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "client")])}
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, "-m", "bench", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    took = time.perf_counter() - t0
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    ran = [line[3:].strip() for line in res.stdout.splitlines() if line.startswith("== ")]
    assert ran == sorted(modules), (ran, modules)  # every module, none skipped by a crash
    assert res.stdout.count("(quick mode: small sizes) seconds") == len(modules)
    assert "wrote" not in res.stdout  # quick mode leaves bench/results.json alone
    print(f"python -m bench --quick: {took:.1f} s")
