"""The real app through FastAPI's TestClient (lifespan included), on both databases.

``db_url`` is parametrised: every test that takes it (or ``client``, ``new_db``, ``module_db_url``)
runs once on a fresh SQLite file and once on PostgreSQL (marked ``postgres``; skipped unless
CREDITLENS_TEST_PG_URL is set: .ci/run sets it). Fresh databases come at head without a migration
each (tests/databases.py).
"""

from __future__ import annotations

import itertools

import pytest

from tests.app.svc_helpers import make_client

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(params=BACKENDS)
def new_db(request, tmp_path):
    """``new_db()``: the URL of a fresh database at head, on this test's backend. Each call on SQLite
    is a new file; on PostgreSQL it empties the one test database again (close the previous client
    first)."""
    if request.param == "postgres":
        pg = request.getfixturevalue("postgres")
        return pg.fresh
    template = request.getfixturevalue("sqlite_template")
    names = (f"test{i}.db" for i in itertools.count())
    return lambda: template.url(tmp_path, next(names))


@pytest.fixture
def db_url(new_db) -> str:
    """A fresh database at head, SQLite or PostgreSQL: its URL."""
    return new_db()


@pytest.fixture(scope="module", params=BACKENDS)
def module_db_url(request, tmp_path_factory):
    """A fresh database that lives as long as the module's tests (a module-scoped server's): a
    SQLite file, or a PostgreSQL database of its own (dropped after), which the function-scoped
    ``db_url`` of the tests in between never empties."""
    if request.param == "postgres":
        pg = request.getfixturevalue("postgres")
        url = pg.copy()
        yield url
        pg.drop(url)
        return
    yield request.getfixturevalue("sqlite_template").url(tmp_path_factory.mktemp("db"))


@pytest.fixture
def client(db_url):
    with make_client(db_url) as c:
        yield c
