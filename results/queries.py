"""Read-side questions about the results database, answered as plain dataclasses.

A *row* is one (model, precision, platform). Its *latest run* is the highest run id that has a result for it
(run ids are assigned in start order), kept in the ``row_latest`` table by the recorder.

Verdict of a row in one run, given its required stages (default: infer and accuracy):
  - ``fail``  if any result failed; else ``error`` if any result errored (the run broke, not the model);
  - ``not_applicable`` if every result is not_applicable (the combination is not meant to work);
  - ``pass`` if every required stage has at least one ``pass`` and only pass / waived / not_applicable results
    (a waived result never proves a stage; a skipped one means it was not run);
  - ``incomplete`` otherwise (a required stage missing or skipped).
"""

from __future__ import annotations

import enum
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import Engine, Select, and_, func, literal, select
from sqlalchemy.orm import Session, aliased

from edgellm.errors import ConfigurationError
from edgellm.types import Precision, Stage
from results.models import Metric, MetricBaseline, Result, ResultStatus, RowLatest, Run, RunKind

DEFAULT_REQUIRED: tuple[Stage, ...] = (Stage.INFER, Stage.ACCURACY)
_ACCEPTABLE = (ResultStatus.PASS, ResultStatus.WAIVED, ResultStatus.NOT_APPLICABLE)
_BLOCKING = (ResultStatus.FAIL, ResultStatus.ERROR)
# Worst first: the status shown for a stage that has several test ids.
_SEVERITY = [ResultStatus.FAIL, ResultStatus.ERROR, ResultStatus.SKIPPED, ResultStatus.WAIVED,
             ResultStatus.PASS, ResultStatus.NOT_APPLICABLE]


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    INCOMPLETE = "incomplete"
    NOT_APPLICABLE = "not_applicable"


class Direction(enum.StrEnum):
    HIGHER_IS_BETTER = "higher"
    LOWER_IS_BETTER = "lower"


DEFAULT_DIRECTIONS: dict[str, Direction] = {
    "tokens_per_s": Direction.HIGHER_IS_BETTER,
    "prefill_tokens_per_s": Direction.HIGHER_IS_BETTER,
    "accuracy": Direction.HIGHER_IS_BETTER,
    "ms_per_token": Direction.LOWER_IS_BETTER,
    "time_to_first_token_ms": Direction.LOWER_IS_BETTER,
    "perplexity": Direction.LOWER_IS_BETTER,
    "peak_memory_bytes": Direction.LOWER_IS_BETTER,
}


@dataclass(frozen=True, order=True)
class RowKey:
    model: str
    precision: Precision
    platform: str


@dataclass(frozen=True)
class RowStatus:
    key: RowKey
    run_id: int
    verdict: Verdict
    stages: dict[Stage, ResultStatus]  # worst status per stage
    run_kind: RunKind | None = None
    run_started_at: datetime | None = None
    toolchain: str | None = None  # the toolchain that made the evidence ("a, b" if a run mixed several)
    toolchain_version: str | None = None  # its version where the latest stage that ran ran


@dataclass(frozen=True)
class Regression:
    key: RowKey
    stage: Stage
    test_id: str
    metric: str
    unit: str
    value: float
    baseline: float
    baseline_source: str  # "run <id>" or "stored"
    direction: Direction
    change: float  # relative, positive = worse (0.10 = 10 % worse)


@dataclass
class _Tally:
    counts: dict[Stage, dict[ResultStatus, int]] = field(default_factory=lambda: defaultdict(dict))
    made_by: dict[Stage, tuple[str, str | None]] = field(default_factory=dict)  # stage -> (toolchain, version)

    def add(self, stage: Stage, status: ResultStatus, n: int, toolchain: str | None = None,
            version: str | None = None) -> None:
        self.counts[stage][status] = self.counts[stage].get(status, 0) + n
        if toolchain is not None and (stage not in self.made_by or version is not None):
            self.made_by[stage] = (str(toolchain), version)

    def toolchain(self) -> tuple[str | None, str | None]:
        """The toolchain(s) of the row, and the version recorded by its last stage (pipeline order) that ran."""
        names = sorted({tc for tc, _ in self.made_by.values()})
        versions = [v for stage in sorted(self.made_by, key=list(Stage).index)
                    if (v := self.made_by[stage][1]) is not None]
        return (", ".join(names) or None), (versions[-1] if versions else None)

    def verdict(self, required: Sequence[Stage]) -> Verdict:
        seen = {st for per in self.counts.values() for st in per}
        if ResultStatus.FAIL in seen:
            return Verdict.FAIL
        if ResultStatus.ERROR in seen:
            return Verdict.ERROR
        if seen == {ResultStatus.NOT_APPLICABLE}:
            return Verdict.NOT_APPLICABLE
        for stage in required:
            per = self.counts.get(stage, {})
            if not per.get(ResultStatus.PASS) or any(st not in _ACCEPTABLE for st in per):
                return Verdict.INCOMPLETE
        return Verdict.PASS

    def worst(self) -> dict[Stage, ResultStatus]:
        return {stage: min(per, key=_SEVERITY.index) for stage, per in sorted(self.counts.items(),
                key=lambda kv: list(Stage).index(kv[0]))}


def _required(required: Iterable[Stage | str]) -> tuple[Stage, ...]:
    stages = tuple(Stage.parse(s) for s in required)
    if not stages:
        raise ConfigurationError(f"required stages must not be empty; valid stages: {', '.join(Stage)}")
    return stages


def _session(db: Engine | Session) -> AbstractContextManager[Session]:
    """A new session for an engine; a caller's session is used as is (and left open)."""
    return nullcontext(db) if isinstance(db, Session) else Session(db)


def _row_filter(model: str | None, precision: Precision | str | None, platform: str | None) -> list[Any]:
    where: list[Any] = []
    if model is not None:
        where.append(RowLatest.model == model)
    if precision is not None:
        where.append(RowLatest.precision == Precision.parse(precision))
    if platform is not None:
        where.append(RowLatest.platform == platform)
    return where


def latest_status(
    db: Engine | Session,
    *,
    model: str | None = None,
    precision: Precision | str | None = None,
    platform: str | None = None,
    required: Iterable[Stage | str] = DEFAULT_REQUIRED,
) -> list[RowStatus]:
    """Every row's stage statuses and verdict in its latest run, sorted by row."""
    req = _required(required)
    latest = (
        select(RowLatest.model, RowLatest.precision, RowLatest.platform, RowLatest.run_id, Result.stage,
               Result.status, Result.toolchain, Result.toolchain_version, func.count())
        .join(Result, and_(Result.model == RowLatest.model, Result.precision == RowLatest.precision,
                           Result.platform == RowLatest.platform, Result.run_id == RowLatest.run_id))
        .where(*_row_filter(model, precision, platform))
        .group_by(RowLatest.model, RowLatest.precision, RowLatest.platform, RowLatest.run_id, Result.stage,
                  Result.status, Result.toolchain, Result.toolchain_version)
    )
    tallies: dict[tuple[RowKey, int], _Tally] = defaultdict(_Tally)
    with _session(db) as s:
        for m, p, pl, run_id, stage, status, tc, version, n in s.execute(latest):
            tallies[(RowKey(m, p, pl), run_id)].add(stage, status, n, tc, version)
    return [RowStatus(key, run_id, t.verdict(req), t.worst(), None, None, *t.toolchain())
            for (key, run_id), t in sorted(tallies.items())]


def passing_rows(
    db: Engine | Session,
    *,
    required: Iterable[Stage | str] = DEFAULT_REQUIRED,
    platform: str | None = None,
) -> list[RowKey]:
    """The rows whose verdict in their latest run is ``pass`` (computed in SQL; see the module doc)."""
    stmt = passing_rows_stmt(_required(required), platform)
    with _session(db) as s:
        return [RowKey(m, p, pl) for m, p, pl in s.execute(stmt)]


def passing_rows_stmt(req: Sequence[Stage], platform: str | None = None) -> Select[Any]:
    """The SQL of :func:`passing_rows` (one index range scan per row's latest run; see benchmarks/bench_db.py)."""

    def n(cond: Any) -> Any:
        return func.count().filter(cond)

    having = [
        n(Result.status.in_(_BLOCKING)) == 0,
        n(Result.status != ResultStatus.NOT_APPLICABLE) > 0,
    ]
    for stage in req:
        having.append(n(and_(Result.stage == stage, Result.status == ResultStatus.PASS)) > 0)
        having.append(n(and_(Result.stage == stage, Result.status.not_in(_ACCEPTABLE))) == 0)
    stmt = (
        select(RowLatest.model, RowLatest.precision, RowLatest.platform)
        .join(Result, and_(Result.model == RowLatest.model, Result.precision == RowLatest.precision,
                           Result.platform == RowLatest.platform, Result.run_id == RowLatest.run_id))
        .where(*_row_filter(None, None, platform))
        .group_by(RowLatest.model, RowLatest.precision, RowLatest.platform)
        .having(and_(*having))
        .order_by(RowLatest.model, RowLatest.precision, RowLatest.platform)
    )
    return stmt


def row_history(
    db: Engine | Session,
    model: str,
    precision: Precision | str,
    platform: str,
    *,
    required: Iterable[Stage | str] = DEFAULT_REQUIRED,
) -> list[RowStatus]:
    """The row's verdict in every run that has a result for it, oldest first."""
    req = _required(required)
    key = RowKey(model, Precision.parse(precision), platform)
    stmt = (
        select(Result.run_id, Run.kind, Run.started_at, Result.stage, Result.status, Result.toolchain,
               Result.toolchain_version, func.count())
        .join(Run, Run.id == Result.run_id)
        .where(Result.model == key.model, Result.precision == key.precision, Result.platform == key.platform)
        .group_by(Result.run_id, Run.kind, Run.started_at, Result.stage, Result.status, Result.toolchain,
                  Result.toolchain_version)
    )
    tallies: dict[int, _Tally] = defaultdict(_Tally)
    runs: dict[int, tuple[RunKind, datetime]] = {}
    with _session(db) as s:
        for run_id, kind, started, stage, status, tc, version, n in s.execute(stmt):
            tallies[run_id].add(stage, status, n, tc, version)
            runs[run_id] = (kind, started)
    return [RowStatus(key, rid, tallies[rid].verdict(req), tallies[rid].worst(), *runs[rid],
                      *tallies[rid].toolchain()) for rid in sorted(runs)]


def regressions(
    db: Engine | Session,
    run_id: int,
    *,
    against: Literal["previous", "stored"] | int = "previous",
    threshold: float = 0.05,
    directions: dict[str, Direction] | None = None,
) -> list[Regression]:
    """Metrics of ``run_id`` worse than their baseline by more than ``threshold`` (relative).

    Baseline: ``"previous"`` = the same metric of the same (row, stage, test id) in the most recent earlier run
    where that result passed; an int = that run; ``"stored"`` = the metric_baselines table. Metrics whose name has
    no known direction are not judged (pass ``directions`` to add some).
    """
    if threshold < 0:
        raise ConfigurationError(f"bad regression threshold {threshold!r}: need >= 0 (0.05 = 5 %)")
    dirs = DEFAULT_DIRECTIONS | (directions or {})
    cols = (Result.model, Result.precision, Result.platform, Result.stage, Result.test_id, Metric.name)
    current = (
        select(*cols, Metric.value, Metric.unit)
        .join(Metric, Metric.result_id == Result.id)
        .where(Result.run_id == run_id, Metric.name.in_(list(dirs)))
    )
    base: dict[tuple[Any, ...], tuple[float, str]] = {}
    with _session(db) as s:
        cur = {tuple(r[:6]): (r[6], r[7]) for r in s.execute(current)}
        if not cur:
            return []
        if against == "stored":
            b = MetricBaseline
            stmt = select(b.model, b.precision, b.platform, b.stage, b.test_id, b.name, b.value, literal("stored"))
            base = {tuple(r[:6]): (r[6], r[7]) for r in s.execute(stmt.where(b.name.in_(list(dirs))))}
        else:
            mine = aliased(Result)
            ranked = (
                select(*cols, Metric.value, Result.run_id,
                       func.row_number().over(partition_by=cols, order_by=Result.run_id.desc()).label("rn"))
                .join(Metric, Metric.result_id == Result.id)
                .where(Result.status == ResultStatus.PASS, Metric.name.in_(list(dirs)))
                .where(Result.run_id == against if isinstance(against, int) else Result.run_id < run_id)
                .where(
                    select(mine.id).where(mine.run_id == run_id, mine.model == Result.model,
                                          mine.precision == Result.precision, mine.platform == Result.platform,
                                          mine.stage == Result.stage, mine.test_id == Result.test_id).exists()
                )
                .subquery()
            )
            stmt = select(*ranked.c[:7], ranked.c.run_id).where(ranked.c.rn == 1)
            base = {tuple(r[:6]): (r[6], f"run {r[7]}") for r in s.execute(stmt)}
    found = []
    for k, (value, unit) in sorted(cur.items()):
        if k not in base:
            continue
        baseline, source = base[k]
        direction = dirs[k[5]]
        change = _worse_by(value, baseline, direction)
        if change > threshold:
            found.append(Regression(RowKey(*k[:3]), k[3], k[4], k[5], unit, value, baseline, source, direction,
                                    change))
    return found


def _worse_by(value: float, baseline: float, direction: Direction) -> float:
    delta = baseline - value if direction is Direction.HIGHER_IS_BETTER else value - baseline
    if baseline == 0:
        return float("inf") if delta > 0 else 0.0
    return delta / abs(baseline)
