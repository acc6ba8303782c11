"""`make bench`: run every benchmark module in one process, print the figures, write bench/results.json.

A benchmark module is any ``bench/<name>.py`` with ``run() -> dict`` (figures, in seconds or ratios).
Its sizes are module constants; ``QUICK`` (a dict) maps them to the small values of
``python -m bench --quick``, which runs every module at those sizes (the suite runs it:
tests/house/test_bench_quick.py, so a benchmark cannot break unseen) and writes no results file.
``python -m bench NAME ...`` runs only those modules.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import pkgutil
import platform
import sys
import tempfile
import time
from pathlib import Path

import bench

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    quick = "--quick" in argv
    only = {a for a in argv if not a.startswith("--")}
    results: dict = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "quick": quick,
        "benchmarks": {},
    }
    with _shared_server(quick):
        _run_modules(only, quick, results)
    if quick:
        return 0
    out = HERE / "results.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


@contextlib.contextmanager
def _shared_server(quick: bool):
    """Quick mode: one real server for every module that needs no special settings (bench/_server.py)."""
    if not quick:
        yield
        return
    from bench import _server

    with tempfile.TemporaryDirectory(prefix="creditlens-bench-quick-") as tmp:
        with _server.Server(Path(tmp) / "shared.db", Path(tmp) / "shared.log") as srv:
            _server.SHARED = srv
            try:
                yield
            finally:
                _server.SHARED = None


def _run_modules(only: set[str], quick: bool, results: dict) -> None:
    for mod in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if mod.name.startswith("_") or (only and mod.name not in only):
            continue
        module = importlib.import_module(f"bench.{mod.name}")
        if not hasattr(module, "run"):
            continue
        if quick:
            for name, value in getattr(module, "QUICK", {}).items():
                assert hasattr(module, name), (
                    f"bench/{mod.name}.py QUICK names {name}, which it does not define"
                )
                setattr(module, name, value)
        print(f"== {mod.name}", flush=True)
        t0 = time.perf_counter()
        figures = module.run()
        if quick:
            figures["(quick mode: small sizes) seconds"] = round(time.perf_counter() - t0, 2)
        for key, value in figures.items():
            print(f"  {key:<55} {value}", flush=True)
        results["benchmarks"][mod.name] = figures


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
