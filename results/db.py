"""Database URLs, engines and sessions (which URL a command uses is the farm's settings' answer: flows/settings.py).

SQLite (a file under the data dir) is the embedded default; PostgreSQL is production. Every SQLite connection
gets WAL, a busy timeout and foreign keys ON. pysqlite's own transaction handling is turned off so that we emit
BEGIN ourselves: writers use ``BEGIN IMMEDIATE`` (take the write lock up front, so two writers queue on the busy
timeout instead of failing with a lock upgrade deadlock); readers use a plain deferred ``BEGIN``.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import Engine as Engine  # re-exported: the type a caller outside results/ passes along
from sqlalchemy import create_engine, event, inspect, make_url
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session

from edgellm.errors import ConfigurationError, EdgeLLMError
from edgellm.redact import HIDDEN, unseen
from edgellm.redact import redact as redact_text

# What every read takes: an engine, or the session of :func:`reading` that a caller holds open across several reads
# (one transaction). Modules outside results/ name these types only; they never build SQL (tests/test_layers.py).
Db = Engine | Session
SQLITE_BUSY_TIMEOUT_MS = 30_000
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
_WRITE_OPTION = "edgefarm_write"
_handed_out: dict[str, str] = {}  # parameter form -> real URL, for the flows and tasks this process runs
_handed_out_lock = threading.Lock()


def default_url(data_dir: Path) -> str:
    """The embedded default: the SQLite file ``<data dir>/edgefarm.db``."""
    return f"sqlite:///{(Path(data_dir) / 'edgefarm.db').resolve()}"


def redact(url: str | URL) -> str:
    """The URL with every secret hidden, for logs, error messages and flow parameters (``edgellm.redact``, the one
    redaction: the password of ``user:password@``, up to the URL's last ``@``, and the value of every query
    parameter or libpq keyword named like a credential)."""
    return redact_text(url.render_as_string(hide_password=False) if isinstance(url, URL) else url)


def for_parameters(url: str) -> str:
    """What a flow or task parameter may carry: the URL with its password replaced (Prefect stores and serves
    parameters). This process remembers the real URL, so :func:`from_parameter` gives it back to the flows and
    tasks it runs; nothing else (no environment variable, no child process) learns it."""
    shown = redact(url)
    if shown != url:
        with _handed_out_lock:
            _handed_out[shown] = url
    return shown


def from_parameter(value: str | None, configured: str | None = None) -> str | None:
    """The real database URL for a parameter made by :func:`for_parameters`: the one this process handed out,
    else ``configured`` (where the flow runs: the settings' ``$EDGEFARM_DB_URL``) when it matches. A URL with no
    password, or None for the default, is returned as is."""
    if value is None or HIDDEN not in value:
        return value
    with _handed_out_lock:
        real = _handed_out.get(value)
    if real is not None:
        return real
    if configured and redact(configured) == value:
        return configured
    raise ConfigurationError(f"database URL {value!r} has its password hidden and $EDGEFARM_DB_URL does not hold "
                             f"the matching URL; set $EDGEFARM_DB_URL to the full URL where the flow runs")


def parse_url(url: str | URL) -> URL:
    """Validate a URL's syntax and backend; the error names it (password hidden) and the valid forms."""
    valid = "sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
    if isinstance(url, str) and unseen(url):
        raise ConfigurationError(f"bad database URL {redact(url)!r}: it holds a control or invisible character "
                                 f"(shown escaped); valid: {valid}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigurationError(f"bad database URL {redact(url)!r}; valid: {valid}") from None
    if parsed.get_backend_name() not in SUPPORTED_BACKENDS:
        raise ConfigurationError(
            f"unsupported database backend {parsed.get_backend_name()!r} in {redact(url)!r}; valid: {valid}"
        )
    if parsed.get_backend_name() == "sqlite":
        if not parsed.database or parsed.database == ":memory:":
            raise ConfigurationError(f"database URL {redact(url)!r} names no file; valid: {valid}")
        parent = Path(parsed.database).expanduser().resolve().parent
        if not parent.is_dir():
            raise ConfigurationError(f"database URL {redact(url)!r}: directory {str(parent)!r} does not exist")
    return parsed


def _on_sqlite_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # we emit BEGIN ourselves (see module doc)
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    _journal_mode_wal(cur)
    cur.execute("PRAGMA synchronous = NORMAL")
    cur.execute("PRAGMA foreign_keys = ON")
    cur.close()


def _journal_mode_wal(cur: Any) -> None:
    """Switch the file to WAL (persistent; a no-op once it is). Connections that open a brand-new file together
    race for that switch, and SQLite answers the loser "database is locked" at once, without its busy handler
    (waiting could deadlock two lock upgrades): retry that one, for at most the busy timeout."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            cur.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(random.uniform(0.002, 0.02))


def _on_sqlite_connect_read_only(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
    cur.close()


def read_only_engine(url: str) -> Engine:
    """An engine for commands that only read (query, docs, gc): a SQLite file must already exist (a mistyped
    path is never created) and is opened read-only, so a read-only file or medium works."""
    parsed = parse_url(url)
    if parsed.get_backend_name() != "sqlite":
        return make_engine(parsed)
    path = Path(str(parsed.database)).expanduser().resolve()
    if not path.is_file():
        raise ConfigurationError(f"database file {str(path)!r} does not exist (a mistyped --db?); create one "
                                 f"with `edgefarm db upgrade --db {redact(url)}`")
    query = {"uri": "true", "mode": "ro"}
    if os.statvfs(path).f_flag & os.ST_RDONLY:
        query["immutable"] = "1"  # nobody can write on a read-only medium; WAL needs no -shm file then
    ro = URL.create("sqlite", database=f"file:{quote(str(path))}", query=query)
    engine = create_engine(ro, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})
    event.listen(engine, "connect", _on_sqlite_connect_read_only)
    event.listen(engine, "begin", _on_sqlite_begin)
    return engine


def _on_sqlite_begin(conn: Any) -> None:
    mode = "IMMEDIATE" if conn.get_execution_options().get(_WRITE_OPTION) else "DEFERRED"
    conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str | URL, **kwargs: Any) -> Engine:
    """An engine for ``url`` (resolved by the farm's settings), set up for its backend."""
    parsed = parse_url(url)
    try:
        if parsed.get_backend_name() == "sqlite":
            engine = create_engine(
                parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}, **kwargs
            )
            event.listen(engine, "connect", _on_sqlite_connect)
            event.listen(engine, "begin", _on_sqlite_begin)
        else:
            engine = create_engine(parsed, pool_pre_ping=True, **kwargs)
    except (ArgumentError, NoSuchModuleError) as exc:
        raise ConfigurationError(f"bad database URL {redact(url)!r}: {exc}") from None
    return engine


def writer(engine: Engine) -> Engine:
    """The same engine whose transactions take the write lock first (SQLite ``BEGIN IMMEDIATE``; no-op on PG)."""
    return engine.execution_options(**{_WRITE_OPTION: True})


@contextmanager
def write_session(engine: Engine) -> Iterator[Session]:
    """One write transaction: committed on success, rolled back on any error (nothing half-written)."""
    with Session(writer(engine), expire_on_commit=False) as session, session.begin():
        yield session


@contextmanager
def read_session(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session, session.begin():
        yield session


def reading(db: Db) -> AbstractContextManager[Session]:
    """A new session of an engine for several reads in one transaction; a caller's session is used as is (and left
    open)."""
    return nullcontext(db) if isinstance(db, Session) else Session(db)


def backend_name(url: str | URL) -> str:
    """The database backend of a URL (``sqlite``, ``postgresql``), nothing of its path, host or credentials."""
    return make_url(url).get_backend_name()


def has_table(engine: Engine, name: str) -> bool:
    return inspect(engine).has_table(name)


@contextmanager
def database_errors(unreachable: Callable[[str], EdgeLLMError], refused: Callable[[str], EdgeLLMError]
                    ) -> Iterator[None]:
    """The driver's errors as the farm's kinds: an operational error (the database cannot be reached or written)
    as ``unreachable(message)``, any other driver error as ``refused(message)``."""
    try:
        yield
    except OperationalError as exc:
        raise unreachable(str(exc.orig).strip()) from None
    except DBAPIError as exc:
        raise refused(str(exc.orig).strip()) from None
