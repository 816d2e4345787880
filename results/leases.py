"""Device leases held in the database: a device never runs more than its max parallel jobs, across processes
and hosts.

Each acquire serialises on the device and, once it holds the device, deletes the leases of dead holders (those
whose last heartbeat is older than their TTL, and at once those whose holder is a process of this host that is
gone, as dead runs are reaped: a rerun after a killed orchestrator gets its devices back without waiting out the
TTL), counts the live ones and inserts a new one if there is room. Times come from the database host's clock on
PostgreSQL (so hosts with skewed clocks agree) and from the local clock on SQLite (which is local anyway).

On PostgreSQL an acquire is two statements sent together in one round trip (psycopg's pipeline, in one implicit
transaction that commits at its Sync): the upsert of the device's ``lease_devices`` row, which takes its lock to
commit; then one statement that deletes the expired leases, counts the live ones and inserts only if they fit. It
must be a second statement: under READ COMMITTED a statement reads a snapshot taken when it starts, so a statement
that waited for the lock would not see the lease its previous holder just committed. The lock is never held while
the client is away (16 processes on 2 busy cores queued behind a holder waiting to be scheduled). Which live
holders are gone only Python can tell: they are reclaimed after the statement, and the attempt retried if it found
the device full. A release is one autocommit DELETE. On SQLite an acquire is one ``BEGIN IMMEDIATE`` transaction
(the database-wide write lock) of three statements.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import Connection, Dialect, Engine, delete, func, insert, select, text, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.exc import DBAPIError

from edgefarm.results.db import writer
from edgefarm.results.machine import process_gone, this_host
from edgefarm.results.models import DeviceLease, LeaseDevice
from edgellm.errors import ConfigurationError, InfrastructureError

log = logging.getLogger(__name__)
DEFAULT_TTL_S = 60.0


class LeaseTimeout(InfrastructureError):
    """No slot on the device became free within the wait."""


class LeaseLost(InfrastructureError):
    """The lease expired (missed heartbeats) or was reclaimed: the holder no longer owns a slot."""


@dataclass(frozen=True)
class Lease:
    id: int
    device_id: str
    holder: str
    ttl_s: float
    acquired_at: float  # epoch seconds (database clock on PostgreSQL)


def default_holder() -> str:
    """``host#machine:pid:token`` (results.machine.this_host): unique per acquirer, readable in the table."""
    return f"{this_host()}:{os.getpid()}:{secrets.token_hex(6)}"


def _gone(holder: str) -> bool:
    """Whether a ``host#machine:pid:token`` holder is a process of this machine that no longer exists (a holder of
    another machine with the same host name is not: its pid means nothing here)."""
    parts = holder.rsplit(":", 2)
    return len(parts) == 3 and parts[1].isdigit() and process_gone(parts[0], int(parts[1]))


def _now(conn: Connection) -> float:
    if conn.dialect.name == "postgresql":
        return float(conn.scalar(select(func.extract("epoch", func.clock_timestamp()))))  # type: ignore[arg-type]
    return time.time()


def _validate(device_id: str, max_jobs: int, ttl_s: float) -> None:
    if not device_id or not isinstance(device_id, str):
        raise ConfigurationError(f"bad device id {device_id!r}: need a non-empty string")
    if not isinstance(max_jobs, int) or max_jobs < 1:
        raise ConfigurationError(f"bad max_jobs {max_jobs!r} for device {device_id!r}: need an integer >= 1")
    if ttl_s <= 0:
        raise ConfigurationError(f"bad lease ttl_s {ttl_s!r}: need > 0 seconds")


# PostgreSQL's acquire (module doc): the lock, then, in a statement of its own, everything read under it.
_PG_LOCK = text(
    "INSERT INTO lease_devices (device_id, max_jobs) VALUES (:device_id, :max_jobs) "
    "ON CONFLICT (device_id) DO UPDATE SET max_jobs = EXCLUDED.max_jobs"
)
_PG_ACQUIRE = text("""
WITH clock AS MATERIALIZED (SELECT CAST(extract(epoch FROM clock_timestamp()) AS double precision) AS now),
expired AS (
    DELETE FROM device_leases AS l USING clock
    WHERE l.device_id = :device_id AND l.heartbeat_at + l.ttl_s < clock.now
    RETURNING l.id, l.holder),
live AS (
    SELECT l.id, l.holder, l.slots FROM device_leases AS l, clock
    WHERE l.device_id = :device_id AND l.heartbeat_at + l.ttl_s >= clock.now),
granted AS (
    INSERT INTO device_leases (device_id, holder, acquired_at, heartbeat_at, ttl_s, slots)
    SELECT :device_id, :holder, clock.now, clock.now, :ttl_s, :slots FROM clock
    WHERE (SELECT coalesce(sum(live.slots), 0) FROM live) + :slots <= :max_jobs
    RETURNING id)
SELECT 'granted' AS kind, granted.id, CAST(NULL AS text) AS holder, clock.now FROM granted, clock
UNION ALL SELECT 'expired', expired.id, expired.holder, NULL FROM expired
UNION ALL SELECT 'live', live.id, live.holder, NULL FROM live
""")


def try_acquire(
    engine: Engine, device_id: str, max_jobs: int, *, holder: str | None = None, ttl_s: float = DEFAULT_TTL_S,
    slots: int = 1,
) -> Lease | None:
    """One attempt: a lease if the device has ``slots`` free slots now, else None. ``slots=max_jobs`` holds the
    device exclusively (benchmarks: nothing else runs beside them)."""
    _validate(device_id, max_jobs, ttl_s)
    if not isinstance(slots, int) or not 1 <= slots <= max_jobs:
        raise ConfigurationError(f"bad slots {slots!r} for device {device_id!r}: need 1..{max_jobs} (its max_jobs)")
    holder = holder or default_holder()
    if engine.dialect.name == "postgresql":
        return _try_acquire_pg(engine, device_id, max_jobs, holder, ttl_s, slots)
    return _try_acquire_sqlite(engine, device_id, max_jobs, holder, ttl_s, slots)


def _try_acquire_pg(engine: Engine, device_id: str, max_jobs: int, holder: str, ttl_s: float, slots: int
                    ) -> Lease | None:
    params = {"device_id": device_id, "max_jobs": max_jobs, "holder": holder, "ttl_s": ttl_s, "slots": slots}
    for _ in range(2):  # again only if the device was full and leases of gone processes were reclaimed
        rows = _pg_locked_statements(engine, params)
        for row in rows:
            if row.kind == "expired":
                log.warning("reclaimed expired lease on %s held by %s", device_id, row.holder)
        orphaned = [(row.id, row.holder) for row in rows if row.kind == "live" and _gone(row.holder)]
        if orphaned:
            _reclaim_orphaned(engine, device_id, orphaned)
        granted = [row for row in rows if row.kind == "granted"]
        if granted:
            return Lease(int(granted[0].id), device_id, holder, ttl_s, float(granted[0].now))
        if not orphaned:
            return None
    return None


@dataclass(frozen=True)
class _Row:
    """A row of ``_PG_ACQUIRE``: the granted lease (with the clock), an expired one deleted, or a live one."""

    kind: str
    id: int
    holder: str | None
    now: float | None


def _pg_locked_statements(engine: Engine, params: dict[str, object]) -> list[_Row]:
    """``_PG_LOCK`` then ``_PG_ACQUIRE``, as one transaction: pipelined in one round trip on psycopg 3, else a
    BEGIN ... COMMIT of the two."""
    with engine.connect() as conn:
        raw = conn.connection.dbapi_connection
        if not _pipelines(raw):  # another driver: the same statements in a transaction, more round trips
            with conn.begin():
                conn.execute(_PG_LOCK, params)
                return [_Row(*row) for row in conn.execute(_PG_ACQUIRE, params)]
        conn.execution_options(isolation_level="AUTOCOMMIT")  # no BEGIN: the pipeline's Sync ends the transaction
        lock_sql, acquire_sql = _compiled(engine.dialect)
        try:
            with raw.cursor() as lock, raw.cursor() as cur:
                with raw.pipeline():  # its end sends the Sync (the implicit transaction of both commits there)
                    lock.execute(lock_sql, params)  # and reads the results back: the one round trip
                    cur.execute(acquire_sql, params)
                return [_Row(*row) for row in cur.fetchall()]
        except engine.dialect.loaded_dbapi.Error as exc:  # as SQLAlchemy reports a driver's error
            gone = engine.dialect.is_disconnect(exc, raw, None)
            if gone:
                conn.invalidate(exc)
            raise DBAPIError.instance(acquire_sql, params, exc, engine.dialect.loaded_dbapi.Error,
                                      connection_invalidated=gone, dialect=engine.dialect) from exc


_COMPILED: dict[tuple[type[Dialect], str], tuple[str, str]] = {}


def _compiled(dialect: Dialect) -> tuple[str, str]:
    """``_PG_LOCK`` and ``_PG_ACQUIRE`` in the driver's parameter style (compiled once: 0.3 ms of CPU each time)."""
    key = (type(dialect), dialect.paramstyle)
    if key not in _COMPILED:
        _COMPILED[key] = (str(_PG_LOCK.compile(dialect=dialect)), str(_PG_ACQUIRE.compile(dialect=dialect)))
    return _COMPILED[key]


def _pipelines(raw: object) -> bool:
    """Whether the driver's connection sends statements together and reads them back at one Sync (psycopg 3)."""
    return hasattr(raw, "pipeline")


def _reclaim_orphaned(engine: Engine, device_id: str, orphaned: list[tuple[int, str]]) -> None:
    """Delete the leases whose holders are gone processes of this host (dead whatever the lock: no lock needed)."""
    with _one_statement(engine) as conn:
        gone = conn.execute(
            delete(DeviceLease)
            .where(DeviceLease.id.in_(sorted(i for i, _ in orphaned)), DeviceLease.device_id == device_id)
            .returning(DeviceLease.holder)
        ).scalars().all()
    for dead in gone:
        log.warning("reclaimed the lease on %s held by %s: that process is gone", device_id, dead)


@contextmanager
def _one_statement(engine: Engine) -> Iterator[Connection]:
    """A connection for one write statement: autocommit on PostgreSQL (no BEGIN and COMMIT round trips); a
    ``BEGIN IMMEDIATE`` transaction on SQLite."""
    with writer(engine).connect() as conn:
        if conn.dialect.name == "postgresql":
            yield conn.execution_options(isolation_level="AUTOCOMMIT")
        else:
            with conn.begin():
                yield conn


def _try_acquire_sqlite(engine: Engine, device_id: str, max_jobs: int, holder: str, ttl_s: float, slots: int
                        ) -> Lease | None:
    with writer(engine).connect() as conn, conn.begin():  # BEGIN IMMEDIATE: the write lock, to commit
        upsert = sqlite.insert(LeaseDevice).values(device_id=device_id, max_jobs=max_jobs)
        conn.execute(upsert.on_conflict_do_update(index_elements=["device_id"], set_={"max_jobs": max_jobs}))
        now = time.time()
        leases = conn.execute(select(DeviceLease.id, DeviceLease.holder, DeviceLease.heartbeat_at, DeviceLease.ttl_s,
                                     DeviceLease.slots).where(DeviceLease.device_id == device_id)).all()
        expired = [(lease.id, lease.holder) for lease in leases if lease.heartbeat_at + lease.ttl_s < now]
        orphaned = [(lease.id, lease.holder) for lease in leases
                    if lease.heartbeat_at + lease.ttl_s >= now and _gone(lease.holder)]
        dead_ids = {lease_id for lease_id, _ in expired + orphaned}
        if dead_ids:
            conn.execute(delete(DeviceLease).where(DeviceLease.id.in_(sorted(dead_ids))))
        for _, dead in expired:
            log.warning("reclaimed expired lease on %s held by %s", device_id, dead)
        for _, dead in orphaned:
            log.warning("reclaimed the lease on %s held by %s: that process is gone", device_id, dead)
        held = sum(lease.slots for lease in leases if lease.id not in dead_ids)
        if held + slots > max_jobs:
            return None
        lease_id = conn.execute(
            insert(DeviceLease)
            .values(device_id=device_id, holder=holder, acquired_at=now, heartbeat_at=now, ttl_s=ttl_s, slots=slots)
            .returning(DeviceLease.id)
        ).scalar_one()
    return Lease(int(lease_id), device_id, holder, ttl_s, now)


def acquire(
    engine: Engine,
    device_id: str,
    max_jobs: int,
    *,
    holder: str | None = None,
    ttl_s: float = DEFAULT_TTL_S,
    wait_s: float = 0.0,
    poll_s: float = 0.01,
    max_poll_s: float = 0.5,
) -> Lease:
    """A lease, polling with jittered exponential backoff for up to ``wait_s``; raises LeaseTimeout after that."""
    deadline = time.monotonic() + wait_s
    delay = poll_s
    while True:
        lease = try_acquire(engine, device_id, max_jobs, holder=holder, ttl_s=ttl_s)
        if lease is not None:
            return lease
        left = deadline - time.monotonic()
        if left <= 0:
            raise LeaseTimeout(f"device {device_id!r}: all {max_jobs} slot(s) still held after waiting {wait_s:g} s")
        time.sleep(min(left, delay * random.uniform(0.5, 1.0)))
        delay = min(delay * 2, max_poll_s)


def heartbeat(engine: Engine, lease: Lease) -> None:
    """Keep the lease alive; raises LeaseLost if it already expired or was reclaimed."""
    with writer(engine).connect() as conn, conn.begin():
        now = _now(conn)
        mine = (DeviceLease.id == lease.id, DeviceLease.holder == lease.holder)
        alive = DeviceLease.heartbeat_at + DeviceLease.ttl_s >= now
        done = conn.execute(update(DeviceLease).where(*mine, alive).values(heartbeat_at=now)).rowcount
        if done != 1:
            conn.execute(delete(DeviceLease).where(*mine))  # expired but not yet reclaimed: give it up
    if done != 1:
        raise LeaseLost(f"lease {lease.id} on device {lease.device_id!r} held by {lease.holder} expired or was "
                        f"reclaimed (ttl {lease.ttl_s:g} s): stop using the device")


def release(engine: Engine, lease: Lease) -> bool:
    """Free the slot; False if the lease was already gone (expired and reclaimed)."""
    with _one_statement(engine) as conn:
        gone = conn.execute(
            delete(DeviceLease).where(DeviceLease.id == lease.id, DeviceLease.holder == lease.holder)
        ).rowcount
    if gone != 1:
        log.warning("lease %s on %s was already released or reclaimed", lease.id, lease.device_id)
    return gone == 1


def live_leases(engine: Engine, device_id: str) -> list[Lease]:
    """The leases currently counted against the device (expired ones excluded)."""
    with engine.connect() as conn:
        now = _now(conn)
        rows = conn.execute(
            select(DeviceLease.id, DeviceLease.holder, DeviceLease.ttl_s, DeviceLease.acquired_at)
            .where(DeviceLease.device_id == device_id, DeviceLease.heartbeat_at + DeviceLease.ttl_s >= now)
            .order_by(DeviceLease.id)
        ).all()
    return [Lease(r.id, device_id, r.holder, r.ttl_s, r.acquired_at) for r in rows]


@contextmanager
def hold(
    engine: Engine,
    device_id: str,
    max_jobs: int,
    *,
    ttl_s: float = DEFAULT_TTL_S,
    wait_s: float = 0.0,
    holder: str | None = None,
) -> Iterator[Lease]:
    """Acquire, heartbeat every ttl/3 in a background thread, release on exit (also on error)."""
    lease = acquire(engine, device_id, max_jobs, holder=holder, ttl_s=ttl_s, wait_s=wait_s)
    with kept_alive(engine, lease):
        yield lease


@contextmanager
def kept_alive(engine: Engine, lease: Lease) -> Iterator[Lease]:
    """Heartbeat an acquired lease every ttl/3 in a background thread; release it on exit (also on error). A block
    that ends normally learns whether the lease held all along: LeaseLost if it expired or was reclaimed (a process
    suspended past the TTL, whose device another run took meanwhile, must not report what it did there)."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(lease.ttl_s / 3):
            try:
                heartbeat(engine, lease)
            except LeaseLost:
                log.error("lost lease %s on %s", lease.id, lease.device_id)
                return
            except Exception:  # a transient database error: try again next beat, the TTL has slack
                log.exception("heartbeat of lease %s on %s failed", lease.id, lease.device_id)

    thread = threading.Thread(target=beat, name=f"lease-{lease.device_id}-{lease.id}", daemon=True)
    thread.start()
    lost = False
    try:
        yield lease
        stop.set()
        thread.join()
        try:
            heartbeat(engine, lease)
        except LeaseLost:
            lost = True
            raise
        except Exception:  # a transient database error: the beats before it said the lease held
            log.exception("last heartbeat of lease %s on %s failed", lease.id, lease.device_id)
    finally:
        stop.set()
        thread.join()
        if not lost:
            release(engine, lease)
