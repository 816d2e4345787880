"""Run the Alembic migrations shipped inside this package (``results/migrations``), from any cwd.

SQLite alters a table by rebuilding it (batch mode: copy, DROP, rename). With foreign keys on, that DROP deletes
every row referring to the table (``ON DELETE CASCADE``): rebuilding ``runs`` would empty the database, rebuilding
``results`` its metrics (as 0004 did). So migrations run with SQLite's foreign keys off, the way SQLite documents
for altering tables, and each migration checks every reference still resolves before it commits (env.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.exc import DBAPIError

from edgefarm.results.db import redact
from edgefarm.results.models import Base
from edgellm.errors import BugError, InfrastructureError

SCRIPT_LOCATION = "edgefarm.results:migrations"


def alembic_config(engine: Engine | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", SCRIPT_LOCATION)
    if engine is not None:
        cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Migrate to ``revision``; returns the revision the database is at afterwards. One process migrates a database
    at a time (``migration_lock``): workers that start together on a brand-new database all find it at head."""
    cfg = alembic_config()
    with migration_lock(engine), engine.connect() as conn, sqlite_foreign_keys_off(conn):
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
        conn.commit()
    return current_revision(engine)


MIGRATION_LOCK_KEY = 0x6564676566726D  # "edgefrm": the PostgreSQL advisory lock that serializes migrations


@contextmanager
def migration_lock(engine: Engine) -> Iterator[None]:
    """Hold the database's migration lock: a PostgreSQL session advisory lock on a connection of its own; on
    SQLite an exclusive ``flock`` of ``<database>.migrate.lock`` beside the file (nothing for an in-memory one)."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as lock:
            lock.exec_driver_sql(f"SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})")
            lock.commit()
            try:
                yield
            finally:
                lock.exec_driver_sql(f"SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})")
                lock.commit()
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    import fcntl

    lock = f"{database}.migrate.lock"
    try:
        handle = open(lock, "a+b")  # noqa: SIM115 (closed by the with below, after the flock)
    except OSError as exc:  # a read-only file system or directory: nothing here can be migrated
        raise InfrastructureError(f"cannot migrate database {redact(engine.url)!r}: its migration lock {lock} "
                                  f"cannot be opened for writing ({exc.strerror or exc}); the database or its "
                                  f"directory is read-only: migrate it where it is writable") from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def sqlite_foreign_keys_off(conn: Connection) -> Iterator[None]:
    """Foreign keys off on a SQLite connection that has no transaction yet, back on when done (see the module
    doc); nothing on other backends."""
    if conn.dialect.name != "sqlite":
        yield
        return
    raw = conn.connection.driver_connection
    raw.execute("PRAGMA foreign_keys = OFF")  # outside a transaction: inside one SQLite ignores it
    if raw.execute("PRAGMA foreign_keys").fetchone()[0]:
        raise BugError("SQLite foreign keys are still on: the migration connection was already in a transaction")
    try:
        yield
    finally:
        conn.rollback()  # committed on success; after a failure, what the failed migration had begun
        raw.execute("PRAGMA foreign_keys = ON")


def foreign_key_check(conn: Connection, revision: str) -> None:
    """Refuse (BugError) a SQLite migration that leaves a reference dangling; run before it commits."""
    bad = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
    if bad:
        table, rowid, parent, _ = bad[0]
        raise BugError(f"migration {revision} leaves {len(bad)} dangling reference(s), e.g. {table} row {rowid} "
                       f"-> {parent}")


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def schema_diff(engine: Engine) -> list[object]:
    """Differences between the ORM models and the database (empty when the migrations match the models)."""
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        return list(compare_metadata(ctx, Base.metadata))


def _revisions() -> set[str]:
    return {s.revision for s in ScriptDirectory.from_config(alembic_config()).walk_revisions()}


def require_current(engine: Engine, label: str | None = None) -> str:
    """Refuse (InfrastructureError, exit 3) a database this code cannot read as is: empty or not a results
    database, older than this code (run ``edgefarm db upgrade``), or newer (upgrade edgefarm). One line each."""
    label = label or redact(engine.url)
    try:
        at = current_revision(engine)
    except DBAPIError as exc:
        raise InfrastructureError(f"cannot read database {label!r}: {str(exc.orig).strip()}") from None
    head = head_revision()
    if at == head:
        return at
    if at is None:
        raise InfrastructureError(f"database {label!r} has no edgefarm schema (empty, or not a results database); "
                                  f"create it with `edgefarm db upgrade --db URL`")
    if at not in _revisions():
        raise InfrastructureError(f"database {label!r} is at revision {at!r}, newer than this edgefarm "
                                  f"(head {head!r}); install a newer edgefarm")
    raise InfrastructureError(f"database {label!r} is at revision {at!r}, older than this edgefarm (head "
                              f"{head!r}); migrate it with `edgefarm db upgrade --db URL`")


def prepare_for_run(engine: Engine) -> str:
    """What a run (nightly, a test list) does first: create the schema in a brand-new database (no tables at
    all); any other database must already be at head (only ``edgefarm db upgrade`` migrates)."""
    try:
        empty = not inspect(engine).get_table_names()
    except DBAPIError as exc:
        raise InfrastructureError(f"cannot read database {redact(engine.url)!r}: {str(exc.orig).strip()}") from None
    if empty:
        upgrade(engine)
    return require_current(engine)
