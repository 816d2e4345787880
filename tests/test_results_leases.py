"""Device leases: never more holders than max_jobs across processes, dead holders expire, on both backends."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, event, insert, select, update
from sqlalchemy.exc import DataError, OperationalError

from benchmarks.db_leases import round_trips
from edgefarm.results import leases
from edgefarm.results.db import make_engine, writer
from edgefarm.results.leases import (
    Lease,
    LeaseLost,
    LeaseTimeout,
    acquire,
    heartbeat,
    hold,
    live_leases,
    release,
    try_acquire,
)
from edgefarm.results.models import DeviceLease, LeaseDevice
from edgellm.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    e = make_engine(migrated_db_url)
    yield e
    e.dispose()


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda x: (x[0], x[1]))
    depth = best = 0
    for _, d in events:
        depth += d
        best = max(best, depth)
    return best


def test_processes_never_exceed_max_jobs(engine: Engine, migrated_db_url: str, tmp_path: Path) -> None:
    """4 processes x 10 acquisitions on a device with 2 slots, then on one with 1 slot (all start together)."""
    go, n, procs = tmp_path / "go", 10, []
    for _ in range(4):
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.lease_worker", "hammer", migrated_db_url, "two:2,one:1",
             str(n), "0.01", str(go)], stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT))
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.touch()
    intervals: dict[str, list[tuple[float, float]]] = {"one": [], "two": []}
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        for device, got in json.loads(out.strip().splitlines()[-1]).items():
            intervals[device] += [(a, b) for a, b in got]
    assert {d: len(v) for d, v in intervals.items()} == {"one": 4 * n, "two": 4 * n}
    # never more holders than slots, and with 2 slots they really are used in parallel
    assert _max_overlap(intervals["one"]) == 1
    assert _max_overlap(intervals["two"]) == 2
    assert live_leases(engine, "one") == live_leases(engine, "two") == []


def _dead_holder(engine: Engine, url: str, device: str, ttl_s: float, *holder: str) -> Lease:
    """A lease whose holder process was killed (SIGKILL: it never released it)."""
    p = subprocess.Popen([sys.executable, "-m", "tests.helpers.lease_worker", "die", url, device, "1", str(ttl_s),
                          *holder], stdout=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        assert p.stdout is not None
        dead_id = int(p.stdout.readline())
        (dead,) = live_leases(engine, device)
    finally:
        p.kill()
        p.wait()
    assert dead.id == dead_id
    return dead


def test_dead_holder_of_another_host_expires_and_is_reclaimed(engine: Engine, migrated_db_url: str) -> None:
    # a process elsewhere cannot be asked whether it lives: only its missed heartbeats say it died
    dead = _dead_holder(engine, migrated_db_url, "thor-1", 1.0, f"elsewhere-{os.getpid()}:1:feedface")
    assert try_acquire(engine, "thor-1", 1) is None  # still within its TTL
    lease = acquire(engine, "thor-1", 1, ttl_s=30, wait_s=5)  # reclaimed once the TTL passed
    assert lease.holder != dead.holder
    assert [x.holder for x in live_leases(engine, "thor-1")] == [lease.holder]
    assert release(engine, lease)
    assert not release(engine, lease)


def test_dead_holder_of_this_host_is_reclaimed_at_once(engine: Engine, migrated_db_url: str) -> None:
    """A killed orchestrator's leases: its process is gone, so its slots are free again without waiting out the
    TTL (before, a rerun found the devices the dead run held busy for a minute)."""
    dead = _dead_holder(engine, migrated_db_url, "orin-1", 3600.0)
    assert dead.holder.startswith(f"{socket.gethostname()}#")  # host name and machine key (results.machine)
    lease = try_acquire(engine, "orin-1", 1)
    assert lease is not None
    assert [x.holder for x in live_leases(engine, "orin-1")] == [lease.holder]
    mine = try_acquire(engine, "orin-2", 1)  # a live holder (this very process) is never reclaimed
    assert mine is not None and try_acquire(engine, "orin-2", 1) is None
    assert release(engine, lease) and release(engine, mine)


def test_heartbeat_keeps_a_lease_and_a_missed_one_loses_it(engine: Engine) -> None:
    lease = try_acquire(engine, "x86-1", 1, ttl_s=0.6)
    assert lease is not None
    for _ in range(3):
        time.sleep(0.3)
        heartbeat(engine, lease)  # 0.9 s in: alive only thanks to the heartbeats
    assert try_acquire(engine, "x86-1", 1) is None
    time.sleep(0.7)
    with pytest.raises(LeaseLost, match="x86-1"):
        heartbeat(engine, lease)
    with hold(engine, "x86-1", 1, ttl_s=0.3) as held:  # the background heartbeat outlives several TTLs
        time.sleep(0.8)
        assert [x.id for x in live_leases(engine, "x86-1")] == [held.id]
    assert live_leases(engine, "x86-1") == []


def test_acquire_timeout_and_bad_input(engine: Engine) -> None:
    first = acquire(engine, "a30-1", 1)
    t0 = time.monotonic()
    with pytest.raises(LeaseTimeout, match="a30-1"):
        acquire(engine, "a30-1", 1, wait_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 2
    assert try_acquire(engine, "a30-1", 2) is not None  # max_jobs comes from the device's current setting
    release(engine, first)
    with pytest.raises(ConfigurationError, match="max_jobs 0"):
        try_acquire(engine, "a30-1", 0)
    with pytest.raises(ConfigurationError, match="ttl_s"):
        try_acquire(engine, "a30-1", 1, ttl_s=0)


def test_exclusive_lease_takes_every_slot(engine: Engine) -> None:
    one = try_acquire(engine, "dev-x", 2)
    assert one is not None
    assert try_acquire(engine, "dev-x", 2, slots=2) is None  # a benchmark waits until the device is idle
    release(engine, one)
    whole = try_acquire(engine, "dev-x", 2, slots=2)
    assert whole is not None
    assert try_acquire(engine, "dev-x", 2) is None  # nothing runs beside it
    release(engine, whole)
    assert try_acquire(engine, "dev-x", 2) is not None
    with pytest.raises(ConfigurationError, match="bad slots 3"):
        try_acquire(engine, "dev-x", 2, slots=3)


def test_an_acquire_waiting_for_the_device_sees_what_its_holder_committed(engine: Engine) -> None:
    """The race a single statement would lose on PostgreSQL: it reads a snapshot taken before it waited for the
    device's lock, so the lease the lock's holder committed meanwhile would be missed and the device overbooked."""
    _waiter_sees_the_holders_commit(engine)


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_without_a_pipeline_an_acquire_waiting_for_the_device_sees_what_its_holder_committed(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race on PostgreSQL's path for drivers without a pipeline (two statements in one transaction)."""
    monkeypatch.setattr(leases, "_pipelines", lambda raw: False)
    _waiter_sees_the_holders_commit(engine)


def _waiter_sees_the_holders_commit(engine: Engine) -> None:
    first = try_acquire(engine, "busy-1", 1)  # the device's row exists
    assert first is not None and release(engine, first)
    got: list[Lease | None] = []
    with writer(engine).connect() as conn, conn.begin():  # another acquirer holds the device
        conn.execute(update(LeaseDevice).where(LeaseDevice.device_id == "busy-1").values(max_jobs=1))
        waiter = threading.Thread(target=lambda: got.append(try_acquire(engine, "busy-1", 1)))
        waiter.start()
        time.sleep(0.5)
        assert waiter.is_alive()  # it waits for the device
        now = time.time()
        conn.execute(insert(DeviceLease).values(device_id="busy-1", holder=f"elsewhere-{os.getpid()}:1:beef",
                                                acquired_at=now, heartbeat_at=now, ttl_s=60.0, slots=1))
    waiter.join(timeout=30)
    assert got == [None]  # the only slot was taken by the lease committed while it waited
    assert [x.holder for x in live_leases(engine, "busy-1")] == [f"elsewhere-{os.getpid()}:1:beef"]


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_without_a_pipeline_the_device_stays_locked_until_the_insert(engine: Engine,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Another driver's two statements run in one transaction: between them nobody else may count the device."""
    monkeypatch.setattr(leases, "_pipelines", lambda raw: False)
    first = try_acquire(engine, "probe-1", 1)  # the device's row exists (committed: the probe can see it)
    assert first is not None and release(engine, first)
    other = make_engine(engine.url)
    locked: list[bool] = []

    def probe(conn: object, cursor: object, statement: str, *_: object) -> None:
        if "WITH clock" in statement:  # the second statement: the device must still be locked
            with other.connect() as c:
                try:
                    c.execute(select(LeaseDevice).where(LeaseDevice.device_id == "probe-1")
                              .with_for_update(nowait=True))
                    locked.append(False)
                except OperationalError:
                    locked.append(True)

    event.listen(engine, "before_cursor_execute", probe)
    try:
        assert try_acquire(engine, "probe-1", 1) is not None
    finally:
        event.remove(engine, "before_cursor_execute", probe)
        other.dispose()
    assert locked == [True]


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_round_trips_on_postgresql(engine: Engine) -> None:
    """Each round trip is a wait for a CPU on a busy host (16 contending processes on 2 cores: p95 0.4 s with 6 for
    an acquire and 4 for a release): at most the pool's pre-ping and one statement (or pipeline) each."""
    assert round_trips(engine) == {"acquire": 2, "release": 2}


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_a_database_error_keeps_its_kind_and_the_pool_usable(engine: Engine) -> None:
    """PostgreSQL refuses a device id longer than its column inside the pipelined statements (SQLite does not
    enforce lengths): the error keeps its kind and the pool stays usable."""
    with pytest.raises(DataError, match="too long"):
        try_acquire(engine, "x" * 300, 1)  # the pipelined statements fail at the server
    lease = try_acquire(engine, "after-error", 1)
    assert lease is not None and release(engine, lease)


def test_dead_holders_are_reclaimed_and_logged_also_when_there_is_room(
    engine: Engine, migrated_db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gone = _dead_holder(engine, migrated_db_url, "room-1", 3600.0)  # a killed process of this host
    now = time.time() - 120
    with writer(engine).connect() as conn, conn.begin():  # and one of another host whose TTL ran out
        conn.execute(insert(DeviceLease).values(device_id="room-1", holder=f"elsewhere-{os.getpid()}:1:cafe",
                                                acquired_at=now, heartbeat_at=now, ttl_s=60.0, slots=1))
    with caplog.at_level(logging.WARNING, logger="edgefarm.results.leases"):
        lease = try_acquire(engine, "room-1", 3)  # 3 slots: room for it beside both
    assert lease is not None
    assert [x.holder for x in live_leases(engine, "room-1")] == [lease.holder]
    warnings = [r.getMessage() for r in caplog.records]
    assert f"reclaimed expired lease on room-1 held by elsewhere-{os.getpid()}:1:cafe" in warnings
    assert f"reclaimed the lease on room-1 held by {gone.holder}: that process is gone" in warnings
    assert release(engine, lease)
