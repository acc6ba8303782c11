"""`make bench` discovers every bench/<name>.py with run(): each must import cleanly (a bench that
breaks should fail here, not silently on the day someone wants the numbers)."""

from __future__ import annotations

import importlib
import pkgutil

import bench


def test_every_bench_module_imports_and_has_run():
    names = [m.name for m in pkgutil.iter_modules(bench.__path__) if not m.name.startswith("_")]
    assert {"estimators", "ingest", "lab", "load"} <= set(names)
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        assert callable(getattr(module, "run", None)), name
