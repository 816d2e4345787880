"""The runs the farm recorded, newest first, each with its rows per status (``edgefarm runs``): one query, typed rows.
A row here is a (model, precision, platform, job toolchain, variant) of the run, counted once under its worst
stage status (fail, error, waived, skipped, not applicable, pass), as the pages count rows."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from edgefarm.results.models import BringupRung, Result, ResultStatus, Run, RunWorker
from edgellm.errors import ConfigurationError

# worst first: a row is counted under the worst status any of its stages had
STATUS_ORDER = (ResultStatus.FAIL, ResultStatus.ERROR, ResultStatus.WAIVED, ResultStatus.SKIPPED,
                ResultStatus.NOT_APPLICABLE, ResultStatus.PASS)
MAX_LAST = 100_000


@dataclass(frozen=True)
class RunListing:
    id: int
    kind: str
    status: str
    trigger: str
    started_at: datetime
    finished_at: datetime | None
    published: bool
    rows: dict[str, int] = field(default_factory=dict)  # status -> rows of the run with that (worst) status
    rungs: int = 0  # a bring-up's rungs recorded
    flow_run_id: str | None = None  # the Prefect flow run that orchestrated it

    @property
    def duration_s(self) -> float | None:
        if self.finished_at is None:
            return None
        return round((self.finished_at - self.started_at).total_seconds(), 1)


def recent_runs(engine: Engine, last: int = 20) -> list[RunListing]:
    """The ``last`` runs, newest first."""
    if isinstance(last, bool) or not isinstance(last, int) or not 1 <= last <= MAX_LAST:
        raise ConfigurationError(f"--last {last!r}: need a number of runs from 1 to {MAX_LAST}")
    with Session(engine) as s:
        runs = list(s.scalars(select(Run).order_by(Run.id.desc()).limit(last)))
        ids = [r.id for r in runs]
        worst: dict[tuple[int, str, str, str, str, str], int] = {}
        rank = {st: i for i, st in enumerate(STATUS_ORDER)}
        for rid, m, p, pl, jt, var, status in s.execute(
                select(Result.run_id, Result.model, Result.precision, Result.platform, Result.job_toolchain,
                       Result.variant, Result.status).where(Result.run_id.in_(ids)).distinct()):
            key = (rid, m, str(p), pl, str(jt), var or "")
            worst[key] = min(worst.get(key, len(STATUS_ORDER)), rank[ResultStatus(status)])
        counts: dict[int, dict[str, int]] = defaultdict(dict)
        for key, r in worst.items():
            name = STATUS_ORDER[r].value
            counts[key[0]][name] = counts[key[0]].get(name, 0) + 1
        rungs = dict(s.execute(select(BringupRung.run_id, func.count()).where(BringupRung.run_id.in_(ids))
                               .group_by(BringupRung.run_id)).all())
        flows = dict(s.execute(select(RunWorker.run_id, func.max(RunWorker.flow_run_id))
                               .where(RunWorker.run_id.in_(ids), RunWorker.role == "orchestrator")
                               .group_by(RunWorker.run_id)).all())
        return [RunListing(id=r.id, kind=str(r.kind), status=r.status.value, trigger=r.trigger,
                           started_at=r.started_at, finished_at=r.finished_at, published=r.published_at is not None,
                           rows={k: counts[r.id][k] for k in sorted(counts[r.id], key=lambda k: rank[ResultStatus(k)])},
                           rungs=int(rungs.get(r.id, 0)), flow_run_id=flows.get(r.id))
                for r in runs]


def orchestrator_flow_run(engine: Engine, run_id: int) -> str | None:
    """The Prefect flow run that orchestrated ``run_id`` (None: not recorded)."""
    with Session(engine) as s:
        return s.scalar(select(func.max(RunWorker.flow_run_id)).where(RunWorker.run_id == run_id,
                                                                      RunWorker.role == "orchestrator"))


@dataclass(frozen=True)
class DispatchedOutcome:
    """What a worker recorded of a stage dispatched to it: where it ran and the stage's outcome (plain JSON)."""

    host: str
    revision: str
    outcome: dict[str, Any]


def dispatched_outcome(engine: Engine, run_id: int, flow_run_id: str) -> DispatchedOutcome | None:
    """The outcome the worker of Prefect flow run ``flow_run_id`` recorded for ``run_id`` (None: none yet)."""
    with Session(engine) as s:
        row = s.scalars(select(RunWorker).where(RunWorker.run_id == run_id,
                                                RunWorker.flow_run_id == flow_run_id)).first()
        if row is None or row.outcome is None:
            return None
        return DispatchedOutcome(row.host, row.revision, dict(row.outcome))
