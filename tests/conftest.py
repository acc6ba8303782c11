"""Fixtures shared by every suite.

``chromium``: one Playwright (sync API) session and one headless Debian Chromium for the whole run.
Playwright's sync API runs an event loop; a second ``sync_playwright()`` opened while another is
alive fails ("using Playwright Sync API inside the asyncio loop"), so every browser test takes
this one fixture instead of starting its own.

``sqlite_url``: a fresh SQLite file at head, copied from one migrated per session; ``postgres``: the
PostgreSQL database of CREDITLENS_TEST_PG_URL, migrated once, for fresh (emptied) databases and
copies (tests/databases.py says why and how).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.databases import PgDatabases, SqliteTemplate

# The client's spool (unsent run steps on disk) goes to a folder of this test session, never the
# user's cache; subprocesses inherit it. A test that needs its own passes Client(spool_dir=...).
os.environ["CREDITLENS_SPOOL_DIR"] = tempfile.mkdtemp(prefix="creditlens-test-spool-")


def _pg_database_per_worker() -> None:
    """Under pytest-xdist (``make test`` runs two processes) each worker gets a PostgreSQL database
    of its own, ``<name>_<worker>`` on the same server, so one worker emptying its database never
    touches the other's test. Every fixture reads CREDITLENS_TEST_PG_URL, so it is rewritten here,
    before any test module is imported."""
    url, worker = os.environ.get("CREDITLENS_TEST_PG_URL"), os.environ.get("PYTEST_XDIST_WORKER")
    if not url or not worker:
        return
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    base = make_url(url)
    name = f"{base.database}_{worker}"
    admin = create_engine(base.set(database="postgres"), isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).scalar()
            if not exists:
                # From template0: template1 may be in use by the other worker's CREATE DATABASE.
                conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE template0'))
    finally:
        admin.dispose()
    os.environ["CREDITLENS_TEST_PG_URL"] = base.set(database=name).render_as_string(hide_password=False)


_pg_database_per_worker()

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# pytest-timeout for tests marked `slow` (the default, 300 s, is in pyproject.toml): the Docker image
# build, the Dockerfile replay and the 100 MB crash test take minutes on a busy 2-core machine.
SLOW_TIMEOUT_S = 1200


# The files that take longest on CI's 2-core machine (its `--durations`, 2026-12-03), longest first.
# `make test` runs files on two processes (`--dist loadfile`), each taking the next file when it is
# done: the long ones first, so no process is left with a long file at the end while the other
# waits (the Docker image's file is third: its base images may still be in the making when the
# suite starts). Any other file with a ``slow`` test comes after them, then the rest in their order.
LONGEST_FIRST = (
    "tests/house/test_bench_quick.py",
    "tests/deploy/test_package_data.py",
    "tests/deploy/test_docker.py",
    "tests/deploy/test_jobs_workers.py",
    "tests/adversarial/test_adv_load.py",
    "tests/adversarial/test_adv_crash.py",
    "tests/deploy/test_client_wheel.py",
    "tests/deploy/test_workers.py",
    "tests/client/test_spool.py",
    "tests/client/test_watch.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give every ``slow`` test the longer timeout unless it sets its own; run the longest files
    first (:data:`LONGEST_FIRST`)."""
    slow_files = set()
    for item in items:
        if item.get_closest_marker("slow"):
            slow_files.add(item.path)
            if not item.get_closest_marker("timeout"):
                item.add_marker(pytest.mark.timeout(SLOW_TIMEOUT_S))
    root = Path(__file__).resolve().parent.parent
    rank = {root / name: k for k, name in enumerate(LONGEST_FIRST)}

    def order(item: pytest.Item) -> tuple[int, int]:
        if item.path in rank:
            return 0, rank[item.path]
        return (1, 0) if item.path in slow_files else (2, 0)

    items.sort(key=order)  # stable: each file's tests keep their order


@pytest.fixture(scope="session")
def chromium():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory) -> SqliteTemplate:
    return SqliteTemplate(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture
def sqlite_url(sqlite_template, tmp_path) -> str:
    """A fresh SQLite database at head (a file in the test's tmp_path): its URL."""
    return sqlite_template.url(tmp_path)


@pytest.fixture(scope="session")
def postgres():
    """The PostgreSQL test database (CREDITLENS_TEST_PG_URL), at head; skips when it is not set."""
    url = os.environ.get("CREDITLENS_TEST_PG_URL")
    if not url:
        pytest.skip("CREDITLENS_TEST_PG_URL is not set (.ci/run sets it after starting PostgreSQL)")
    pg = PgDatabases(url)
    yield pg
    pg.close()
