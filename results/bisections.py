"""Answers of ``edgefarm bisect`` in the results database (table ``bisections``): written once per bisection,
read back as typed rows for the run pages (the bad run's rows) and ``edgefarm compare`` (the latest answer of each
row)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from edgefarm.results.models import Bisection
from edgellm.errors import ConfigurationError

RowKey = tuple[str, str, str]  # (model, precision, platform)
# What a bisection bisects: this repository's commits, the checkpoint's commits, a toolchain's versions.
REVISION, CHECKPOINT, TOOLCHAIN = "revision", "checkpoint", "toolchain"
INPUTS = (REVISION, CHECKPOINT, TOOLCHAIN)


@dataclass(frozen=True)
class BisectionRecord:
    """One bisection as given to :func:`record_bisection` and as read back (``id`` and ``created_at`` then set)."""

    precision: str
    platform: str
    good_ref: str
    bad_ref: str
    found: bool
    model: str | None = None
    toolchain: str | None = None
    checkpoint_sha256: str | None = None
    good_run_id: int | None = None
    bad_run_id: int | None = None
    good_sha: str | None = None
    bad_sha: str | None = None
    reason: str | None = None
    first_bad: str | None = None
    first_bad_subject: str | None = None
    last_good: str | None = None
    probes: list[dict[str, Any]] = field(default_factory=list)
    # the input bisected (INPUTS); with TOOLCHAIN, ``toolchain`` is the one whose versions were bisected
    bisected: str = REVISION
    id: int | None = None
    created_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.bisected not in INPUTS:
            raise ConfigurationError(f"bisected input {self.bisected!r}: valid: {', '.join(INPUTS)}")
        if self.bisected == TOOLCHAIN and not self.toolchain:
            raise ConfigurationError("a toolchain-version bisection names its toolchain (toolchain is empty)")

    @property
    def row(self) -> RowKey | None:
        return (self.model, self.precision, self.platform) if self.model is not None else None

    def line(self) -> str:
        """What a page says (unescaped: the page escapes it): ``first bad: <sha12> <subject>`` (this repository),
        ``first bad: checkpoint revision <sha12> <subject>``, ``first bad: <toolchain> <version> (last good
        <version>)``."""
        if not self.found or not self.first_bad:
            return f"bisected: no answer ({self.reason or 'no reason recorded'})"
        if self.bisected == TOOLCHAIN:
            after = f" (last good {self.last_good})" if self.last_good else ""
            return f"first bad: {self.toolchain} {self.first_bad}{after}"
        what = "checkpoint revision " if self.bisected == CHECKPOINT else ""
        return f"first bad: {what}{self.first_bad[:12]} {self.first_bad_subject or ''}".rstrip()


_FIELDS = ("precision", "platform", "good_ref", "bad_ref", "found", "model", "toolchain", "checkpoint_sha256",
           "good_run_id", "bad_run_id", "good_sha", "bad_sha", "reason", "first_bad", "first_bad_subject",
           "last_good", "probes")


def _typed(b: Bisection) -> BisectionRecord:
    return BisectionRecord(**{f: getattr(b, f) for f in _FIELDS}, bisected=b.bisected or REVISION, id=b.id,
                           created_at=b.created_at)


def record_bisection(engine: Engine, rec: BisectionRecord) -> int:
    """Write one bisection (one transaction); returns its id."""
    with Session(engine) as s, s.begin():
        row = Bisection(**{f: getattr(rec, f) for f in _FIELDS}, bisected=rec.bisected)
        s.add(row)
        s.flush()
        return row.id


def bisections_of_run(engine: Engine, bad_run_id: int) -> dict[RowKey, BisectionRecord]:
    """The latest bisection of each row whose bad end was ``bad_run_id``."""
    return _latest(_of_run(engine, bad_run_id))


def bisection_lines_of_run(engine: Engine, bad_run_id: int) -> dict[RowKey, str]:
    """What the run page says of each row whose bad end was ``bad_run_id``: :func:`lines`."""
    return lines(_of_run(engine, bad_run_id))


def _of_run(engine: Engine, bad_run_id: int) -> list[BisectionRecord]:
    with Session(engine) as s:
        rows = s.scalars(select(Bisection).where(Bisection.bad_run_id == bad_run_id, Bisection.model.is_not(None))
                         .order_by(Bisection.id)).all()
        return [_typed(b) for b in rows]


def bisections_of_checkpoint(engine: Engine, checkpoint_sha256: str) -> list[BisectionRecord]:
    """Every bisection of a checkpoint (by its digest), oldest first."""
    with Session(engine) as s:
        return [_typed(b) for b in s.scalars(select(Bisection).where(Bisection.checkpoint_sha256 == checkpoint_sha256)
                                             .order_by(Bisection.id))]


def latest_bisections(engine: Engine | Session, rows: Iterable[RowKey]) -> dict[RowKey, BisectionRecord]:
    """The latest bisection of each of ``rows`` that has one."""
    wanted = set(rows)
    return {k: v for k, v in _latest(_of_rows(engine, wanted)).items() if k in wanted}


def latest_bisection_lines(engine: Engine | Session, rows: Iterable[RowKey]) -> dict[RowKey, str]:
    """What ``edgefarm compare`` says by a regression of each of ``rows`` that was bisected: :func:`lines`."""
    wanted = set(rows)
    return {k: v for k, v in lines(_of_rows(engine, wanted)).items() if k in wanted}


def _of_rows(engine: Engine | Session, wanted: set[RowKey]) -> list[BisectionRecord]:
    if not wanted:
        return []
    models = sorted({m for m, _, _ in wanted})
    stmt = select(Bisection).where(Bisection.model.in_(models)).order_by(Bisection.id)
    if isinstance(engine, Session):
        return [_typed(b) for b in engine.scalars(stmt)]
    with Session(engine) as s:
        return [_typed(b) for b in s.scalars(stmt)]


def lines(records: Iterable[BisectionRecord]) -> dict[RowKey, str]:
    """Each row's answer as a page says it: its latest bisection's :meth:`BisectionRecord.line`, joined by the
    latest of each other input bisected between the same two runs ("first bad: 0123456789ab ...; first bad:
    <toolchain> <version> (last good <version>)"), inputs in ``INPUTS`` order."""
    records = list(records)
    out: dict[RowKey, str] = {}
    for row, last in _latest(records).items():
        same = {r.bisected: r for r in records  # in id order: a later one of an input replaces an earlier one
                if r.row == row and (r.good_run_id, r.bad_run_id) == (last.good_run_id, last.bad_run_id)}
        out[row] = "; ".join(same[i].line() for i in INPUTS if i in same)
    return out


def _latest(records: Iterable[BisectionRecord]) -> dict[RowKey, BisectionRecord]:
    out: dict[RowKey, BisectionRecord] = {}
    for r in records:  # in id order: a later one replaces an earlier one
        if r.row is not None:
            out[r.row] = r
    return out


def from_answer(answer: Mapping[str, Any], *, good_ref: str, bad_ref: str, row: RowKey | None = None,
                toolchain: str | None = None, good_run_id: int | None = None,
                bad_run_id: int | None = None) -> BisectionRecord:
    """The record of one answer of ``edgefarm bisect`` (the flow's ``input``, ``found``, ``first_bad``, ``probes`` ...
    with the request's ``precision``, ``platform`` and ``checkpoint_sha256``); a probe keeps its revision (of a
    version bisection: its version), status, seconds, cached, failing step and subject. A toolchain-version answer
    names its toolchain (``answer["toolchain"]``), which the record keeps in place of the row's."""
    probes = [{k: p.get(k) for k in ("revision", "status", "seconds", "cached", "step", "subject")}
              for p in answer.get("probes") or []]
    model, precision, platform = row if row else (None, str(answer["precision"]), str(answer["platform"]))
    bisected = str(answer.get("input") or REVISION)
    if bisected == TOOLCHAIN:
        toolchain = str(answer["toolchain"])
    return BisectionRecord(
        bisected=bisected, precision=precision, platform=platform, model=model, toolchain=toolchain,
        checkpoint_sha256=answer.get("checkpoint_sha256"),
        good_ref=good_ref, bad_ref=bad_ref, good_run_id=good_run_id, bad_run_id=bad_run_id,
        good_sha=answer.get("good"), bad_sha=answer.get("bad"), found=bool(answer.get("found")),
        reason=answer.get("reason"), first_bad=answer.get("first_bad"),
        first_bad_subject=answer.get("first_bad_subject"), last_good=answer.get("last_good"), probes=probes)
