"""Runs whose orchestrator died: a heartbeat while it lives, and a reaper that ends the dead ones as ``error``.

A ``running`` run is dead when its orchestrator's process is gone on this host (its pid no longer exists), or,
from any host, when its heartbeat is older than ``STALE_AFTER_S`` (three missed beats; this also covers a pid
that was reused). A reaped run is never published: its partial results stay out of
the docs and queries.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import Engine, select, update

from results.db import write_session
from results.models import Run, RunStatus, utcnow
from results.recorder import Recorder

log = logging.getLogger(__name__)
HEARTBEAT_S = 20.0
STALE_AFTER_S = 3 * HEARTBEAT_S


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host exists (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def process_gone(host: str | None, pid: int | None) -> bool:
    """Whether process ``pid`` of ``host`` is known to be gone: only this host's processes can be asked (never
    this process itself); anything else may live."""
    return host == socket.gethostname() and pid is not None and pid != os.getpid() and not pid_alive(pid)


def is_dead(run: Run, now: datetime, stale_after_s: float = STALE_AFTER_S) -> str | None:
    """Why the run's orchestrator is dead, or None while it may live."""
    beat = run.heartbeat_at or run.started_at
    age = (now - beat).total_seconds()
    if process_gone(run.host, run.pid):
        return f"its orchestrator (pid {run.pid} on {run.host}) is gone"
    if age > stale_after_s:
        return f"no heartbeat for {age:.0f} s (stale after {stale_after_s:.0f} s)"
    return None


def reap_stale_runs(engine: Engine, *, stale_after_s: float = STALE_AFTER_S) -> dict[int, str]:
    """End every dead ``running`` run as ``error`` (unpublished); returns run id -> why."""
    now = utcnow()
    reaped: dict[int, str] = {}
    with write_session(engine) as s:
        for run in s.scalars(select(Run).where(Run.status == RunStatus.RUNNING)):
            why = is_dead(run, now, stale_after_s)
            if why is not None:
                reaped[run.id] = why
        for run_id in reaped:
            s.execute(update(Run).where(Run.id == run_id, Run.status == RunStatus.RUNNING)
                      .values(status=RunStatus.ERROR, finished_at=now))
    for run_id, why in reaped.items():
        log.warning("run %d reaped as error: %s", run_id, why)
    return reaped


@contextmanager
def heartbeat(recorder: Recorder, run_id: int, every_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Refresh the run's heartbeat every ``every_s`` seconds while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                recorder.heartbeat(run_id)
            except Exception as exc:  # a missed beat is survivable; the reaper allows three
                log.warning("run %d: heartbeat failed: %s", run_id, exc)

    th = threading.Thread(target=beat, name=f"run-{run_id}-heartbeat", daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()


