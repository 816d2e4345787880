"""What ``edgefarm compare`` reads (``pages/compare.py`` resolves two sides and compares them): published results with
their makers, statuses, reasons and metrics, the runs of a toolchain version or a commit, and the published runs to
name when a side names nothing; typed rows only."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import or_, select

from edgefarm.results.db import Db, reading
from edgefarm.results.models import Metric, Result, ResultStatus, Run, RunKind


class PublishedResult(NamedTuple):
    """One result of a published run (its row, the versions its run chose, what made it); unless read with
    ``facts_only``, its test, status, reason and stage and one of its metrics (None: it has none), one tuple per
    metric. Names come as the columns read them (``precision`` a Precision, toolchains their names)."""

    run_id: int
    model: str
    precision: Any
    platform: str
    job_toolchain: Any
    variant: str
    chosen_versions: str | None
    toolchain: Any
    toolchain_version: str | None
    test_id: str | None = None
    status: ResultStatus | None = None
    reason: str | None = None
    stage: Any = None
    metric: str | None = None
    value: float | None = None
    unit: str | None = None


def published_results(db: Db, *, run_ids: Iterable[int] | None = None, models: Iterable[str] | None = None,
                      before_run: int | None = None, metrics: Iterable[str] | None = None, passed_only: bool = False,
                      facts_only: bool = False) -> list[PublishedResult]:
    """The results of published runs among ``run_ids``, of ``models``, of runs before ``before_run``, with a metric
    of ``metrics``, passed (each filter: None, no filter); ``facts_only``: each distinct (row, run, chosen versions,
    maker) once, no metrics or reasons."""
    where: list[Any] = []
    if run_ids is not None:
        where.append(Result.run_id.in_(list(run_ids)))
    if models is not None:
        where.append(Result.model.in_(list(models)))
    if before_run is not None:
        where.append(Result.run_id < before_run)
    if metrics is not None:
        where.append(Metric.name.in_(list(metrics)))
    if passed_only:
        where.append(Result.status == ResultStatus.PASS)
    row_cols = [Result.run_id, Result.model, Result.precision, Result.platform, Result.job_toolchain,
                Result.variant, Result.chosen_versions, Result.toolchain, Result.toolchain_version]
    if facts_only:
        stmt = select(*row_cols).distinct()
    else:
        stmt = (select(*row_cols, Result.test_id, Result.status, Result.reason, Result.stage, Metric.name,
                       Metric.value, Metric.unit).outerjoin(Metric, Metric.result_id == Result.id))
    stmt = stmt.join(Run, Run.id == Result.run_id).where(Run.published_at.is_not(None), *where)
    with reading(db) as s:
        return [PublishedResult(*row) for row in s.execute(stmt)]


def published_run_ids(db: Db, limit: int = 20) -> list[int]:
    """The ``limit`` latest published runs, newest first."""
    with reading(db) as s:
        return list(s.scalars(select(Run.id).where(Run.published_at.is_not(None)).order_by(Run.id.desc())
                              .limit(limit)))


@dataclass(frozen=True)
class RecordedVersions:
    """What published results say of one toolchain's versions: those its results were made with, and the chosen
    versions (``"name==version, ..."``) of the runs that named it, each distinct, unparsed."""

    made: tuple[str | None, ...]
    chosen: tuple[str | None, ...]


def recorded_versions(db: Db, toolchain: str) -> RecordedVersions:
    with reading(db) as s:
        made = s.scalars(select(Result.toolchain_version).distinct().join(Run, Run.id == Result.run_id)
                         .where(Run.published_at.is_not(None), Result.toolchain == toolchain,
                                Result.toolchain_version.is_not(None)))
        chosen = s.scalars(select(Result.chosen_versions).distinct().join(Run, Run.id == Result.run_id)
                           .where(Run.published_at.is_not(None), Result.chosen_versions.contains(f"{toolchain}==")))
        return RecordedVersions(tuple(made), tuple(chosen))


def runs_with_version(db: Db, toolchain: str, version: str) -> list[int]:
    """The published runs with a result made by ``toolchain`` at ``version`` or whose chosen versions name it, sorted
    (a superset: the chosen versions are matched as text)."""
    stmt = (select(Result.run_id).distinct().join(Run, Run.id == Result.run_id)
            .where(Run.published_at.is_not(None),
                   or_((Result.toolchain == toolchain) & (Result.toolchain_version == version),
                       Result.chosen_versions.contains(f"{toolchain}=={version}"))))
    with reading(db) as s:
        return sorted(s.scalars(stmt))


@dataclass(frozen=True)
class RunInfo:
    id: int
    kind: str
    status: str
    code_version: str
    published: bool


def run_info(db: Db, run_id: int) -> RunInfo | None:
    """The run ``run_id`` (None: no such run)."""
    with reading(db) as s:
        run = s.get(Run, run_id)
        if run is None:
            return None
        return RunInfo(run.id, str(run.kind), run.status.value, run.code_version, run.published_at is not None)


def latest_nightly_of_commit(db: Db, prefix: str) -> int | None:
    """The latest published nightly run of a commit whose id starts with ``prefix``."""
    stmt = (select(Run.id).where(Run.published_at.is_not(None), Run.kind == RunKind.NIGHTLY,
                                 Run.code_version.startswith(prefix, autoescape=True))
            .order_by(Run.id.desc()).limit(1))
    with reading(db) as s:
        return s.scalars(stmt).first()


def recent_nightly_commits(db: Db, limit: int = 200) -> list[tuple[str, int]]:
    """(commit, run id) of the ``limit`` latest published nightly runs, newest first."""
    with reading(db) as s:
        return [(cv, rid) for cv, rid in s.execute(
            select(Run.code_version, Run.id).where(Run.published_at.is_not(None), Run.kind == RunKind.NIGHTLY)
            .order_by(Run.id.desc()).limit(limit))]
