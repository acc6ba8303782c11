"""Fresh, migrated databases for tests without migrating each one: SQLite and PostgreSQL.

Migrating an empty database (Alembic, every revision) costs far more than a test's own work on it:
~0.2 s on SQLite and ~1.6 s on PostgreSQL here, against ~0.02 s and ~0.1 s to find a database
already at head (which the app still does at every start). So the schema is made once per session:

- SQLite: one file migrated per session (``SqliteTemplate``); each test gets a byte copy of it.
- PostgreSQL (``PgDatabases``, the database named by CREDITLENS_TEST_PG_URL): migrated once; each
  test starts from it emptied (every table's rows deleted, sequences restarted: ids start at 1 as on
  a new database). A fixture that outlives one test (module scope) gets its own database instead,
  ``CREATE DATABASE ... TEMPLATE`` a migrated one, dropped after it, so the tests run while it is
  alive cannot empty it.

The schema is the app's own (``app.storage.migrate.upgrade``, the same code the app runs at start);
nothing is created by hand. A database a test left off head (a downgrade, say) is migrated again.
"""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

from sqlalchemy import MetaData, create_engine, text
from sqlalchemy.engine import Engine, make_url

from app.storage.db import make_engine
from app.storage.migrate import alembic_config, upgrade


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


class SqliteTemplate:
    """One SQLite file at head, copied for each test (``url``)."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / "template.db"
        engine = make_engine(f"sqlite:///{self.path}")
        upgrade(engine)
        engine.dispose()  # the last connection closes: WAL checkpointed into the file, -wal removed
        assert not Path(f"{self.path}-wal").exists()

    def url(self, folder: Path, name: str = "test.db") -> str:
        """A fresh database at head: a copy of the template at ``folder/name``."""
        target = Path(folder) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(self.path, target)
        return f"sqlite:///{target}"


class PgDatabases:
    """The PostgreSQL database at ``url`` kept at head and emptied for each test (``fresh``), and
    separate copies of a migrated template for fixtures that outlive a test (``copy``/``drop``).
    The role needs CREATEDB for the copies (.ci/run creates it so)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.head = head_revision()
        self._engine: Engine | None = None
        self._tables: list[str] | None = None  # delete order: children before parents
        self._template: str | None = None
        self._copies = itertools.count()
        self.migrate()

    def _named(self, database: str) -> str:
        """The URL of another database on the same server, as the same role."""
        return make_url(self.url).set(database=database).render_as_string(hide_password=False)

    def _admin(self) -> Engine:
        """An engine on the server's ``postgres`` database, for CREATE/DROP DATABASE."""
        return create_engine(self._named("postgres"), isolation_level="AUTOCOMMIT")

    def migrate(self) -> None:
        """The schema wiped and made again at head (the session's first use, or after a test left it
        elsewhere)."""
        engine = create_engine(self.url)
        with engine.begin() as conn:
            conn.execute(text("DROP SCHEMA public CASCADE"))
            conn.execute(text("CREATE SCHEMA public"))
        engine.dispose()
        engine = make_engine(self.url)
        upgrade(engine)
        engine.dispose()
        self._tables = None

    def _version(self, engine: Engine) -> str | None:
        with engine.connect() as conn:
            has = conn.execute(text("SELECT to_regclass('public.alembic_version') IS NOT NULL")).scalar_one()
            return conn.execute(text("SELECT version_num FROM alembic_version")).scalar() if has else None

    def fresh(self) -> str:
        """The database emptied, at head: its URL."""
        if self._engine is None:
            self._engine = create_engine(self.url)
        engine = self._engine
        if self._version(engine) != self.head:
            engine.dispose()
            self.migrate()
        if self._tables is None:
            meta = MetaData()
            meta.reflect(engine)
            self._tables = [t.name for t in reversed(meta.sorted_tables) if t.name != "alembic_version"]
        with engine.begin() as conn:
            for name in self._tables:
                conn.execute(text(f'DELETE FROM "{name}"'))
            sequences = conn.execute(
                text("SELECT sequencename FROM pg_sequences WHERE schemaname = 'public'")
            )
            for (seq,) in sequences.all():
                conn.execute(text(f'ALTER SEQUENCE "{seq}" RESTART'))
        engine.dispose()  # no connection of ours stays open while the test runs
        return self.url

    def copy(self) -> str:
        """A new database of its own at head (``CREATE DATABASE ... TEMPLATE``): its URL."""
        base = make_url(self.url).database
        admin = self._admin()
        try:
            with admin.connect() as conn:
                if self._template is None:
                    self._template = f"{base}_template"
                    conn.execute(text(f'DROP DATABASE IF EXISTS "{self._template}" WITH (FORCE)'))
                    conn.execute(text(f'CREATE DATABASE "{self._template}"'))
                    engine = make_engine(self._named(self._template))
                    upgrade(engine)
                    engine.dispose()
                name = f"{base}_copy{next(self._copies)}"
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
                conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self._template}"'))
        finally:
            admin.dispose()
        return self._named(name)

    def drop(self, url: str) -> None:
        """Drop a database made by ``copy`` (connections still open to it are ended)."""
        admin = self._admin()
        try:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)'))
        finally:
            admin.dispose()

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
        if self._template is not None:
            self.drop(self._named(self._template))
