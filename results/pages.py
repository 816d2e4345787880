"""What the published pages read (``pages/docs*.py``): each row's latest evidence with its results and key metrics,
the trend points, a run's record with its rungs and results, and the device environments of the platforms; typed
rows only (the pages receive rows and write files; they build no SQL).

Rows and their support statuses come from ``results.support`` (``latest_status_of_runs`` and ``supports_of``, as
:func:`results.support.row_supports`), the one place that decides them for every page.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import func, select

from edgefarm.results.db import Db, reading
from edgefarm.results.models import BringupRung, Environment, Metric, Result, Run, RunKind
from edgefarm.results.queries import ResultEvidence, RowKey, RowStatus, name_reader, raw, result_evidence
from edgefarm.results.support import (
    EvidenceKey,
    Support,
    add_reason,
    evidence_key,
    latest_runs,
    latest_status_of_runs,
    of_latest,
    supports_of,
)


@dataclass(frozen=True)
class ResultLine:
    """One result of a row, as a page shows it (names as plain strings)."""

    stage: str
    status: str
    reason: str | None
    device: str | None


@dataclass(frozen=True)
class MatrixEvidence:
    """A row's status and support in its latest run, with that run's start, the row's results there and their
    metrics (name -> value; a name recorded twice: the last read wins)."""

    status: RowStatus
    support: Support
    run_started_at: datetime
    results: tuple[ResultLine, ...]
    metrics: Mapping[str, float] = field(default_factory=dict)


def matrix_evidence(db: Db, *, kinds: Collection[RunKind | str] | None, run_id: int | None = None
                    ) -> list[MatrixEvidence]:
    """Each row's latest evidence in the runs of ``kinds`` (or in the one run ``run_id``), sorted by row: a fixed
    number of statements whatever the number of rows (the kept latest-run pointers joined with those runs' results;
    the failing rows' streaks: one statement per 200 rows per window of runs, ``results.support``)."""
    latest = latest_runs(kinds=kinds, run_id=run_id)
    prec, job_tool = name_reader(Result.precision), name_reader(Result.job_toolchain)
    row = (Result.model, raw(Result.precision), Result.platform, raw(Result.job_toolchain), Result.variant,
           Result.run_id, Result.chosen_versions)
    lines: dict[EvidenceKey, list[ResultLine]] = defaultdict(list)
    metrics: dict[EvidenceKey, dict[str, float]] = defaultdict(dict)
    reasons: dict[EvidenceKey, dict[str, str]] = defaultdict(dict)
    with reading(db) as s:
        statuses = latest_status_of_runs(s, kinds=kinds, run_id=run_id, latest=latest)
        runs = {r.id: r for r in s.scalars(select(Run).where(Run.id.in_({st.run_id for st in statuses})))}
        last = None
        for rid, m, p, pl, jt, var, run, chosen, stage, status, reason, device, name, value in s.execute(
                select(Result.id, *row, raw(Result.stage), Result.status, Result.reason, Result.device, Metric.name,
                       Metric.value)
                .join(latest, of_latest(latest)).outerjoin(Metric, Metric.result_id == Result.id)
                .order_by(Result.id, Metric.id)):  # names raw (stored strings), read once; a result per metric
            if rid != last:
                last, key = rid, (RowKey(m, prec(p), pl, job_tool(jt), var), run, chosen or None)
                lines[key].append(ResultLine(stage, status.value, reason, device))
                add_reason(reasons[key], stage, status, reason)
            if name is not None:  # a name recorded twice: the last (by result, then metric) wins
                metrics[key][name] = value
        supports = supports_of(s, statuses, reasons)
    return [MatrixEvidence(st, support, runs[st.run_id].started_at, tuple(lines.get(evidence_key(st), ())),
                           metrics.get(evidence_key(st), {})) for st, support in zip(statuses, supports, strict=True)]


class TrendRow(NamedTuple):
    """A trend metric's value in a published nightly run."""

    run_id: int
    started_at: datetime
    model: str
    precision: str
    platform: str
    job_toolchain: str
    metric: str
    value: float


def trend_rows(db: Db, metrics: Iterable[str]) -> list[TrendRow]:
    """The values of ``metrics`` in the published nightly runs."""
    stmt = (select(Run.id, Run.started_at, Result.model, Result.precision, Result.platform, Result.job_toolchain,
                   Metric.name, Metric.value)
            .join(Result, Result.run_id == Run.id).join(Metric, Metric.result_id == Result.id)
            .where(Run.kind == RunKind.NIGHTLY, Run.published_at.is_not(None), Metric.name.in_(list(metrics))))
    with reading(db) as s:
        return [TrendRow(r, t, m, p.value, pl, str(tc), n, v) for r, t, m, p, pl, tc, n, v in s.execute(stmt)]


@dataclass(frozen=True)
class RungLine:
    position: int
    name: str
    status: str
    reason: str | None
    duration_s: float | None


@dataclass(frozen=True)
class RunRecord:
    """A run as its page shows it; ``report``: its bring-up report directory, when it has one."""

    id: int
    kind: str
    status: str
    trigger: str
    code_version: str
    started_at: datetime
    finished_at: datetime | None
    report: str | None
    rungs: tuple[RungLine, ...]


@dataclass(frozen=True)
class RunResult:
    """One result of a run, in the order recorded, with its metrics and artifacts."""

    id: int
    model: str
    precision: str
    platform: str
    stage: str
    status: str
    device: str | None
    toolchain: str
    toolchain_version: str | None
    job_toolchain: str
    chosen_versions: str | None
    variant: str
    reason: str | None
    duration_s: float | None
    evidence: ResultEvidence


def run_record(db: Db, run_id: int) -> RunRecord:
    """The run ``run_id`` (it must exist) with its bring-up rungs in order."""
    with reading(db) as s:
        run = s.get(Run, run_id)
        assert run is not None
        rungs = tuple(RungLine(g.position, g.name, g.status, g.reason, g.duration_s)
                      for g in s.scalars(select(BringupRung).where(BringupRung.run_id == run_id)
                                         .order_by(BringupRung.position)))
        return RunRecord(run.id, run.kind.value, run.status.value, run.trigger, run.code_version, run.started_at,
                         run.finished_at, run.report, rungs)


def run_results(db: Db, run_id: int) -> list[RunResult]:
    """Every result of the run ``run_id`` in the order recorded, with its metrics and artifacts
    (:func:`results.queries.result_evidence`)."""
    with reading(db) as s:
        evidence = result_evidence(s, [run_id])
        return [RunResult(r.id, r.model, r.precision.value, r.platform, r.stage.value, r.status.value, r.device,
                          str(r.toolchain), r.toolchain_version, str(r.job_toolchain), r.chosen_versions, r.variant,
                          r.reason, r.duration_s, evidence.get(r.id, ResultEvidence()))
                for r in s.scalars(select(Result).where(Result.run_id == run_id).order_by(Result.id))]


def device_environments(db: Db) -> dict[str, tuple[int, dict[str, Any]]]:
    """Per platform, the latest device environment a published run recorded there, with that run's id."""
    stmt = (select(Result.platform, Result.environment, func.max(Result.run_id))
            .join(Run, Run.id == Result.run_id)
            .where(Result.environment.is_not(None), Run.published_at.is_not(None))
            .group_by(Result.platform, Result.environment))
    found: dict[str, list[tuple[int, str]]] = defaultdict(list)
    out = {}
    with reading(db) as s:
        for platform, digest, run_id in s.execute(stmt):
            if digest is not None:
                found[platform].append((int(run_id), digest))
        for platform, envs in found.items():
            for run_id, digest in sorted(envs, reverse=True):
                env = s.get(Environment, digest)
                if env is not None and isinstance(env.data, dict) and env.data.get("where") == "device":
                    out[platform] = (run_id, env.data)
                    break
    return out
