"""Engine and sessions. Nothing SQLite-only: the same code runs on PostgreSQL by changing the URL."""

from __future__ import annotations

import fcntl
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.engine.interfaces import DBAPIConnection
from sqlalchemy.pool import ConnectionPoolEntry
from sqlmodel import Session, create_engine


def display_url(url: str) -> str:
    """``url`` fit for a log line: the password, if any, replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy can parse: show only its scheme
        return url.split("://", 1)[0] + "://…"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for PostgreSQL and in-memory SQLite)."""
    if not url.startswith("sqlite"):
        return None
    path = url.split("///", 1)[-1]
    return Path(path) if path and path != ":memory:" else None


def unwritable_reason(url: str) -> str | None:
    """Why this process cannot write the SQLite database of ``url``, with what to do; None if it
    can (or the database is not a file). SQLite in WAL mode writes beside the file (-wal, -shm), so
    the folder must be writable too. Checked at start-up, where a bind-mounted folder owned by
    another user otherwise ends in a traceback from the first connection."""
    path = sqlite_path(url)
    if path is None:
        return None
    uid = os.getuid()
    existing = path.parent
    try:
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        problem = None
        if not os.access(existing, os.W_OK | os.X_OK):
            problem = f"cannot write the database folder {existing}"
        elif path.exists() and not os.access(path, os.R_OK | os.W_OK):
            problem = f"cannot read and write the database file {path}"
        if problem is None:
            return None
        st = (path if problem.endswith(str(path)) else existing).stat()
        owner = f"it belongs to uid {st.st_uid}, mode {st.st_mode & 0o777:o}; "
    except OSError as e:  # a folder on the way that this user may not even enter
        problem, owner = f"cannot reach the database folder {path.parent} ({e.strerror})", ""
    return (
        f"{problem} ({owner}this server runs as uid {uid}). Make it writable for uid {uid}: "
        f"`chown -R {uid} <the folder>` on the folder you mounted there (in Docker: the host folder "
        f"of `-v HOST_FOLDER:{existing}`), or use a named volume (`-v creditlens-data:{existing}`), "
        "or point CREDITLENS_DATABASE_URL elsewhere."
    )


# SQLite connections an engine keeps open between requests. A process runs requests' Python in
# ``Settings.worker_threads`` threads (default 4, at most 256; app/main.py sets anyio's limiter),
# plus its ingest and job threads; 40 covers them at the defaults and well beyond, and the pool
# opens more when needed (no cap, see make_engine).
SQLITE_POOL_SIZE = 40


class _Writer:
    """One writer at a time on a SQLite file: a thread lock within the process and an flock on
    ``<db>.writer`` between processes (``--workers 2``).

    Why: SQLite has one write lock, and a writer that finds it taken waits in SQLite's busy
    handler, which *sleeps* (1, 2, 5, ... up to 100 ms) and polls: under 20 concurrent uploaders
    the lock sat idle while its waiters slept, and uploads took seconds. Waiting here instead
    wakes the next writer the moment the previous one commits."""

    def __init__(self, path: str) -> None:
        self.lock = threading.Lock()
        self.path = None if path in ("", ":memory:") else f"{path}.writer"
        self.fd: int | None = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self.lock:
            if self.path is None:
                yield
                return
            if self.fd is None:
                self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(self.fd, fcntl.LOCK_EX)  # blocks without the GIL
            try:
                yield
            finally:
                fcntl.flock(self.fd, fcntl.LOCK_UN)


# The writer of each SQLite engine (none for PostgreSQL).
_WRITERS: weakref.WeakKeyDictionary[Engine, _Writer] = weakref.WeakKeyDictionary()


@contextmanager
def writing(session: Session) -> Iterator[None]:
    """Hold the database's write turn around a write transaction: from its first write to its
    commit. Do the work (parsing, computing) before, so the turn is short. A no-op on
    PostgreSQL, whose row locks let writers proceed side by side."""
    writer = _WRITERS.get(session.get_bind().engine)
    if writer is None:
        yield
        return
    with writer.hold():
        yield


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite files get WAL mode, a busy timeout and their folder created."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # No cap on connections (max_overflow=-1): a SQLite connection is a file handle, and a
        # capped pool (5 + 10) made requests queue for it behind the worker threads. Kept:
        # SQLITE_POOL_SIZE, so a busy server reuses its connections instead of opening (and
        # setting up) a new one per request.
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=SQLITE_POOL_SIZE,
            max_overflow=-1,
        )
        _WRITERS[engine] = _Writer(path)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(
            dbapi_conn: DBAPIConnection, _record: ConnectionPoolEntry
        ) -> None:  # pragma: no cover - exercised by every SQLite test
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    # Enough connections for the worker threads of one process; PostgreSQL queues the rest.
    return create_engine(url, pool_pre_ping=True, pool_size=20, max_overflow=20)


def import_models() -> None:
    """Import every module that defines tables, so SQLModel.metadata knows them all."""
    from app.storage import (  # noqa: F401
        audit_models,
        lab_models,  # noqa: F401
        logged_metrics_models,
        models,
        prompt_models,
    )


def init_db(engine: Engine) -> None:
    """Bring the schema to the newest migration (Alembic; see app/storage/migrate.py)."""
    from app.storage.migrate import upgrade

    upgrade(engine)


async def get_session(request: Request) -> AsyncIterator[Session]:
    """One session per request. Async on purpose: the cleanup (closing the session returns its
    connection to the pool) then runs on the event loop. As a sync generator its cleanup needed a
    worker thread, and under load every worker thread could be waiting for a pooled connection
    that only such a cleanup would return: a deadlock until the pool's 30 s timeout, then 500s
    (found by bench/load.py: 20 uploaders + 50 readers). Sync endpoints still use the session
    in their worker thread."""
    with Session(request.app.state.engine) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]
