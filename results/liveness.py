"""Runs whose orchestrator died: a heartbeat while it lives, and a reaper that ends the dead ones as ``error``.

A ``running`` run is dead when its orchestrator's process is gone on this machine (same machine key, see
results.machine: a host name alone is no machine's identity; its pid no longer exists), or, from any machine, when
its heartbeat is older than ``STALE_AFTER_S`` (three missed beats; this also covers a pid that was reused). A reaped
run is never published: its partial results stay out of the docs and queries, and if its orchestrator was only
suspended, it learns so at its next heartbeat or when it tries to finish (``RunReaped``, infrastructure).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import Engine, select, update

from edgefarm.results.db import write_session
from edgefarm.results.errors import RunReaped
from edgefarm.results.machine import pid_alive, process_gone
from edgefarm.results.models import Run, RunStatus, utcnow
from edgefarm.results.recorder import Recorder
from edgellm.errors import ConfigurationError

log = logging.getLogger(__name__)
__all__ = ["heartbeat", "is_dead", "pid_alive", "process_gone", "reap_stale_runs"]
HEARTBEAT_S = 20.0
STALE_AFTER_S = 3 * HEARTBEAT_S
ENV_HEARTBEAT_S = "EDGEFARM_HEARTBEAT_S"  # seconds between heartbeats (tests shorten it); stale after three missed
_period = {"s": HEARTBEAT_S}  # this process's, set by the settings (flows.settings, the farm environment's reader)


_reaped: dict[int, str] = {}  # runs of this process that another process reaped meanwhile -> why
_reaped_lock = threading.Lock()


def reaped(run_id: int) -> RunReaped | None:
    """The error to stop with when ``run_id``, a run of this process, was reaped meanwhile (its heartbeat learnt
    so); None while it runs. Work that waits (for a device) asks, so a resumed run ends instead of queueing."""
    with _reaped_lock:
        why = _reaped.get(run_id)
    return None if why is None else RunReaped(why)


def configure_heartbeat(raw: str | None) -> float:
    """Set this process's seconds between heartbeats from the settings' ``$EDGEFARM_HEARTBEAT_S`` (None or empty:
    ``HEARTBEAT_S``); a value that is no number of seconds in [0.05, 3600] is a ConfigurationError naming it."""
    text = (raw or "").strip()
    if not text:
        _period["s"] = HEARTBEAT_S
        return HEARTBEAT_S
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not 0.05 <= value <= 3600:
        raise ConfigurationError(f"bad ${ENV_HEARTBEAT_S} {text!r}: need seconds between 0.05 and 3600 "
                                 f"(default {HEARTBEAT_S:g})")
    _period["s"] = value
    return value


def heartbeat_s() -> float:
    """Seconds between a run's (and a device lease's) heartbeats: what the settings configured
    (``configure_heartbeat``), else ``HEARTBEAT_S``."""
    return _period["s"]


def stale_limit_s() -> float:
    """Three missed heartbeats: a run is dead after this, and a device lease lives this long without one."""
    return 3 * heartbeat_s()


def is_dead(run: Run, now: datetime, stale_after_s: float = STALE_AFTER_S) -> str | None:
    """Why the run's orchestrator is dead, or None while it may live."""
    beat = run.heartbeat_at or run.started_at
    age = (now - beat).total_seconds()
    if process_gone(run.host, run.pid):
        return f"its orchestrator (pid {run.pid} on {run.host}) is gone"
    if age > stale_after_s:
        return f"no heartbeat for {age:.0f} s (stale after {stale_after_s:.0f} s)"
    return None


def reap_stale_runs(engine: Engine, *, stale_after_s: float | None = None) -> dict[int, str]:
    """End every dead ``running`` run as ``error`` (unpublished); returns run id -> why."""
    stale = stale_limit_s() if stale_after_s is None else stale_after_s
    now = utcnow()
    reaped: dict[int, str] = {}
    with write_session(engine) as s:
        for run in s.scalars(select(Run).where(Run.status == RunStatus.RUNNING)):
            why = is_dead(run, now, stale)
            if why is not None:
                reaped[run.id] = why
        for run_id in reaped:
            s.execute(update(Run).where(Run.id == run_id, Run.status == RunStatus.RUNNING)
                      .values(status=RunStatus.ERROR, finished_at=now))
    for run_id, why in reaped.items():
        log.warning("run %d reaped as error: %s", run_id, why)
    return reaped


@contextmanager
def heartbeat(recorder: Recorder, run_id: int, every_s: float | None = None) -> Iterator[None]:
    """Refresh the run's heartbeat every ``every_s`` seconds (default ``heartbeat_s()``) while the block runs; once
    the run was reaped (this process was suspended past three beats) it stops: the run cannot finish as anything
    (``Recorder.finish_run`` raises RunReaped)."""
    stop = threading.Event()
    every = heartbeat_s() if every_s is None else every_s

    def beat() -> None:
        while not stop.wait(every):
            try:
                recorder.heartbeat(run_id)
            except RunReaped as exc:
                log.error("%s", exc)
                with _reaped_lock:
                    _reaped[run_id] = str(exc)
                return
            except Exception as exc:  # a missed beat is survivable; the reaper allows three
                log.warning("run %d: heartbeat failed: %s", run_id, exc)

    th = threading.Thread(target=beat, name=f"run-{run_id}-heartbeat", daemon=True)
    th.start()
    try:
        yield
    finally:
        stop.set()
        th.join()
        with _reaped_lock:  # what this run learnt ends with it: a later run of this process (another database's
            _reaped.pop(run_id, None)  # run of the same number) must not inherit it


