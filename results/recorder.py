"""Writing to the results database: runs, results (+ metrics, artifact refs), health, baselines.

Idempotent: a result is unique on (run, model, precision, platform, stage, test id); recording it again (a retried
task) replaces its status, reason and metrics instead of adding a row. A result, its metrics and its artifact refs
are written in one transaction, so a crash leaves nothing half-written. A run's results become evidence (the
rows' "latest run" pointers move to it) only when it finishes and is published, in the transaction that ends it.
A row is (model, precision, platform, job toolchain): a result names the toolchain its job ran with
(``job_toolchain``) besides the one that made it (``toolchain``; a quantizer's for a quantize stage).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Engine, case, delete, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.results import summaries
from edgefarm.results.db import make_engine, write_session
from edgefarm.results.errors import RunReaped
from edgefarm.results.machine import this_host
from edgefarm.results.models import (
    ArtifactRecord,
    Attempt,
    BringupRung,
    DeviceHealth,
    Environment,
    Metric,
    MetricBaseline,
    Result,
    ResultStatus,
    RowLatest,
    RowLatestKind,
    Run,
    RunKind,
    RunStatus,
    RunWorker,
    ToolchainVersion,
    parse_choice,
    parse_name,
    utcnow,
)
from edgefarm.stages import Stage
from edgellm.errors import ConfigurationError, ErrorKind
from edgellm.types import Precision

_SHA256 = re.compile(r"[0-9a-f]{64}")


class ArtifactLike(Protocol):
    """What record_result needs of an artifact (artifacts.ArtifactRef satisfies it)."""

    sha256: str
    size: int
    kind: ArtifactKind
    packing: Packing


@dataclass(frozen=True)
class ArtifactLink:
    sha256: str
    size: int
    kind: ArtifactKind
    packing: Packing = Packing.FILE
    path_hint: str | None = None


def _nonempty(value: str, what: str, limit: int = 200) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        raise ConfigurationError(f"bad {what} {value!r}: need a non-empty string of at most {limit} characters")
    return value


def _version(value: str | None) -> str | None:
    return None if value is None else _nonempty(value, "toolchain version")


def _variant(value: str) -> str:
    """A row's variant key (vocabulary.variant.variant_key): '' or printable text of at most 300 characters."""
    if not isinstance(value, str) or len(value) > 300 or not value.isprintable():
        raise ConfigurationError(f"bad variant {value!r}: need a variant key (stages.variant.variant_key) of at most "
                                 "300 printable characters, or '' for the default")
    return value


def _sha(value: str, what: str) -> str:
    if not _SHA256.fullmatch(value or ""):
        raise ConfigurationError(f"bad {what} {value!r}: need 64 lowercase hex digits (a sha256)")
    return value


def environment_digest(environment: Mapping[str, Any]) -> str:
    """An environment's key: the sha256 of its canonical JSON (sorted keys, no spaces)."""
    try:
        text = json.dumps(environment, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"an environment must be plain JSON data: {exc}") from None
    return hashlib.sha256(text.encode()).hexdigest()


def _reaped_why(run: Run) -> str:
    """Why a run this process still ran can no longer be ended by it (one line)."""
    at = run.finished_at.isoformat(timespec="seconds") if run.finished_at else "an unknown time"
    return (f"run {run.id} was ended as {run.status.value!r} at {at} by another process while this one still ran "
            f"it (reaped: its heartbeat stopped, e.g. the orchestrator was suspended); what it did after that is not "
            f"published, and its devices may have been taken over")


def _insert(dialect: str) -> Any:
    """The dialect's insert (its ``on_conflict_*``)."""
    return postgresql.insert if dialect == "postgresql" else sqlite.insert


def _upsert(session: Session) -> Any:
    return _insert(session.get_bind().dialect.name)


_RESULT_KEY = ("run_id", "model", "precision", "platform", "stage", "test_id")


@functools.cache
def _result_upsert(dialect: str, columns: tuple[str, ...]) -> Any:
    """The insert-or-replace of a result row, its values bound at execution (built once per dialect and column set;
    a statement built per result cost more CPU than the database's work)."""
    ins = _insert(dialect)(Result.__table__)
    replace = {k: ins.excluded[k] for k in columns if k not in _RESULT_KEY}
    return ins.on_conflict_do_update(index_elements=list(_RESULT_KEY), set_=replace).returning(Result.__table__.c.id)


class Recorder:
    """The orchestration's write API. Each method is one transaction."""

    def __init__(self, engine: Engine | str | None = None) -> None:
        self.engine = engine if isinstance(engine, Engine) else make_engine(engine)
        # the environment digests this recorder saw committed: an environment row is content-addressed and never
        # changed or deleted, so a stage run with the same environment as an earlier one writes none
        self._environments: set[str] = set()
        self._environments_lock = threading.Lock()

    # runs -------------------------------------------------------------------------------------------------------
    def start_run(
        self,
        kind: RunKind | str,
        trigger: str,
        code_version: str,
        *,
        toolchain: Mapping[str, str] | None = None,
        started_at: datetime | None = None,
    ) -> int:
        run = Run(
            kind=parse_name("run_kind", kind),
            trigger=_nonempty(trigger, "trigger"),
            code_version=_nonempty(code_version, "code version", 100),
            started_at=started_at or utcnow(),
            status=RunStatus.RUNNING,
            heartbeat_at=utcnow(),
            host=this_host(),
            pid=os.getpid(),
        )
        with write_session(self.engine) as s:
            s.add(run)
            s.flush()
            for name, version in (toolchain or {}).items():
                s.add(ToolchainVersion(run_id=run.id, name=_nonempty(name, "tool name", 100), version=version))
        return run.id

    def record_worker(self, run_id: int, *, role: str, pool: str | None, host: str, data_dir: str, revision: str,
                      source_digest: str, toolchains: Mapping[str, str], flow_run_id: str | None = None,
                      accepted: bool = True, reason: str | None = None,
                      outcome: Mapping[str, Any] | None = None) -> int:
        """A process that took part in ``run_id`` (``RunWorker``); ``outcome``: a dispatched stage's, plain JSON."""
        if not re.fullmatch(r"[0-9a-f]{64}", source_digest or ""):
            raise ConfigurationError(f"bad source digest {source_digest!r}: need 64 lowercase hex digits")
        try:
            data = None if outcome is None else json.loads(json.dumps(dict(outcome), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"worker outcome is not plain JSON ({exc})") from None
        with write_session(self.engine) as s:
            self._run(s, run_id)
            row = RunWorker(run_id=run_id, role=_nonempty(role, "worker role", 32), pool=pool and pool[:200],
                            host=_nonempty(host, "host", 200), data_dir=_nonempty(data_dir, "data dir", 1000),
                            revision=_nonempty(revision, "revision", 100), source_digest=source_digest,
                            toolchains={str(k): str(v) for k, v in toolchains.items()}, flow_run_id=flow_run_id,
                            accepted=accepted, reason=None if reason is None else reason[:4000], outcome=data)
            s.add(row)
            s.flush()
            return row.id

    def record_toolchain(self, run_id: int, versions: Mapping[str, str]) -> None:
        with write_session(self.engine) as s:
            self._run(s, run_id)
            ins = _upsert(s)(ToolchainVersion)
            for name, version in versions.items():
                stmt = ins.values(run_id=run_id, name=_nonempty(name, "tool name", 100), version=version)
                s.execute(stmt.on_conflict_do_update(index_elements=["run_id", "name"], set_={"version": version}))

    def finish_run(self, run_id: int, status: RunStatus | str, *, finished_at: datetime | None = None,
                   publish: bool = True) -> None:
        """End the run; unless it was cancelled (or ``publish`` is False), publish its results: every row it
        tested points at it unless a newer published run already tested that row."""
        st = parse_choice(RunStatus, status, "run status")
        if st is RunStatus.RUNNING:
            raise ConfigurationError(f"cannot finish run {run_id} as {st.value!r}; valid: "
                                     f"{', '.join(m.value for m in RunStatus if m is not RunStatus.RUNNING)}")
        now = finished_at or utcnow()
        publish = publish and st is not RunStatus.CANCELLED
        with write_session(self.engine) as s:
            run = self._run(s, run_id)
            ended = s.execute(update(Run).where(Run.id == run_id, Run.status == RunStatus.RUNNING)
                              .values(status=st, finished_at=now, published_at=now if publish else None)).rowcount
            if ended != 1:  # reaped (or ended) by someone else meanwhile: what it did after that is no evidence
                raise RunReaped(_reaped_why(run))
            if publish:
                rows = s.execute(select(Result.model, Result.precision, Result.platform, Result.job_toolchain,
                                        Result.variant).distinct().where(Result.run_id == run_id)).all()
                for model, precision, platform, toolchain, variant in rows:
                    self._bump_latest(s, model, precision, platform, toolchain, variant, run_id, run.kind)
                summaries.refresh(s, run_id)

    # bring-up ---------------------------------------------------------------------------------------------------
    def record_rung(self, run_id: int, position: int, name: str, status: ResultStatus | str, *,
                    reason: str | None, evidence: Mapping[str, Any], duration_s: float | None = None,
                    checkpoint_sha256: str | None = None) -> None:
        """One rung of a bring-up's ladder (``flows.bringup``), in climbing order; its evidence must be JSON."""
        st = parse_choice(ResultStatus, status, "rung status")
        try:
            data = json.loads(json.dumps(dict(evidence), allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"rung {name!r}: evidence is not plain JSON ({exc})") from None
        with write_session(self.engine) as s:
            self._run(s, run_id)
            s.add(BringupRung(run_id=run_id, position=position, name=_nonempty(name, "rung name", 64),
                              status=st.value, checkpoint_sha256=checkpoint_sha256,
                              reason=None if reason is None else reason[:4000], evidence=data,
                              duration_s=duration_s))

    def set_report(self, run_id: int, report: str) -> None:
        """The report directory ``run_id`` wrote (its run page links it)."""
        with write_session(self.engine) as s:
            self._run(s, run_id).report = _nonempty(report, "report path", 1000)

    def heartbeat(self, run_id: int) -> None:
        """The orchestrator of ``run_id`` is alive (see results.liveness); RunReaped if the run was ended meanwhile
        (another run reaped it while this process was suspended or cut off)."""
        with write_session(self.engine) as s:
            beat = s.execute(update(Run).where(Run.id == run_id, Run.status == RunStatus.RUNNING)
                             .values(heartbeat_at=utcnow())).rowcount
            if beat != 1:
                raise RunReaped(_reaped_why(self._run(s, run_id)))

    @staticmethod
    def _run(s: Session, run_id: int) -> Run:
        run = s.get(Run, run_id)
        if run is None:
            raise ConfigurationError(f"unknown run id {run_id!r}; start a run first (Recorder.start_run)")
        return run

    # results ----------------------------------------------------------------------------------------------------
    def record_result(self, run_id: int, **fields: Any) -> int:
        """Insert or replace one result with its metrics and artifact refs (fields: see :meth:`_result_rows`;
        ``toolchain`` made the result, ``job_toolchain`` is the one its job ran with, by default the same);
        returns the result id."""
        return self.record_results(run_id, [fields])[0]

    def record_results(self, run_id: int, results: Iterable[Mapping[str, Any]],
                       attempts: Iterable[Mapping[str, Any]] = ()) -> list[int]:
        """Several results (keyword arguments of :meth:`record_result` each) and ``attempts`` (keyword arguments of
        :meth:`record_attempt` each: a stage's try on a device) in one transaction; returns the result ids."""
        rows = [self._result_rows(run_id, **r) for r in results]
        tries = [self._attempt_row(run_id, **a) for a in attempts]
        with write_session(self.engine) as s:
            run = self._run(s, run_id)  # held: the session keeps it only while referenced (read again otherwise)
            ids = [self._write_result(s, *row) for row in rows]
            s.add_all(tries)
            summaries.refresh_if_published(s, run.id)  # a late write into a published run: its rows' summaries
        with self._environments_lock:  # committed
            self._environments.update(values["environment"] for values, _, _ in rows if values["environment"])
        return ids

    def _result_rows(
        self,
        run_id: int,
        *,
        model: str,
        precision: Precision | str,
        platform: str,
        stage: Stage | str,
        test_id: str,
        status: ResultStatus | str,
        toolchain: str,
        toolchain_version: str | None = None,
        model_revision: str | None = None,
        device: str | None = None,
        reason: str | None = None,
        error_kind: ErrorKind | str | None = None,
        duration_s: float | None = None,
        metrics: Mapping[str, tuple[float, str]] | None = None,
        artifacts: Iterable[ArtifactLike | ArtifactLink] = (),
        route: str | None = None,
        standin: bool = False,
        chosen_versions: str | None = None,
        job_toolchain: str | None = None,
        environment: Mapping[str, Any] | None = None,
        bench_conditions: str | None = None,
        variant: str = "",
    ) -> tuple[dict[str, Any], list[dict[str, Any]], list[ArtifactLink]]:
        values: dict[str, Any] = {
            "run_id": run_id,
            "model": _nonempty(model, "model"),
            "precision": parse_name("precision", precision),
            "platform": _nonempty(platform, "platform", 64),
            "stage": parse_name("stage", stage),
            "test_id": _nonempty(test_id, "test id"),
            "status": parse_choice(ResultStatus, status, "result status"),
            "toolchain": parse_name("toolchain", toolchain),
            "toolchain_version": _version(toolchain_version),
            "job_toolchain": parse_name("toolchain", toolchain if job_toolchain is None else job_toolchain),
            "variant": _variant(variant),
            "model_revision": None if model_revision is None else _sha(model_revision, "model revision"),
            "device": device,
            "reason": reason,
            "error_kind": None if error_kind is None else parse_choice(ErrorKind, error_kind, "error kind"),
            "duration_s": duration_s,
            "recorded_at": utcnow(),
            "route": None if route is None else parse_name("route", route),
            "standin": bool(standin),
            "chosen_versions": None if chosen_versions is None else _nonempty(chosen_versions, "chosen versions", 300),
            "bench_conditions": None if bench_conditions is None else _nonempty(bench_conditions, "bench conditions",
                                                                                 300),
            "environment": None if environment is None else environment_digest(environment),
            "_environment": environment,
        }
        metric_rows = [
            {"name": _nonempty(name, "metric name", 100), "value": float(v), "unit": unit}
            for name, (v, unit) in (metrics or {}).items()
        ]
        return values, metric_rows, [self._link(a) for a in artifacts]

    def _write_result(self, s: Session, values: dict[str, Any], metric_rows: list[dict[str, Any]],
                      links: list[ArtifactLink]) -> int:
        values = dict(values)
        environment = values.pop("_environment", None)
        with self._environments_lock:
            known = values["environment"] in self._environments
        if environment is not None and not known:
            s.execute(_upsert(s)(Environment).values(digest=values["environment"], data=dict(environment),
                                                     recorded_at=utcnow()).on_conflict_do_nothing())
        stmt = _result_upsert(s.get_bind().dialect.name, tuple(values))
        result_id = int(s.execute(stmt, values).scalar_one())
        metrics = Metric.__table__  # Core: nothing of the session to synchronise
        s.execute(delete(metrics).where(metrics.c.result_id == result_id))
        if metric_rows:
            s.execute(Metric.__table__.insert(), [{**m, "result_id": result_id} for m in metric_rows])
        self._add_links(s, values["run_id"], result_id, links)
        return result_id

    def record_attempt(
        self,
        run_id: int,
        *,
        model: str,
        precision: Precision | str,
        platform: str,
        stage: Stage | str,
        test_id: str,
        device: str | None,
        status: ResultStatus | str,
        toolchain: str,
        toolchain_version: str | None = None,
        error_kind: ErrorKind | str | None = None,
        reason: str | None = None,
        duration_s: float | None = None,
    ) -> int:
        """One try of a stage on one device (kept even when a retry elsewhere then passed)."""
        row = self._attempt_row(run_id, model=model, precision=precision, platform=platform, stage=stage,
                                test_id=test_id, device=device, status=status, toolchain=toolchain,
                                toolchain_version=toolchain_version, error_kind=error_kind, reason=reason,
                                duration_s=duration_s)
        with write_session(self.engine) as s:
            self._run(s, run_id)
            s.add(row)
            s.flush()
            return row.id

    @staticmethod
    def _attempt_row(run_id: int, *, model: str, precision: Precision | str, platform: str, stage: Stage | str,
                     test_id: str, device: str | None, status: ResultStatus | str, toolchain: str,
                     toolchain_version: str | None = None, error_kind: ErrorKind | str | None = None,
                     reason: str | None = None, duration_s: float | None = None) -> Attempt:
        return Attempt(
            run_id=run_id, model=_nonempty(model, "model"), precision=parse_name("precision", precision),
            platform=_nonempty(platform, "platform", 64), stage=parse_name("stage", stage),
            test_id=_nonempty(test_id, "test id"),
            device=device, status=parse_choice(ResultStatus, status, "result status"),
            toolchain=parse_name("toolchain", toolchain), toolchain_version=_version(toolchain_version),
            error_kind=None if error_kind is None else parse_choice(ErrorKind, error_kind, "error kind"),
            reason=reason, duration_s=duration_s, recorded_at=utcnow(),
        )

    @staticmethod
    def _bump_latest(s: Session, model: str, precision: str, platform: str, toolchain: str, variant: str,
                     run_id: int, kind: str) -> None:
        """The row's latest published run (``row_latest``) and its latest of this run kind (``row_latest_kind``)
        move to ``run_id`` unless they point at a newer run."""
        row = {"model": model, "precision": precision, "platform": platform, "toolchain": toolchain,
               "variant": variant}
        for table, values in ((RowLatest, row), (RowLatestKind, {**row, "kind": kind})):
            ins = _upsert(s)(table).values(**values, run_id=run_id)
            col = table.__table__.c.run_id
            newer = case((ins.excluded.run_id > col, ins.excluded.run_id), else_=col)
            s.execute(ins.on_conflict_do_update(index_elements=list(values), set_={"run_id": newer}))

    # artifacts --------------------------------------------------------------------------------------------------
    @staticmethod
    def _link(a: ArtifactLike | ArtifactLink) -> ArtifactLink:
        if isinstance(a, ArtifactLink):
            link = a
        else:
            link = ArtifactLink(a.sha256, a.size, a.kind, a.packing, getattr(a, "path_hint", None))
        _sha(link.sha256, "artifact sha256")
        return ArtifactLink(link.sha256, int(link.size), parse_choice(ArtifactKind, link.kind, "artifact kind"),
                            parse_choice(Packing, link.packing, "artifact packing"), link.path_hint)

    @staticmethod
    def _add_links(s: Session, run_id: int, result_id: int | None, links: Iterable[ArtifactLink]) -> None:
        """Each link the run (its result ``result_id``, or none) does not hold yet, by (sha256, kind): one read of
        those it holds, one insert of the rest."""
        links = list(links)
        if not links:
            return
        held = set(s.execute(select(ArtifactRecord.sha256, ArtifactRecord.kind).where(
            ArtifactRecord.run_id == run_id,
            ArtifactRecord.result_id.is_(None) if result_id is None else ArtifactRecord.result_id == result_id,
            ArtifactRecord.sha256.in_({link.sha256 for link in links}),
        )).all())
        rows = []
        for link in links:
            if (link.sha256, link.kind) not in held:
                held.add((link.sha256, link.kind))
                rows.append({"run_id": run_id, "result_id": result_id, "sha256": link.sha256, "kind": link.kind,
                             "packing": link.packing, "size": link.size, "path_hint": link.path_hint})
        if rows:
            s.execute(ArtifactRecord.__table__.insert(), rows)

    def record_artifact(
        self, run_id: int, artifact: ArtifactLike | ArtifactLink, *, result_id: int | None = None
    ) -> None:
        """A run-level artifact (a run log...) or one attached to an existing result."""
        link = self._link(artifact)
        with write_session(self.engine) as s:
            self._run(s, run_id)
            self._add_links(s, run_id, result_id, [link])

    def referenced_artifacts(self) -> set[str]:
        """Every sha256 the database refers to: the set to pass to ``ArtifactStore.gc``."""
        with Session(self.engine) as s:
            return set(s.scalars(select(ArtifactRecord.sha256).distinct()))

    # health and baselines ---------------------------------------------------------------------------------------
    def record_health(
        self,
        device_id: str,
        *,
        reachable: bool,
        disk_free_bytes: int | None = None,
        python_version: str | None = None,
        edgellm_version: str | None = None,
        details: Mapping[str, Any] | None = None,
        checked_at: datetime | None = None,
    ) -> int:
        row = DeviceHealth(
            device_id=_nonempty(device_id, "device id"),
            checked_at=checked_at or utcnow(),
            reachable=bool(reachable),
            disk_free_bytes=disk_free_bytes,
            python_version=python_version,
            edgellm_version=edgellm_version,
            details=dict(details or {}),
        )
        with write_session(self.engine) as s:
            s.add(row)
            s.flush()
            return row.id

    def set_baseline(
        self,
        *,
        model: str,
        precision: Precision | str,
        platform: str,
        stage: Stage | str,
        test_id: str,
        name: str,
        value: float,
        unit: str,
        source_run_id: int | None = None,
    ) -> None:
        values = {"model": _nonempty(model, "model"), "precision": parse_name("precision", precision),
                  "platform": _nonempty(platform, "platform", 64), "stage": parse_name("stage", stage),
                  "test_id": _nonempty(test_id, "test id"), "name": _nonempty(name, "metric name", 100)}
        extra = {"value": float(value), "unit": unit, "set_at": utcnow(), "source_run_id": source_run_id}
        with write_session(self.engine) as s:
            ins = _upsert(s)(MetricBaseline).values(**values, **extra)
            s.execute(ins.on_conflict_do_update(index_elements=list(values), set_=extra))


def rebuild_row_latest(engine: Engine) -> int:
    """Recompute the latest-run-per-row tables (``row_latest``, ``row_latest_kind``) and the summaries from the
    published runs' results (after bulk loads or deletes); returns the size of ``row_latest``."""
    with write_session(engine) as s:
        s.execute(delete(RowLatest))
        s.execute(delete(RowLatestKind))
        row = (Result.model, Result.precision, Result.platform, Result.job_toolchain, Result.variant)
        by_kind = (select(*row, Run.kind, func.max(Result.run_id))
                   .join(Run, Run.id == Result.run_id).where(Run.published_at.is_not(None))
                   .group_by(*row, Run.kind))
        key = ["model", "precision", "platform", "toolchain", "variant"]
        s.execute(RowLatestKind.__table__.insert().from_select([*key, "kind", "run_id"], by_kind))
        t = RowLatestKind  # a row's latest of any kind: the latest of its kinds' (one pass over the results)
        s.execute(RowLatest.__table__.insert().from_select(
            [*key, "run_id"], select(t.model, t.precision, t.platform, t.toolchain, t.variant, func.max(t.run_id))
            .group_by(t.model, t.precision, t.platform, t.toolchain, t.variant)))
        summaries.refresh(s)
        return int(s.scalar(select(func.count()).select_from(RowLatest)) or 0)
