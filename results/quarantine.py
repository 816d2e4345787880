"""Flaky devices, named: the infrastructure-error rate per device (and per test) over recent runs, and the
quarantine that keeps a device above the threshold out of leasing until a health check passes. A device whose
setup is wrong for a job's tools (a tool or library missing, a build of another release: ``DeviceConfigurationError``)
is quarantined at once with that reason (:func:`quarantine`), without waiting for a rate.

A *try* of a device is a final result it produced, or an attempt on it that failed for infrastructure reasons
(the stage then moved elsewhere). Only tries after the device's last release count, so a device that passed
its health check starts clean.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session

from edgefarm.results.db import write_session
from edgefarm.results.models import Attempt, DeviceQuarantine, Result, Run, utcnow
from edgellm.errors import ErrorKind

RECENT_RUNS = 10
THRESHOLD = 0.5  # more than half of its recent tries failed for infrastructure reasons
MIN_TRIES = 4  # too few tries say nothing


@dataclass(frozen=True)
class ErrorRate:
    device: str
    test_id: str | None  # None: every test on the device
    infra_errors: int
    tries: int

    @property
    def rate(self) -> float:
        return self.infra_errors / self.tries if self.tries else 0.0


def _released(s: Session) -> dict[str, datetime]:
    stmt = (select(DeviceQuarantine.device_id, func.max(DeviceQuarantine.released_at))
            .where(DeviceQuarantine.released_at.is_not(None)).group_by(DeviceQuarantine.device_id))
    return {d: t for d, t in s.execute(stmt) if t is not None}


def error_rates(db: Engine | Session, *, runs: int = RECENT_RUNS, per_test: bool = False) -> list[ErrorRate]:
    """Per device (and per test id when ``per_test``): infrastructure errors / tries in the last ``runs`` runs."""
    with _session(db) as s:
        recent = select(Run.id).order_by(Run.id.desc()).limit(runs).scalar_subquery()
        released = _released(s)
        counts: dict[tuple[str, str | None], list[int]] = defaultdict(lambda: [0, 0])

        def add(device: str | None, test_id: str, when: datetime, infra: bool) -> None:
            if not device or device == "orchestrator" or (device in released and when <= released[device]):
                return
            c = counts[(device, test_id if per_test else None)]
            c[0] += int(infra)
            c[1] += 1

        for device, test_id, when, kind in s.execute(
                select(Result.device, Result.test_id, Result.recorded_at, Result.error_kind)
                .where(Result.run_id.in_(recent))):
            add(device, test_id, when, kind is ErrorKind.INFRASTRUCTURE)
        for device, test_id, when in s.execute(
                select(Attempt.device, Attempt.test_id, Attempt.recorded_at)
                .where(Attempt.run_id.in_(recent), Attempt.error_kind == ErrorKind.INFRASTRUCTURE)):
            add(device, test_id, when, True)
    return [ErrorRate(d, t, e, n) for (d, t), (e, n) in sorted(counts.items(), key=lambda kv: (kv[0][0],
                                                                                            kv[0][1] or ""))]


def _session(db: Engine | Session) -> AbstractContextManager[Session]:
    return nullcontext(db) if isinstance(db, Session) else Session(db)


def active(db: Engine | Session) -> dict[str, DeviceQuarantine]:
    """Device id -> its open quarantine."""
    with _session(db) as s:
        rows = s.scalars(select(DeviceQuarantine).where(DeviceQuarantine.released_at.is_(None))).all()
        return {q.device_id: q for q in rows}


def update_quarantine(engine: Engine, *, runs: int = RECENT_RUNS, threshold: float = THRESHOLD,
                      min_tries: int = MIN_TRIES) -> list[DeviceQuarantine]:
    """Quarantine every device above the threshold that is not already; returns the new quarantines."""
    new = []
    with write_session(engine) as s:
        held = set(active(s))
        for r in error_rates(s, runs=runs):
            if r.device in held or r.tries < min_tries or r.rate <= threshold:
                continue
            q = DeviceQuarantine(device_id=r.device, since=utcnow(), error_rate=r.rate,
                                 reason=f"{r.infra_errors} of its last {r.tries} tries failed for infrastructure "
                                        f"reasons ({r.rate:.0%} > {threshold:.0%}); a passing health check "
                                        f"(edgefarm devices check) releases it")
            s.add(q)
            new.append(q)
    return new


def quarantine(engine: Engine, device_id: str, reason: str) -> DeviceQuarantine | None:
    """Quarantine ``device_id`` now with ``reason`` (a configuration problem of the device: one is enough); None
    when it is already quarantined (its first reason stands)."""
    with write_session(engine) as s:
        if device_id in active(s):
            return None
        q = DeviceQuarantine(device_id=device_id, since=utcnow(), error_rate=1.0,
                             reason=f"{reason[:1800]}; a passing health check (edgefarm devices check) releases it")
        s.add(q)
    return q


def release(engine: Engine, device_ids: Iterable[str], health_id: int | None) -> list[str]:
    """A passing health check releases the devices' quarantines; returns those released."""
    ids = list(device_ids)
    if not ids:
        return []
    with write_session(engine) as s:
        open_ = list(s.scalars(select(DeviceQuarantine.device_id).where(
            DeviceQuarantine.device_id.in_(ids), DeviceQuarantine.released_at.is_(None))))
        s.execute(update(DeviceQuarantine).where(DeviceQuarantine.device_id.in_(ids),
                                                 DeviceQuarantine.released_at.is_(None))
                  .values(released_at=utcnow(), released_by=health_id))
    return open_
