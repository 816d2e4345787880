"""Read-side questions about the results database, answered as plain dataclasses.

A *row* is one (model, precision, platform, toolchain, variant), the toolchain being the one its jobs ran with
(``Result.job_toolchain``): a platform that runs two toolchains side by side has two rows per (model, precision);
the variant is ``stages.variant.variant_key`` (KV cache, LM head, draft, LoRA...; '' the default): two variants of
one model and precision are two rows, never one cell.
Its *latest run* is the highest published run id that has a result for it (run ids are assigned in start order; a
run is published when it finishes, never while it runs or when it is reaped), kept in the ``row_latest`` table by
the recorder. ``RowStatus.toolchain`` is another thing: what made the evidence (the last stage that ran).

Verdict of a row in one run, given its required stages (default: infer and accuracy):
  - ``fail``  if any result failed; else ``error`` if any result errored (the run broke, not the model);
  - ``not_applicable`` if every result is not_applicable (the combination is not meant to work);
  - ``pass`` if every required stage has at least one ``pass`` and only pass / waived / not_applicable results
    (a waived result never proves a stage; a skipped one means it was not run);
  - ``incomplete`` otherwise (a required stage missing or skipped), and always when a result ran on test stand-ins
    of a toolchain's tools (``Result.standin``): a stand-in is never evidence.

A row is *supported* (the docs' mark, the count ``edgefarm docs`` prints) when its verdict in its latest run, judged
with :data:`SUPPORT_REQUIRED`, is ``pass``: :func:`supported` is that definition, and the docs ask it.

A run that compared toolchain versions (a matrix's ``toolchain_versions:``) has results of one row per chosen
version (``Result.chosen_versions``): :func:`latest_status` and :func:`row_history` give one status per version, side
by side; :func:`passing_rows` judges the row as a whole (any version failing blocks it). Two toolchains of one
platform are two rows: each judged alone, everywhere.
"""

from __future__ import annotations

import enum
import gc
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import Engine, Select, String, and_, case, cast, distinct, func, select, type_coerce
from sqlalchemy.orm import Session

from edgefarm.results.db import reading
from edgefarm.results.models import (
    ArtifactRecord,
    Metric,
    Result,
    ResultStatus,
    RowLatest,
    RowTally,
    Run,
    RunKind,
    parse_name,
)
from edgefarm.stages import Stage
from edgellm.errors import ConfigurationError
from edgellm.types import Precision

DEFAULT_REQUIRED: tuple[Stage, ...] = (Stage.INFER, Stage.ACCURACY)
SUPPORT_REQUIRED: tuple[Stage, ...] = DEFAULT_REQUIRED  # the stages a supported row passed (see supported)
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


_STAGE_POSITION = {str(stage): i for i, stage in enumerate(Stage)}


def _stage_order(stage: str) -> tuple[int, str]:
    """Pipeline order; a stage this farm does not know (a newer farm recorded it) after the known ones."""
    i = _STAGE_POSITION.get(str(stage))
    return (i, "") if i is not None else (len(_STAGE_POSITION), str(stage))


def supported(verdict: Verdict | str) -> bool:
    """Whether a row counts as supported, given its verdict in its latest run judged with
    :data:`SUPPORT_REQUIRED` (or the status shown for it): only ``pass`` does, so export-only evidence, a waived
    or skipped required stage and stand-in tools never do. The one definition; the docs ask it."""
    return str(verdict) == Verdict.PASS.value


@dataclass(frozen=True, order=True)
class RowKey:
    model: str
    precision: Precision
    platform: str
    toolchain: str  # the toolchain the row's jobs ran with (Result.job_toolchain), not the maker of each stage
    variant: str = ""  # stages.variant.variant_key ('' the default variant)


@dataclass(frozen=True)
class RowStatus:
    key: RowKey
    run_id: int
    verdict: Verdict
    stages: dict[Stage, ResultStatus]  # worst status per stage
    run_kind: RunKind | None = None
    run_started_at: datetime | None = None
    toolchain: str | None = None  # the toolchain that made the evidence: of the last stage that ran
    toolchain_version: str | None = None  # its version where that stage ran
    standin: bool = False  # some result ran on test stand-ins: never evidence (verdict at best incomplete)
    route: str | None = None  # how its engine was made (onnx | direct), when its toolchain has routes
    chosen_versions: str | None = None  # the toolchain versions its run chose ("name==version, ..."); None: pinned


@dataclass
class Tally:
    """A row's results counted by stage and status (and who made them): what its verdict is judged from."""

    counts: dict[Stage, dict[ResultStatus, int]] = field(default_factory=lambda: defaultdict(dict))
    made_by: dict[Stage, tuple[str, str | None]] = field(default_factory=dict)  # stage -> (toolchain, version)
    standin: bool = False
    routes: set[str] = field(default_factory=set)

    def add(self, stage: Stage, status: ResultStatus, n: int, toolchain: str | None = None,
            version: str | None = None, standin: bool = False, route: Any = None) -> None:
        self.standin = self.standin or bool(standin)
        if route is not None:
            self.routes.add(str(getattr(route, "value", route)))
        self.counts[stage][status] = self.counts[stage].get(status, 0) + n
        if toolchain is not None and (stage not in self.made_by or version is not None):
            self.made_by[stage] = (str(toolchain), version)

    def toolchain(self) -> tuple[str | None, str | None]:
        """The toolchain that made the row's last stage (pipeline order) that ran, and its version there: the one
        the evidence is about (a quantized row's quantize stage, made by the quantizer's toolchain, shows on the
        evidence page). When no stage ran: the toolchain(s) named, no version."""
        ran = [stage for stage in sorted(self.made_by, key=_stage_order) if self.made_by[stage][1] is not None]
        if ran:
            return self.made_by[ran[-1]]
        return (", ".join(sorted({tc for tc, _ in self.made_by.values()})) or None), None

    def marks(self) -> tuple[bool, str | None]:
        return self.standin, ", ".join(sorted(self.routes)) or None

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
        return Verdict.INCOMPLETE if self.standin else Verdict.PASS

    def worst(self) -> dict[Stage, ResultStatus]:
        return {stage: min(per, key=_SEVERITY.index) for stage, per in sorted(self.counts.items(),
                key=lambda kv: _stage_order(kv[0]))}


def _required(required: Iterable[Stage | str]) -> tuple[Stage, ...]:
    stages = tuple(parse_name("stage", s) for s in required)
    if not stages:
        raise ConfigurationError(f"required stages must not be empty; valid stages: {', '.join(Stage)}")
    return stages


def _session(db: Engine | Session) -> AbstractContextManager[Session]:
    """A new session for an engine; a caller's session is used as is (and left open)."""
    return reading(db)


def _row_filter(model: str | None, precision: Precision | str | None, platform: str | None,
                toolchain: str | None, variant: str | None = None, *, table: Any = RowLatest) -> list[Any]:
    """Conditions on a row-keyed table (``row_latest`` or ``row_tallies``) for the given key parts."""
    where: list[Any] = []
    if variant is not None:
        where.append(table.variant == variant)
    if model is not None:
        where.append(table.model == model)
    if precision is not None:
        where.append(table.precision == parse_name("precision", precision))
    if platform is not None:
        where.append(table.platform == platform)
    if toolchain is not None:
        where.append(table.toolchain == parse_name("toolchain", toolchain))
    return where


def _latest_results() -> Any:
    """The join of a row's latest-run pointer with that row's results in that run."""
    return and_(Result.model == RowLatest.model, Result.precision == RowLatest.precision,
                Result.platform == RowLatest.platform, Result.job_toolchain == RowLatest.toolchain,
                Result.variant == RowLatest.variant, Result.run_id == RowLatest.run_id)


def latest_status(
    db: Engine | Session,
    *,
    model: str | None = None,
    precision: Precision | str | None = None,
    platform: str | None = None,
    toolchain: str | None = None,
    required: Iterable[Stage | str] = DEFAULT_REQUIRED,
) -> list[RowStatus]:
    """Every row's stage statuses and verdict in its latest run, sorted by row (``toolchain``: rows whose jobs ran
    with it)."""
    req = _required(required)
    read = {name: name_reader(col) for name, col in (("precision", RowTally.precision),
                                                     ("toolchain", Result.toolchain), ("stage", Result.stage))}
    judged: dict[str, tuple[Any, ...]] = {}  # packed results -> (verdict, worst, toolchain, version, standin, route)
    out = []
    # the collector paused: the tens of thousands of small acyclic objects read and made here would otherwise set off
    # its full passes over the whole heap (most of the time this took)
    with _collector_paused(), _session(db) as s:
        rows = _plain_rows(s, latest_status_stmt(model, precision, platform, toolchain))
        rows.sort(key=itemgetter(0, 1, 2, 3, 4, 5, 6))  # by the stored names: a name's stored form is its str
        read_precision, read_toolchain = read["precision"], read["toolchain"]
        for m, p, pl, job_tc, var, run_id, chosen, packed in rows:
            j = judged.get(packed)
            if j is None:
                t = unpack(packed, read["stage"], read_toolchain)
                j = judged[packed] = (t.verdict(req), t.worst(), *t.toolchain(), *t.marks())
            key = _row_key(m, read_precision(p), pl, read_toolchain(job_tc), var)
            out.append(_row_status(key, run_id, j, chosen or None))
    return out


def _plain_rows(s: Session, stmt: Select[Any]) -> list[tuple[Any, ...]]:
    """A statement's rows as the database driver's plain tuples, fetched without SQLAlchemy's ``Row`` per row (a bulk
    read of tens of thousands): only for statements whose columns need no result processing (names read raw)."""
    result = s.connection().execute(stmt)
    try:
        return list(result.cursor.fetchall())
    finally:
        result.close()


_new, _set = object.__new__, object.__setattr__


def _row_key(model: str, precision: Precision, platform: str, toolchain: str, variant: str) -> RowKey:
    """``RowKey(...)`` without its ``__init__``'s frozen setattr per field: a bulk read makes tens of thousands
    (tests/test_results_row_index.py checks it equals the constructor's, field by field)."""
    obj = _new(RowKey)
    _set(obj, "__dict__", {"model": model, "precision": precision, "platform": platform, "toolchain": toolchain,
                           "variant": variant})
    return obj


def _row_status(key: RowKey, run_id: int, judged: tuple[Any, ...], chosen_versions: str | None) -> RowStatus:
    """``RowStatus(...)`` of a row's latest run as :func:`latest_status` judged it (verdict, worst per stage,
    toolchain, version, stand-in, route), made like :func:`_row_key`; its stages a dict of its own."""
    verdict, worst, tc, version, standin, route = judged
    obj = _new(RowStatus)
    _set(obj, "__dict__", {"key": key, "run_id": run_id, "verdict": verdict, "stages": dict(worst),
                           "run_kind": None, "run_started_at": None, "toolchain": tc, "toolchain_version": version,
                           "standin": standin, "route": route, "chosen_versions": chosen_versions})
    return obj


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for a block that only makes acyclic objects (back as it was after)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


_STATUS = {s.value: s for s in ResultStatus}  # a dict lookup, not an enum call, per packed entry
_FIELD, _ENTRY = "\x1f", "\x1e"  # separators of the packed results of a row (see latest_status_stmt)


def raw(col: Any) -> Any:
    """A vocabulary column selected as its stored string (read it with :func:`name_reader`)."""
    return type_coerce(col, String)


def name_reader(col: Any) -> Any:
    """A column type's reading of raw stored names, once per distinct name (a query's rows repeat a few names)."""
    typ, seen = col.type, {}

    def read(raw: str) -> Any:
        if raw not in seen:
            seen[raw] = typ.process_result_value(raw, None)
        return seen[raw]
    return read


def unpack(packed: str | Sequence[str], read_stage: Any = str, read_toolchain: Any = str) -> Tally:
    """The tally of a packed string of :func:`packed_results_stmt`, or of several together (a row's chosen versions
    judged as one), names read with the given readers."""
    t = Tally()
    for entry in sorted(_ENTRY.join([packed] if isinstance(packed, str) else packed).split(_ENTRY)):
        stage, status, tc, version, standin, route, n = entry.split(_FIELD)
        t.add(read_stage(stage), _STATUS[status], int(n), read_toolchain(tc), version or None, standin == "1",
              route or None)
    return t


def latest_status_stmt(model: str | None = None, precision: Precision | str | None = None,
                       platform: str | None = None, toolchain: str | None = None) -> Select[Any]:
    """The SQL of :func:`latest_status`: the rows' tallies kept when their latest run was published
    (``row_tallies``, one per row and chosen versions), names raw, chosen versions '' for none; no result is read."""
    t = RowTally
    return (select(t.model, raw(t.precision), t.platform, raw(t.toolchain), t.variant,
                   t.run_id, func.coalesce(t.chosen_versions, ""), t.packed)
            .where(*_row_filter(model, precision, platform, toolchain, table=t)))


def packed_results_stmt(*where: Any) -> Select[Any]:
    """One row per (row, its latest run, chosen versions) of the rows ``where`` selects (on ``row_latest``), its
    results counted by (stage, status, toolchain, version, stand-in, route) and packed into one string (``_FIELD``
    between fields, ``_ENTRY`` between groups; :func:`unpack` reads it), names raw. results.summaries keeps these."""
    row = (RowLatest.model, RowLatest.precision, RowLatest.platform, RowLatest.toolchain, RowLatest.variant,
           RowLatest.run_id, func.coalesce(Result.chosen_versions, ""))
    made = (raw(Result.stage), cast(Result.status, String), raw(Result.toolchain),
            func.coalesce(Result.toolchain_version, ""), case((Result.standin.is_(True), "1"), else_="0"),
            func.coalesce(raw(Result.route), ""))
    counted = (
        select(*(c.label(f"r{i}") for i, c in enumerate(row)), *(c.label(f"m{i}") for i, c in enumerate(made)),
               func.count().label("n"))
        .join(Result, _latest_results())
        .where(*where)
        .group_by(*row, *made)
        .subquery()
    )
    fields = [counted.c[f"m{i}"] for i in range(len(made))] + [cast(counted.c.n, String)]
    packed = fields[0]
    for f in fields[1:]:
        packed = packed + _FIELD + f
    keys = [counted.c[f"r{i}"] for i in range(len(row))]
    return select(*keys, func.aggregate_strings(packed, _ENTRY)).group_by(*keys)


def passing_rows(
    db: Engine | Session,
    *,
    required: Iterable[Stage | str] = DEFAULT_REQUIRED,
    platform: str | None = None,
    toolchain: str | None = None,
) -> list[RowKey]:
    """The rows whose verdict in their latest run is ``pass`` (see the module doc): with the default required
    stages the verdict kept when that run was published; with others, judged from the rows' kept tallies."""
    req = _required(required)
    prec, tool = name_reader(RowLatest.precision), name_reader(RowLatest.toolchain)
    with _session(db) as s:  # Core rows, names read once each (20,000 rows: see latest_status)
        if req == DEFAULT_REQUIRED:
            rows = s.connection().execute(passing_rows_stmt(platform, toolchain))
            return [RowKey(m, prec(p), pl, tool(tc), var) for m, p, pl, tc, var in rows]
        t = RowTally
        stmt = (select(t.model, raw(t.precision), t.platform, raw(t.toolchain),
                       t.variant, t.packed).where(*_row_filter(None, None, platform, toolchain, table=t)))
        stage = name_reader(Result.stage)
        merged: dict[tuple[str, str, str, str, str], list[str]] = defaultdict(list)
        for m, p, pl, tc, var, packed in s.connection().execute(stmt):  # a row judged over all its chosen versions
            merged[(m, p, pl, tc, var)].append(packed)
    keys = [RowKey(m, prec(p), pl, tool(tc), var) for (m, p, pl, tc, var), packs in merged.items()
            if unpack(packs, stage, tool).verdict(req) is Verdict.PASS]
    return sorted(keys, key=lambda k: (k.model, str(k.precision), k.platform, str(k.toolchain), k.variant))


def passing_rows_stmt(platform: str | None = None, toolchain: str | None = None) -> Select[Any]:
    """The SQL of :func:`passing_rows` with the default required stages: the verdicts kept in ``row_latest``."""
    names = (RowLatest.model, raw(RowLatest.precision), RowLatest.platform, raw(RowLatest.toolchain), RowLatest.variant)
    return (select(*names).where(RowLatest.verdict == Verdict.PASS.value,
                                 *_row_filter(None, None, platform, toolchain)).order_by(*names))


def row_history(
    db: Engine | Session,
    model: str,
    precision: Precision | str,
    platform: str,
    *,
    toolchain: str | None = None,
    variant: str | None = None,
    required: Iterable[Stage | str] = DEFAULT_REQUIRED,
) -> list[RowStatus]:
    """The verdict of (model, precision, platform) in every published run that has a result for it, oldest first:
    of the row whose jobs ran with ``toolchain`` and ``variant``, or, without them, of each toolchain's and
    variant's row (side by side in a run that ran several)."""
    req = _required(required)
    p = parse_name("precision", precision)
    where = [Result.model == model, Result.precision == p, Result.platform == platform]
    if toolchain is not None:
        where.append(Result.job_toolchain == parse_name("toolchain", toolchain))
    if variant is not None:
        where.append(Result.variant == variant)
    job_tool, stage_of = name_reader(Result.job_toolchain), name_reader(Result.stage)
    cols = (Result.run_id, raw(Result.job_toolchain), Result.variant, Result.chosen_versions, Run.kind, Run.started_at,
            raw(Result.stage), Result.status, raw(Result.toolchain), Result.toolchain_version, Result.standin,
            raw(Result.route))
    stmt = (select(*cols, func.count()).join(Run, Run.id == Result.run_id)
            .where(Run.published_at.is_not(None), *where).group_by(*cols))
    tallies: dict[tuple[int, str, str, str], Tally] = defaultdict(Tally)
    runs: dict[int, tuple[RunKind, datetime]] = {}
    with _session(db) as s:  # names raw, read once each
        for (run_id, job_tc, var, chosen, kind, started, stage, status, tc, version, standin, route,
             n) in s.execute(stmt):
            tallies[(run_id, job_tc, var, chosen or "")].add(stage_of(stage), status, n, tc, version, standin, route)
            runs[run_id] = (kind, started)
    return [RowStatus(RowKey(model, p, platform, job_tool(job_tc), var), rid, t.verdict(req), t.worst(), *runs[rid],
                      *t.toolchain(), *t.marks(), chosen_versions=chosen or None)
            for (rid, job_tc, var, chosen), t in sorted(tallies.items())]


@dataclass(frozen=True)
class RowDetail:
    """What a row's latest run recorded beyond its statuses (for ``edgefarm query``'s JSON and CSV):
    ``error_kind`` of its root cause (the first failed or errored result in pipeline order, else the first other
    result that is not a pass and has a kind), its metrics ``(stage, name, value, unit)`` and its artifacts
    ``(stage, kind, sha256)``, both in pipeline order."""

    error_kind: str | None = None
    metrics: tuple[tuple[str, str, float, str], ...] = ()
    artifacts: tuple[tuple[str, str, str], ...] = ()


def detail_key(status: RowStatus) -> tuple[str, str, str, str, str, str, int]:
    """The key of :func:`row_details`' answer for one row status."""
    k = status.key
    return (k.model, str(k.precision), k.platform, str(k.toolchain), k.variant, status.chosen_versions or "",
            status.run_id)


def row_details(db: Engine | Session, rows: Sequence[RowStatus]) -> dict[tuple[str, str, str, str, str, str, int],
                                                                           RowDetail]:
    """The :class:`RowDetail` of each row status, by :func:`detail_key` (three queries, whatever the row count)."""
    wanted = {detail_key(r) for r in rows}
    runs = sorted({r.run_id for r in rows})
    if not runs:
        return {}
    results: dict[int, tuple[Any, ...]] = {}  # result id -> (key, stage, status, error kind)
    with _session(db) as s:
        for rid, run_id, m, p, pl, tc, var, chosen, stage, status, kind in s.execute(
                select(Result.id, Result.run_id, Result.model, Result.precision, Result.platform,
                       Result.job_toolchain, Result.variant, Result.chosen_versions, Result.stage, Result.status,
                       Result.error_kind).where(Result.run_id.in_(runs))):
            key = (m, str(p), pl, str(tc), var, chosen or "", run_id)
            if key in wanted:
                results[rid] = (key, str(stage), ResultStatus(status), kind)
        evidence = result_evidence(s, runs)

    def order(rid: int) -> tuple[tuple[int, str], int]:
        return _stage_order(results[rid][1]), rid

    per_row: dict[Any, list[int]] = defaultdict(list)
    for rid in sorted(results, key=order):
        per_row[results[rid][0]].append(rid)
    got_metrics = {rid: [(name, float(value), unit or "") for name, value, unit in ev.metrics]
                   for rid, ev in evidence.items() if rid in results}
    got_artifacts = {rid: ev.artifacts for rid, ev in evidence.items() if rid in results}
    out = {}
    for key, ids in per_row.items():
        kinds = [(results[i][2] in _BLOCKING, results[i][3]) for i in ids
                 if results[i][2] != ResultStatus.PASS and results[i][3] is not None]
        kind = next((k for failed, k in kinds if failed), None) or next((k for _, k in kinds), None)
        out[key] = RowDetail(
            error_kind=str(getattr(kind, "value", kind)) if kind is not None else None,
            metrics=tuple((results[i][1], n, v, u) for i in ids for n, v, u in got_metrics.get(i, ())),
            artifacts=tuple((results[i][1], k, sha) for i in ids for k, sha in got_artifacts.get(i, ())))
    return out


@dataclass(frozen=True)
class ResultEvidence:
    """What one result recorded beside its status: its metrics ``(name, value, unit)`` and its artifacts
    ``(kind, sha256)``, each in the order recorded."""

    metrics: tuple[tuple[str, float, str | None], ...] = ()
    artifacts: tuple[tuple[str, str], ...] = ()


def result_evidence(db: Engine | Session, run_ids: Iterable[int]) -> dict[int, ResultEvidence]:
    """The :class:`ResultEvidence` of every result of the runs ``run_ids`` that recorded a metric or an artifact, by
    result id (two queries, whatever the result count)."""
    runs = sorted(set(run_ids))
    metrics: dict[int, list[tuple[str, float, str | None]]] = defaultdict(list)
    artifacts: dict[int, list[tuple[str, str]]] = defaultdict(list)
    with _session(db) as s:
        for rid, name, value, unit in s.execute(select(Metric.result_id, Metric.name, Metric.value, Metric.unit)
                                                .join(Result, Result.id == Metric.result_id)
                                                .where(Result.run_id.in_(runs)).order_by(Metric.id)):
            metrics[rid].append((name, value, unit))
        for rid, kind, sha in s.execute(select(ArtifactRecord.result_id, ArtifactRecord.kind, ArtifactRecord.sha256)
                                        .where(ArtifactRecord.run_id.in_(runs), ArtifactRecord.result_id.is_not(None))
                                        .order_by(ArtifactRecord.id)):
            artifacts[rid].append((str(getattr(kind, "value", kind)), sha))
    return {rid: ResultEvidence(tuple(metrics.get(rid, ())), tuple(artifacts.get(rid, ())))
            for rid in sorted(metrics.keys() | artifacts.keys())}


def row_names(db: Engine | Session, what: str) -> set[str]:
    """Every model (``what="model"``) or platform (``"platform"``) the database has rows of."""
    column = {"model": RowLatest.model, "platform": RowLatest.platform}[what]
    with _session(db) as s:
        return {str(n) for (n,) in s.execute(select(column).distinct())}


@dataclass(frozen=True)
class RunStart:
    id: int
    kind: str
    started_at: datetime


def run_starts(db: Engine | Session, run_ids: Iterable[int]) -> dict[int, RunStart]:
    """The kind and start of each run of ``run_ids`` that exists, by id."""
    with _session(db) as s:
        return {r.id: RunStart(r.id, r.kind.value, r.started_at)
                for r in s.query(Run).filter(Run.id.in_(set(run_ids)))}


def nightly_run_counts(db: Engine | Session) -> list[int]:
    """How many published nightly runs each row (model, precision, platform, job toolchain) has results in."""
    row = (Result.model, Result.precision, Result.platform, Result.job_toolchain)
    with _session(db) as s:
        return [n for *_, n in s.execute(
            select(*row, func.count(distinct(Result.run_id))).join(Run, Run.id == Result.run_id)
            .where(Run.kind == RunKind.NIGHTLY, Run.published_at.is_not(None)).group_by(*row))]
