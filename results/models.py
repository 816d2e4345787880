"""ORM models of the results database (SQLAlchemy 2 typed mappings).

Enums are stored as their string values in VARCHAR columns with named CHECK constraints (``native_enum=False``),
so adding a member is an ordinary migration on both SQLite and PostgreSQL. Timestamps are stored as naive UTC and
read back as aware UTC (:class:`UTCDateTime`), identically on both backends.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    false,
)
from sqlalchemy import Enum as SAEnum
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from artifacts.kinds import ArtifactKind, Packing
from edgellm.errors import ErrorKind
from edgellm.types import Precision
from stages import Stage
from toolchains.base import Toolchain

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class RunKind(enum.StrEnum):
    NIGHTLY = "nightly"
    L0 = "l0"
    L1 = "l1"
    ADHOC = "adhoc"


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    PASSED = "passed"  # every result passed (or was waived / not applicable / skipped by plan)
    FAILED = "failed"  # some result failed
    ERROR = "error"  # the run itself broke (infrastructure, bug)
    CANCELLED = "cancelled"


class RegressionSeverity(enum.StrEnum):
    FAIL = "fail"  # accuracy got worse: the row fails
    WARN = "warn"  # performance got worse: shown, the row still passes


class Route(enum.StrEnum):
    """How an engine was made, for toolchains with more than one way (TensorRT Edge-LLM)."""

    ONNX = "onnx"  # exported ONNX -> llm_build
    DIRECT = "direct"  # straight from the (quantized) checkpoint: tensorrt-edgellm-build


class ResultStatus(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    ERROR = "error"
    WAIVED = "waived"  # failed, but a known issue accepted by policy: not a failure, not a proof
    SKIPPED = "skipped"  # not run (an earlier stage failed, no device...)
    NOT_APPLICABLE = "not_applicable"  # the test does not apply to this model/precision/platform


def db_enum(cls: type[enum.StrEnum], name: str) -> SAEnum:
    return SAEnum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=32,
        values_callable=lambda e: [m.value for m in e],
        validate_strings=True,
    )


class UTCDateTime(TypeDecorator[datetime]):
    """Aware datetimes in, aware UTC out; stored naive UTC (SQLite has no time zones)."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass an aware datetime (UTC)")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


# BIGINT on PostgreSQL; INTEGER on SQLite so the primary key is the rowid alias (autoincrementing).
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    kind: Mapped[RunKind] = mapped_column(db_enum(RunKind, "run_kind"))
    trigger: Mapped[str] = mapped_column(String(200))
    code_version: Mapped[str] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[RunStatus] = mapped_column(db_enum(RunStatus, "run_status"), default=RunStatus.RUNNING)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # refreshed while the orchestrator lives
    host: Mapped[str | None] = mapped_column(String(200))  # the orchestrator's host and process
    pid: Mapped[int | None] = mapped_column(Integer)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # its results are evidence from then on

    results: Mapped[list[Result]] = relationship(back_populates="run", passive_deletes=True)
    toolchain: Mapped[list[ToolchainVersion]] = relationship(passive_deletes=True)


class Result(Base):
    """One stage of one test of one (model, precision, platform) in one run."""

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("run_id", "model", "precision", "platform", "stage", "test_id"),
        # "Which rows pass": per row, seek its latest run and read stage + status from the index alone.
        Index("ix_results_row_run", "model", "precision", "platform", "run_id", "stage", "status"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    model_revision: Mapped[str | None] = mapped_column(String(64))  # checkpoint sha256
    precision: Mapped[Precision] = mapped_column(db_enum(Precision, "precision"))
    platform: Mapped[str] = mapped_column(String(64))
    toolchain: Mapped[Toolchain] = mapped_column(db_enum(Toolchain, "toolchain"))
    toolchain_version: Mapped[str | None] = mapped_column(String(200))  # None: it never ran (plan decisions)
    device: Mapped[str | None] = mapped_column(String(200))
    stage: Mapped[Stage] = mapped_column(db_enum(Stage, "stage"))
    test_id: Mapped[str] = mapped_column(String(200))
    status: Mapped[ResultStatus] = mapped_column(db_enum(ResultStatus, "result_status"))
    reason: Mapped[str | None] = mapped_column(Text)
    error_kind: Mapped[ErrorKind | None] = mapped_column(db_enum(ErrorKind, "error_kind"))
    duration_s: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    route: Mapped[Route | None] = mapped_column(db_enum(Route, "route"))  # None: the toolchain has one route
    # ran on test stand-ins of the toolchain's tools: kept, never evidence (queries never count it as pass)
    standin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # the toolchain versions a matrix chose for this job ("name==version, ..."): two versions of one row in one
    # run are told apart by it; None: none chosen (each toolchain ran its pinned version)
    chosen_versions: Mapped[str | None] = mapped_column(String(300))

    run: Mapped[Run] = relationship(back_populates="results")
    metrics: Mapped[list[Metric]] = relationship(passive_deletes=True)


class RowLatest(Base):
    """Latest published run id per (model, precision, platform), moved when a run is published (see recorder)."""

    __tablename__ = "row_latest"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    precision: Mapped[Precision] = mapped_column(db_enum(Precision, "precision"), primary_key=True)
    platform: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)


class Metric(Base):
    __tablename__ = "metrics"
    __table_args__ = (UniqueConstraint("result_id", "name"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    result_id: Mapped[int] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    value: Mapped[float] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(32))


class MetricBaseline(Base):
    """A stored reference value for a metric, used by the regression query instead of a previous run."""

    __tablename__ = "metric_baselines"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    precision: Mapped[Precision] = mapped_column(db_enum(Precision, "precision"), primary_key=True)
    platform: Mapped[str] = mapped_column(String(64), primary_key=True)
    stage: Mapped[Stage] = mapped_column(db_enum(Stage, "stage"), primary_key=True)
    test_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[float] = mapped_column(Float)
    unit: Mapped[str] = mapped_column(String(32))
    set_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    source_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))


class ArtifactRecord(Base):
    """A reference from a run (and optionally one of its results) to a blob of the artifact store."""

    __tablename__ = "artifact_refs"
    __table_args__ = (UniqueConstraint("run_id", "result_id", "sha256", "kind"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    result_id: Mapped[int | None] = mapped_column(ForeignKey("results.id", ondelete="CASCADE"), index=True)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[ArtifactKind] = mapped_column(db_enum(ArtifactKind, "artifact_kind"))
    packing: Mapped[Packing] = mapped_column(db_enum(Packing, "packing"))
    size: Mapped[int] = mapped_column(BigInteger)
    path_hint: Mapped[str | None] = mapped_column(String(500))


class DeviceHealth(Base):
    __tablename__ = "device_health"
    __table_args__ = (Index("ix_device_health_device_time", "device_id", "checked_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    device_id: Mapped[str] = mapped_column(String(200))
    checked_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    reachable: Mapped[bool] = mapped_column(Boolean)
    disk_free_bytes: Mapped[int | None] = mapped_column(BigInteger)
    python_version: Mapped[str | None] = mapped_column(String(32))
    edgellm_version: Mapped[str | None] = mapped_column(String(64))
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class ToolchainVersion(Base):
    __tablename__ = "toolchain_versions"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    version: Mapped[str] = mapped_column(String(200))


class LeaseDevice(Base):
    """One row per leasable device: the row every acquire locks (``FOR UPDATE`` on PostgreSQL)."""

    __tablename__ = "lease_devices"

    device_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    max_jobs: Mapped[int] = mapped_column(Integer)


class DeviceLease(Base):
    """A held slot on a device. Times are epoch seconds of the database host's clock on PostgreSQL."""

    __tablename__ = "device_leases"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    device_id: Mapped[str] = mapped_column(ForeignKey("lease_devices.device_id", ondelete="CASCADE"), index=True)
    holder: Mapped[str] = mapped_column(String(300))  # host:pid:token
    acquired_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    ttl_s: Mapped[float] = mapped_column(Float)
    slots: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # max_jobs = exclusive


class Attempt(Base):
    """One try of a stage on one device. A stage retried on another device after an infrastructure failure has
    one result (its final outcome) and several attempts; the failed ones keep the device and the error kind."""

    __tablename__ = "attempts"
    __table_args__ = (Index("ix_attempts_run_row", "run_id", "model", "precision", "platform", "stage"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    precision: Mapped[Precision] = mapped_column(db_enum(Precision, "precision"))
    platform: Mapped[str] = mapped_column(String(64))
    stage: Mapped[Stage] = mapped_column(db_enum(Stage, "stage"))
    test_id: Mapped[str] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[ResultStatus] = mapped_column(db_enum(ResultStatus, "result_status"))
    error_kind: Mapped[ErrorKind | None] = mapped_column(db_enum(ErrorKind, "error_kind"))
    reason: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    toolchain: Mapped[Toolchain] = mapped_column(db_enum(Toolchain, "toolchain"))
    toolchain_version: Mapped[str | None] = mapped_column(String(200))


class CacheEntry(Base):
    """Content-keyed build cache: key = sha256 of everything an export or engine depends on -> the artifact."""

    __tablename__ = "cache_entries"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[ArtifactKind] = mapped_column(db_enum(ArtifactKind, "artifact_kind"))
    sha256: Mapped[str] = mapped_column(String(64))
    toolchain: Mapped[Toolchain | None] = mapped_column(db_enum(Toolchain, "toolchain"))  # None: the reference
    toolchain_version: Mapped[str | None] = mapped_column(String(200))
    inputs: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # what the key was computed from
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_used_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    hits: Mapped[int] = mapped_column(Integer, default=0)


class Regression(Base):
    """A metric of a finished run outside its baseline (median +- k * MAD of the last N finished nightly runs)."""

    __tablename__ = "regressions"
    __table_args__ = (UniqueConstraint("run_id", "model", "precision", "platform", "stage", "test_id", "metric"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    precision: Mapped[Precision] = mapped_column(db_enum(Precision, "precision"))
    platform: Mapped[str] = mapped_column(String(64))
    stage: Mapped[Stage] = mapped_column(db_enum(Stage, "stage"))
    test_id: Mapped[str] = mapped_column(String(200))
    metric: Mapped[str] = mapped_column(String(100))
    unit: Mapped[str] = mapped_column(String(32))
    value: Mapped[float] = mapped_column(Float)
    baseline: Mapped[float] = mapped_column(Float)  # median of the baseline runs
    spread: Mapped[float] = mapped_column(Float)  # their median absolute deviation
    baseline_runs: Mapped[int] = mapped_column(Integer)
    previous_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    change: Mapped[float] = mapped_column(Float)  # relative, positive = worse
    severity: Mapped[RegressionSeverity] = mapped_column(db_enum(RegressionSeverity, "regression_severity"))


class DeviceQuarantine(Base):
    """A device taken out of leasing because too many of its recent attempts failed for infrastructure reasons;
    released by the first passing health check after ``since``."""

    __tablename__ = "device_quarantine"
    __table_args__ = (Index("ix_device_quarantine_device_released", "device_id", "released_at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    device_id: Mapped[str] = mapped_column(String(200))
    since: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    reason: Mapped[str] = mapped_column(Text)
    error_rate: Mapped[float] = mapped_column(Float)
    released_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    released_by: Mapped[int | None] = mapped_column(ForeignKey("device_health.id", ondelete="SET NULL"))
