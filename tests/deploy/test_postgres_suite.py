"""The storage and API tests (tests/app) run again on PostgreSQL: same code, another URL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
@pytest.mark.slow
def test_service_suite_passes_on_postgres(pg_url):
    env = dict(os.environ, CREDITLENS_TEST_BACKEND="postgres", CREDITLENS_TEST_PG_URL=pg_url)
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/app", "-q", "-p", "no:cacheprovider", "-x"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    tail = res.stdout[-4000:] + res.stderr[-2000:]
    assert res.returncode == 0, tail
    assert " passed" in res.stdout and " failed" not in res.stdout, tail
