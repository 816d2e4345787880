"""Device leases held in the database: a device never runs more than its max parallel jobs, across processes
and hosts.

Each acquire is one write transaction that serialises on the device: on PostgreSQL the upsert of the device's
``lease_devices`` row (which locks it to commit and reads the clock); on SQLite ``BEGIN IMMEDIATE`` (the
database-wide write lock). Inside it, in three statements (upsert, one read of the device's leases, insert: each
round trip is time the lock is held, and the lock is what contending workers queue on), leases of dead holders are
deleted (those whose last heartbeat is older than their TTL, and at once those whose holder is a process of this
host that is gone, as dead runs are reaped: a rerun after a killed orchestrator gets its devices back without
waiting out the TTL), the live ones counted, and a new one inserted if there is room. Times come from the
database host's clock on PostgreSQL (so hosts with skewed clocks agree) and from the local clock on SQLite (which is
local anyway).
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

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite

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
    with writer(engine).connect() as conn, conn.begin():
        pg = conn.dialect.name == "postgresql"
        ins = (postgresql.insert if pg else sqlite.insert)(LeaseDevice).values(device_id=device_id, max_jobs=max_jobs)
        upsert = ins.on_conflict_do_update(index_elements=["device_id"], set_={"max_jobs": max_jobs})
        if pg:  # the upsert takes the device row's lock (held to commit) and reads the database clock with it
            now = float(conn.execute(upsert.returning(func.extract("epoch", func.clock_timestamp()))).scalar_one())
        else:
            conn.execute(upsert)
            now = time.time()
        # a new statement after the lock: it sees every lease committed by whoever held the lock before us
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
    with writer(engine).connect() as conn, conn.begin():
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
