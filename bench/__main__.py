"""`make bench`: run every benchmark module in one process, print the figures, write bench/results.json.

A benchmark module is any ``bench/<name>.py`` with ``run() -> dict`` (figures, in seconds or ratios).
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import platform
import sys
import time
from pathlib import Path

import bench

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    only = set(argv)
    results: dict = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "python": platform.python_version(),
        },
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "benchmarks": {},
    }
    for mod in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        if mod.name.startswith("_") or (only and mod.name not in only):
            continue
        module = importlib.import_module(f"bench.{mod.name}")
        if not hasattr(module, "run"):
            continue
        print(f"== {mod.name}", flush=True)
        figures = module.run()
        for key, value in figures.items():
            print(f"  {key:<55} {value}", flush=True)
        results["benchmarks"][mod.name] = figures
    out = HERE / "results.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
