"""The support status of a row: the one vocabulary every page, the terminal, queries, CSV and Prefect artifacts show.

A row (``results.queries.RowKey``) has one :class:`SupportStatus`, decided by :func:`classify` from its latest
``RowStatus`` (and, for a failing row, its history and the reasons its latest run recorded):

- ``l0_covered``: inference and its accuracy baseline passed (``results.queries.supported``) on the ONNX route;
- ``checkpoint_direct``: the same, but proven only on the route that builds the engine straight from the checkpoint
  (``RowStatus.route == "direct"``): its ONNX export was not built and run there;
- ``implemented``: the export passed (quantize too, where it ran) and nothing ran on a device yet;
- ``failing``: a stage failed or errored; ``since_run`` is the first run of the current unbroken failing streak;
- ``waived``: a known failure the plan waived (``waived until YYYY-MM-DD (LINK)``, see ``flows.plan._decide``);
- ``not_applicable``: the combination is not meant to work on that platform;
- ``skipped``: nothing proving or failing ran (no device, a toolchain missing, test stand-ins);
- ``never_tested``: no published run has a result for the row.

Each status has a label and a mark (one glyph or one word) for Markdown pages; no two render alike, none is blank.
"""

from __future__ import annotations

import datetime as dt
import enum
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, distinct, func, or_, select, tuple_
from sqlalchemy.orm import Session

from edgefarm.results.db import Db, reading
from edgefarm.results.models import Result, ResultStatus, RowLatest, RowLatestKind, Run, RunKind
from edgefarm.results.queries import (
    SUPPORT_REQUIRED,
    RowKey,
    RowStatus,
    Tally,
    Verdict,
    name_reader,
    raw,
    supported,
)
from edgefarm.stages import Stage

# Evidence of these stages alone proves an export, never support (as pages/docs_render.py's EXPORT_STAGES).
EXPORT_STAGES = frozenset({Stage.QUANTIZE.value, Stage.EXPORT.value})
_NOT_RUN = frozenset({ResultStatus.SKIPPED.value, ResultStatus.NOT_APPLICABLE.value, ResultStatus.WAIVED.value})
_FAILED = frozenset({ResultStatus.FAIL.value, ResultStatus.ERROR.value})
DIRECT_ROUTE = "direct"  # toolchains.base.Route.DIRECT (results knows no toolchain package but its names)
# what flows/plan.py records for a waived job: f"waived until {expires} ({bug})"
_WAIVED = re.compile(r"waived until (\d{4}-\d{2}-\d{2}) \((\S+?)\)")
STANDIN_REASON = "ran on test stand-ins of the toolchain's tools (never evidence)"


class SupportStatus(enum.StrEnum):
    L0_COVERED = "l0_covered"
    IMPLEMENTED = "implemented"
    CHECKPOINT_DIRECT = "checkpoint_direct"
    FAILING = "failing"
    WAIVED = "waived"
    NOT_APPLICABLE = "not_applicable"
    SKIPPED = "skipped"
    NEVER_TESTED = "never_tested"

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def mark(self) -> str:
        """One glyph or a word or two, safe in Markdown text and table cells."""
        return _MARKS[self]

    @property
    def meaning(self) -> str:
        """What the status says of a row, for legends."""
        return _MEANINGS[self]

    @property
    def display(self) -> str:
        """Mark and label for text: a glyph mark before the label; a word mark (waived, n/a, skipped, never tested)
        alone would repeat or abbreviate the label, so the label alone."""
        return self.label if self.mark.replace("/", "").replace(" ", "").isalpha() else f"{self.mark} {self.label}"

    @property
    def listed(self) -> bool:
        """Whether this evidence lists a checkpoint on a supported-models page (passing or export evidence)."""
        return self in (SupportStatus.L0_COVERED, SupportStatus.CHECKPOINT_DIRECT, SupportStatus.IMPLEMENTED)


_LABELS = {
    SupportStatus.L0_COVERED: "L0 covered",
    SupportStatus.IMPLEMENTED: "implemented (export verified only)",
    SupportStatus.CHECKPOINT_DIRECT: "checkpoint-direct only",
    SupportStatus.FAILING: "failing",
    SupportStatus.WAIVED: "waived",
    SupportStatus.NOT_APPLICABLE: "not applicable",
    SupportStatus.SKIPPED: "skipped",
    SupportStatus.NEVER_TESTED: "never tested",
}
_MEANINGS = {
    SupportStatus.L0_COVERED: "inference and its accuracy baseline passed on that platform in the latest run that "
                              "tested it.",
    SupportStatus.IMPLEMENTED: "the export passed with that toolchain; nothing has run on the device yet (not "
                               "support).",
    SupportStatus.CHECKPOINT_DIRECT: "passed, but only on the route that builds the engine straight from the "
                                     "checkpoint; its ONNX export was not built and run there.",
    SupportStatus.FAILING: "a stage failed or errored; since = the first run of the current failing streak.",
    SupportStatus.WAIVED: "a known failure, waived until a date, with its bug.",
    SupportStatus.NOT_APPLICABLE: "not meant to work on that platform.",
    SupportStatus.SKIPPED: "nothing proving or failing ran (no device or toolchain there).",
    SupportStatus.NEVER_TESTED: "no published run has tested it there.",
}
_MARKS = {
    SupportStatus.L0_COVERED: "✓",
    SupportStatus.IMPLEMENTED: "◇",
    SupportStatus.CHECKPOINT_DIRECT: "◆",
    SupportStatus.FAILING: "✗",
    SupportStatus.WAIVED: "waived",
    SupportStatus.NOT_APPLICABLE: "n/a",
    SupportStatus.SKIPPED: "skipped",
    SupportStatus.NEVER_TESTED: "never tested",  # one spelling everywhere: never_tested in data, never tested in text
}


@dataclass(frozen=True)
class Support:
    """A row's support status. ``run_id``: its latest run (None: never tested); ``since_run``: for a failing row,
    the first run of its current failing streak; ``reason``: the root cause (the first failed stage's reason, in
    pipeline order) or why it was waived, skipped or not applicable; ``until`` and ``link``: a waiver's expiry and
    bug."""

    status: SupportStatus
    since_run: int | None = None
    reason: str | None = None
    until: dt.date | None = None
    link: str | None = None
    run_id: int | None = None


def count_statuses(statuses: Iterable[SupportStatus]) -> dict[SupportStatus, int]:
    """Rows per status, every status of the vocabulary in its order (0 where none). The one count of every page:
    supported-models.md and the HTML matrix (overall and per platform), a toolchain's support-matrix.md coverage and a
    run page's summary all count through it, so no two pages count a row differently."""
    counts = dict.fromkeys(SupportStatus, 0)
    for status in statuses:
        counts[status] += 1
    return counts


def stage_order(stage: Any) -> int:
    """Pipeline order of a stage (its name or member); a stage this farm does not know after the known ones."""
    known = [s.value for s in Stage]
    value = str(getattr(stage, "value", stage))
    return known.index(value) if value in known else len(known)


def _stages(status: RowStatus) -> dict[str, str]:
    return {str(getattr(k, "value", k)): str(getattr(v, "value", v)) for k, v in status.stages.items()}


def _same_row(a: RowStatus, b: RowStatus) -> bool:
    return a.key == b.key and a.chosen_versions == b.chosen_versions


def _ran_nothing(status: RowStatus) -> bool:
    """A run in which the row was only skipped: it neither broke nor ended a failing streak."""
    return set(_stages(status).values()) <= {ResultStatus.SKIPPED.value}


def failing_since(latest: RowStatus, history: Sequence[RowStatus]) -> int:
    """The first run of the row's current unbroken failing streak (``latest`` failing): walking back from the latest
    run, runs in which it failed or errored extend the streak, runs that only skipped it are passed over, any other
    run (a pass, a waiver, export-only evidence) ends it."""
    return _streak_start(latest.run_id, [(h.run_id, _failing(h), _ran_nothing(h)) for h in history
                                         if _same_row(h, latest)])[0]


def _streak_start(latest_run: int, past: Iterable[tuple[int, bool, bool]]) -> tuple[int, bool]:
    """:func:`failing_since`'s walk over a row's runs given as (run id, failed or errored, only skipped): the
    streak's first run, and whether a run that ended it was among them."""
    since = latest_run
    for run, broke, nothing in sorted((p for p in past if p[0] < latest_run), reverse=True):
        if broke:
            since = run
        elif not nothing:
            return since, True
    return since, False


def _reason(stages: Mapping[str, str], reasons: Mapping[str, str | None], wanted: frozenset[str]) -> str | None:
    """The reason of the first stage (pipeline order) whose status is in ``wanted``."""
    for stage in sorted(stages, key=stage_order):
        if stages[stage] in wanted and reasons.get(stage):
            return reasons[stage]
    return next((r for s, r in sorted(reasons.items(), key=lambda kv: stage_order(kv[0])) if r), None)


def status_from(verdict: Verdict | str, stages: Mapping[Any, Any], *, route: str | None = None,
                standin: bool = False) -> SupportStatus:
    """The support status of a row from its verdict and stage statuses alone (no reasons, no history): what
    :func:`classify` decides, for a caller that holds a ``RowStatus`` (``status_from(r.verdict, r.stages,
    route=r.route, standin=r.standin)``) or the same fields as plain names."""
    names = {str(getattr(k, "value", k)): str(getattr(v, "value", v)) for k, v in stages.items()}
    verdict = str(getattr(verdict, "value", verdict))
    if standin:
        return SupportStatus.SKIPPED
    if supported(verdict):
        return SupportStatus.CHECKPOINT_DIRECT if route == DIRECT_ROUTE else SupportStatus.L0_COVERED
    if verdict in (Verdict.FAIL.value, Verdict.ERROR.value):
        return SupportStatus.FAILING
    if verdict == Verdict.NOT_APPLICABLE.value:
        return SupportStatus.NOT_APPLICABLE
    if ResultStatus.WAIVED.value in names.values():
        return SupportStatus.WAIVED
    passed = {s for s, st in names.items() if st == ResultStatus.PASS.value}
    later = {st for s, st in names.items() if s not in EXPORT_STAGES}
    if Stage.EXPORT.value in passed and passed <= EXPORT_STAGES and later <= _NOT_RUN:
        return SupportStatus.IMPLEMENTED
    return SupportStatus.SKIPPED


def classify(latest: RowStatus | None, history: Sequence[RowStatus] = (),
             reasons: Mapping[Any, str | None] | None = None, *, since: int | None = None) -> Support:
    """The support status of a row from its latest status (``results.queries.latest_status``, judged with
    ``SUPPORT_REQUIRED``), its history (``row_history``, any order; other rows' entries are ignored) and the reasons
    its latest run recorded per stage (:func:`row_reasons`' value of its row). ``since``: the failing streak's first
    run when the caller knows it (:func:`failing_streaks`), instead of walking ``history``."""
    if latest is None:
        return Support(SupportStatus.NEVER_TESTED)
    stages = _stages(latest)
    why = {str(getattr(k, "value", k)): v for k, v in (reasons or {}).items()}
    run = latest.run_id
    status = status_from(latest.verdict, stages, route=latest.route, standin=latest.standin)
    if latest.standin:
        return Support(status, reason=STANDIN_REASON, run_id=run)
    if status is SupportStatus.FAILING:
        return Support(status, since_run=since if since is not None else failing_since(latest, history),
                       reason=_reason(stages, why, _FAILED),
                       run_id=run)
    if status is SupportStatus.NOT_APPLICABLE:
        return Support(status, reason=_reason(stages, why, frozenset(stages.values())), run_id=run)
    if status is SupportStatus.WAIVED:
        reason = _reason(stages, why, frozenset({ResultStatus.WAIVED.value}))
        found = _WAIVED.search(reason or "")
        until = dt.date.fromisoformat(found.group(1)) if found else None
        return Support(status, reason=reason, until=until, link=found.group(2) if found else None, run_id=run)
    if status is SupportStatus.SKIPPED:
        return Support(status, reason=_reason(stages, why, frozenset({ResultStatus.SKIPPED.value})), run_id=run)
    return Support(status, run_id=run)


def _stored(name: Any) -> str:
    """A vocabulary name as its column stores it (an enum member's value; an unknown name as is)."""
    return str(getattr(name, "value", name))


def _stored_row(status: RowStatus) -> tuple[str, str, str, str, str]:
    """A status's row as stored: what the many-row reads bind (raw names: never re-checked by the registries, so a
    name this farm does not know is looked up as read)."""
    k = status.key
    return k.model, _stored(k.precision), k.platform, _stored(k.toolchain), k.variant


_RAW_ROW = (Result.model, raw(Result.precision), Result.platform, raw(Result.job_toolchain), Result.variant)


def row_reasons(s: Session, statuses: Iterable[RowStatus]) -> dict[EvidenceKey, dict[str, str]]:
    """The reasons each row's run recorded, per stage (the first non-empty one of a stage's tests, by result id),
    by :func:`evidence_key`: one statement per ``CHUNK`` (row, run) pairs."""
    prec, job_tool = name_reader(Result.precision), name_reader(Result.job_toolchain)
    pairs = list(dict.fromkeys((*_stored_row(st), st.run_id) for st in statuses))
    cols = (*_RAW_ROW, Result.run_id, Result.chosen_versions, raw(Result.stage), Result.status, Result.reason)
    out: dict[EvidenceKey, dict[str, str]] = defaultdict(dict)
    for i in range(0, len(pairs), CHUNK):
        for m, p, pl, jt, var, rid, chosen, stage, status, reason in s.execute(
                select(*cols).where(tuple_(*_RAW_ROW, Result.run_id).in_(pairs[i:i + CHUNK]),
                                    Result.reason.is_not(None), Result.status != ResultStatus.PASS)
                .order_by(Result.id)):
            add_reason(out[(RowKey(m, prec(p), pl, job_tool(jt), var), rid, chosen or None)], stage, status, reason)
    return out


def add_reason(reasons: dict[str, str], stage: str, status: ResultStatus, reason: str | None) -> None:
    """A row's reasons per stage (:func:`row_reasons`), given its results one by one in result id order: the first
    non-empty reason of a result that did not pass."""
    if reason and status != ResultStatus.PASS:
        reasons.setdefault(stage, reason)


def _failing(status: RowStatus) -> bool:
    return status.verdict in (Verdict.FAIL, Verdict.ERROR)


STREAK_WINDOW = 64  # run ids read back from a failing row's latest run at first (then 8 times as many, and so on)


def failing_streaks(s: Session, statuses: Sequence[RowStatus]) -> dict[EvidenceKey, int]:
    """:func:`failing_since` of each failing status, by :func:`evidence_key`, from one line per (row, published run,
    chosen versions): whether a result failed or errored, whether every stage only skipped (a run's verdict is fail
    or error exactly when one did; it ran nothing exactly when each stage's worst status is skipped). Read back from
    each row's latest run a window of run ids at a time (``STREAK_WINDOW``, then 8 times wider), only for the rows
    whose streak has not ended yet: a row's older history is never read (at 10M results reading the failing rows'
    whole histories took 52 s). One statement per ``CHUNK`` rows per window."""
    failing = [st for st in statuses if _failing(st)]
    hi: dict[tuple[str, ...], int] = {}  # row -> the run id its next window ends before
    for st in failing:
        hi[_stored_row(st)] = max(hi.get(_stored_row(st), 0), st.run_id)
    past: dict[tuple[tuple[str, ...], str | None], list[tuple[int, bool, bool]]] = defaultdict(list)
    broke = func.max(case((Result.status.in_([ResultStatus.FAIL, ResultStatus.ERROR]), 1), else_=0))
    skipped = func.count(distinct(case((Result.status == ResultStatus.SKIPPED, Result.stage))))
    width, todo = STREAK_WINDOW, sorted(hi)
    while todo:
        for i in range(0, len(todo), CHUNK):
            windows = [and_(*(c == v for c, v in zip(_RAW_ROW, row, strict=True)), Result.run_id < hi[row],
                            Result.run_id >= hi[row] - width) for row in todo[i:i + CHUNK]]
            stmt = (select(*_RAW_ROW, Result.run_id, Result.chosen_versions, broke, skipped,
                           func.count(distinct(Result.stage)))
                    .join(Run, Run.id == Result.run_id).where(Run.published_at.is_not(None), or_(*windows))
                    .group_by(*_RAW_ROW, Result.run_id, Result.chosen_versions))
            for m, p, pl, jt, var, rid, chosen, b, n_skipped, n_stages in s.execute(stmt):
                past[((m, p, pl, jt, var), chosen or None)].append((rid, bool(b), n_skipped == n_stages))
        ended = {_stored_row(st) for st in failing if hi[_stored_row(st)] - width <= 0
                 or _streak_start(st.run_id, past.get((_stored_row(st), st.chosen_versions), ()))[1]}
        unended = {_stored_row(st) for st in failing} - ended  # a row with a version still failing at the edge
        for row in unended:
            hi[row] -= width
        todo, width = sorted(unended), width * 8
    return {evidence_key(st): _streak_start(st.run_id, past.get((_stored_row(st), st.chosen_versions), ()))[0]
            for st in failing}


def supports_of(s: Session, statuses: Sequence[RowStatus],
                reasons: Mapping[EvidenceKey, Mapping[str, str]] | None = None) -> list[Support]:
    """:func:`classify` of each row, with the reasons its run recorded (``reasons``: :func:`row_reasons`, when the
    caller read them already) and, for a failing row, its failing streak's first run (:func:`failing_streaks`): a
    few statements for any number of rows, never one per row."""
    if reasons is None:
        reasons = row_reasons(s, statuses)
    since = failing_streaks(s, statuses)
    return [classify(st, (), reasons.get(evidence_key(st), {}), since=since.get(evidence_key(st))) for st in statuses]


def support_of(s: Session, status: RowStatus) -> Support:
    """:func:`supports_of` of one row."""
    return supports_of(s, [status])[0]


# The runs whose evidence the nightly's pages show (supported-models.md, the HTML matrix, the toolchains' layouts, the
# Prefect matrix artifact): the nightly's only. A model reaches them through the catalog and a nightly, never by being
# brought up once: a bring-up's evidence (even its rung 7, the farm's pipeline) stays on its report and its run page
# (issue 41). A test-list run (kind l0 / l1, flows.plan.plan_test_list) publishes its own page and never changes these.
NIGHTLY_PAGE_KINDS: tuple[RunKind, ...] = (RunKind.NIGHTLY,)
CHUNK = 200  # rows (or row and run pairs) per statement of the many-row reads: 5-6 bound names each


def latest_runs(*, kinds: Collection[RunKind | str] | None = None, run_id: int | None = None,
                toolchain: str | None = None) -> Any:
    """The subquery of each row's latest published run of ``kinds`` (the pointers the recorder keeps:
    ``row_latest_kind``, or ``row_latest`` for any kind), or, with ``run_id``, of the rows of that one run (published
    or not): its row columns (model, precision, platform, job_toolchain, variant) and ``run_id``. Join results to it
    with :func:`of_latest`."""
    if run_id is not None:
        row = (Result.model, Result.precision, Result.platform, Result.job_toolchain, Result.variant)
        stmt = select(*row, func.max(Result.run_id).label("run_id")).where(Result.run_id == run_id)
        if kinds is not None:
            stmt = stmt.join(Run, Run.id == Result.run_id).where(Run.kind.in_([str(k) for k in kinds]))
        if toolchain is not None:
            stmt = stmt.where(Result.job_toolchain == toolchain)
        return stmt.group_by(*row).subquery()
    t: Any = RowLatest if kinds is None else RowLatestKind
    cols = (t.model, t.precision, t.platform, t.toolchain.label("job_toolchain"), t.variant)
    where = [] if kinds is None else [t.kind.in_([str(k) for k in kinds])]
    if toolchain is not None:
        where.append(t.toolchain == toolchain)
    return (select(*cols, func.max(t.run_id).label("run_id")).where(*where)
            .group_by(t.model, t.precision, t.platform, t.toolchain, t.variant).subquery())


def of_latest(latest: Any) -> Any:
    """The join condition of ``Result`` with :func:`latest_runs`: a row's results in its latest run."""
    return and_(Result.model == latest.c.model, Result.precision == latest.c.precision,
                Result.platform == latest.c.platform, Result.job_toolchain == latest.c.job_toolchain,
                Result.variant == latest.c.variant, Result.run_id == latest.c.run_id)


EvidenceKey = tuple[RowKey, int, str | None]  # a row, its run, its chosen versions: one RowStatus's results


def evidence_key(status: RowStatus) -> EvidenceKey:
    return status.key, status.run_id, status.chosen_versions


def latest_status_of_runs(s: Session, *, kinds: Collection[RunKind | str] | None = None, run_id: int | None = None,
                          toolchain: str | None = None, latest: Any = None) -> list[RowStatus]:
    """Like ``results.queries.latest_status`` (judged with ``SUPPORT_REQUIRED``), over a subset of runs: each row's
    latest published run of ``kinds``; or, with ``run_id``, the rows of that one run (published or not). Sorted by
    row; one status per compared toolchain version. ``latest``: the :func:`latest_runs` of these arguments, when the
    caller made it already."""
    if latest is None:
        latest = latest_runs(kinds=kinds, run_id=run_id, toolchain=toolchain)
    prec, job_tool, stage_of = (name_reader(c) for c in (Result.precision, Result.job_toolchain, Result.stage))
    cols = (Result.model, raw(Result.precision), Result.platform, raw(Result.job_toolchain), Result.variant,
            Result.run_id, Result.chosen_versions, raw(Result.stage), Result.status, raw(Result.toolchain),
            Result.toolchain_version, Result.standin, raw(Result.route))
    tallies: dict[tuple[Any, ...], Tally] = defaultdict(Tally)
    for m, p, pl, jt, var, rid, chosen, stage, status, tc, version, standin, route, n in s.execute(
            select(*cols, func.count()).join(latest, of_latest(latest)).group_by(*cols)):  # names raw, read once
        tallies[(m, p, pl, jt, var, rid, chosen or "")].add(stage_of(stage), status, n, tc, version, standin, route)
    return [RowStatus(RowKey(m, prec(p), pl, job_tool(jt), var), rid, t.verdict(SUPPORT_REQUIRED), t.worst(), None,
                      None, *t.toolchain(), *t.marks(), chosen_versions=chosen or None)
            for (m, p, pl, jt, var, rid, chosen), t in sorted(tallies.items())]


def row_supports(db: Db, *, kinds: Collection[RunKind | str] | None = None, run_id: int | None = None,
                 toolchain: str | None = None) -> list[tuple[RowStatus, Support]]:
    """Each row of :func:`latest_status_of_runs` with its support (:func:`supports_of`): what every page and the
    counts show (reasons as recorded, not yet scrubbed)."""
    with reading(db) as s:
        statuses = latest_status_of_runs(s, kinds=kinds, run_id=run_id, toolchain=toolchain)
        return list(zip(statuses, supports_of(s, statuses), strict=True))
