"""A short run of the load benchmark (bench/load.py) as a test: 8 uploaders and 24 readers, every
phase (sequential, paced, saturated; on one worker, then two) for 3 s against real server processes
with the write token on. No upload may be lost, no request may fail, and the server must never
report "database is locked" or a traceback.

32 clients is more than the 15 connections of SQLAlchemy's default pool: with a sync session
dependency that combination deadlocked (every worker thread waiting for a connection only a
dependency cleanup, itself waiting for a thread, would return); see app/storage/db.py get_session."""

from __future__ import annotations

import importlib.util
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.adversarial.adv_helpers import ROOT

pytestmark = pytest.mark.slow


def _load_bench():
    spec = importlib.util.spec_from_file_location("bench_load", ROOT / "bench" / "load.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_load"] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def test_short_load_loses_nothing():
    # The benchmark calls asyncio.run(), which refuses to start inside a running event loop; the
    # browser tests' Playwright session (sync API) keeps one running on this process's main thread
    # when it ran before this test in the same pytest process. A thread of its own has no loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        figures = pool.submit(_load_bench().run, duration=3, uploaders=8, readers=24).result()
    print(figures)
    assert figures["uploads_acknowledged"] >= 20, figures
    for workers in ("one_worker", "two_workers"):
        for phase in ("sequential", "loaded", "saturated"):
            name = f"{workers}_{phase}"
            assert figures[f"{name}_requests_per_s"] > 1, figures
            assert figures[f"{name}_upload_p50_s"] is not None and figures[f"{name}_read_p50_s"] is not None
    assert figures["errors"] == 0, figures["first_errors"]
    assert figures["database_is_locked"] == 0
    assert figures["server_tracebacks"] == 0
    assert figures["lost_uploads"] == 0
