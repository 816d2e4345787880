"""ORM models of the results database (SQLAlchemy 2 typed mappings).

Two kinds of vocabulary live in its columns. The OPEN ones are the farm's extension points: precision, stage,
toolchain, route and run kind. Each has one registry in code (:data:`VOCABULARIES`, the one place a column learns
its registry) and is stored as a plain string with no CHECK constraint: its column type (:class:`VocabularyName`)
checks a name through the registry when it is written (an unknown one raises the registry's ConfigurationError,
naming it and every valid one) and reads a known name back as the registry's member (the same enum member as
ever, so ``is`` comparisons hold) and an unknown one, written by a newer farm, as an :class:`UnknownName` string
instead of failing. Adding a precision or a toolchain is then a change of code only, never a migration (migration
0008 dropped their constraints: frozen copies of open lists in migrations drift, as ``regressions.precision``
did without ``mxfp8``). The CLOSED ones are internal state machines (result and run status, error kind,
regression severity, artifact kind, packing): they keep named CHECK constraints (``db_enum``, ``native_enum=False``),
a new member of one is a deliberate migration, and ``tests/test_results_vocabularies.py`` compares every CHECK list
of a freshly migrated database with its enum on both backends, so the two cannot drift. Timestamps are stored as
naive UTC and read back as aware UTC (:class:`UTCDateTime`), identically on both backends.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

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

from edgefarm import stages
from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.toolchains import base as toolchains
from edgefarm.vocabulary.route import Route
from edgefarm.vocabulary.status import (
    ResultStatus as ResultStatus,  # its home is the vocabulary; imported from here too
)
from edgellm.errors import BugError, ConfigurationError, EdgeLLMError, ErrorKind
from edgellm.types import Precision

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
    BRINGUP = "bringup"  # edgefarm bring-up: a checkpoint up the add-model ladder (flows.bringup)


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    PASSED = "passed"  # every result passed (or was waived / not applicable / skipped by plan)
    FAILED = "failed"  # some result failed
    ERROR = "error"  # the run itself broke (infrastructure, bug)
    CANCELLED = "cancelled"


class RegressionSeverity(enum.StrEnum):
    FAIL = "fail"  # accuracy got worse: the row fails
    WARN = "warn"  # performance got worse: shown, the row still passes


def db_enum(cls: type[enum.StrEnum], name: str) -> SAEnum:
    """A CLOSED vocabulary's column (a state machine, see the module doc): VARCHAR(32) with a named CHECK."""
    return SAEnum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=32,
        values_callable=lambda e: [m.value for m in e],
        validate_strings=True,
    )


E = TypeVar("E", bound=enum.Enum)


def parse_choice(cls: type[E], value: Any, what: str) -> E:
    """``value`` as a member of ``cls``; the error names the bad value and every valid one."""
    if isinstance(value, cls):
        return value
    try:
        return cls(str(value).strip().lower())
    except ValueError:
        choices = ", ".join(str(m.value) for m in cls)
        raise ConfigurationError(f"unknown {what} {value!r}; valid: {choices}") from None


# The open vocabularies (see the module doc): name -> the parse function of its one registry in code, which gives
# a known name's member and raises a ConfigurationError naming an unknown one and every valid one. The columns,
# the recorder, the build cache and the queries all check names through this table, so a registry is plugged in
# here and nowhere else (the toolchain's line follows toolchains' registry).
VOCABULARIES: dict[str, Callable[[Any], Any]] = {
    "precision": lambda v: Precision.parse(v, what="precision"),
    "stage": lambda v: stages.recorded_stage(v, what="stage"),
    "toolchain": lambda v: RegisteredName(toolchains.parse(v, what="toolchain")),
    "route": lambda v: Route.parse(v, what="route"),
    "run_kind": lambda v: parse_choice(RunKind, v, "run kind"),
}


def parse_name(vocabulary: str, value: Any) -> Any:
    """``value`` checked by the registry of ``vocabulary``: its member, else a ConfigurationError naming it."""
    return VOCABULARIES[vocabulary](value)


def _stored(name: Any) -> str:
    """What the column holds for a registry's member: an enum member's value, any other name as a string."""
    return str(getattr(name, "value", name))


class RegisteredName(str):
    """A name of a registry that is not an enum (the toolchain drivers'): a plain string whose ``.value`` is itself,
    like the enum members of the other vocabularies, so readers that show ``x.value`` read every vocabulary alike."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str(self)


class UnknownName(RegisteredName):
    """A name read from the database that this farm's registry does not know (a newer farm wrote it)."""

    __slots__ = ()


class _ComparedName(TypeDecorator[Any]):
    """The bind type of a name compared with an open-vocabulary column: the string, unchecked."""

    impl = String
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else _stored(value)


class VocabularyName(TypeDecorator[Any]):
    """A name of an open vocabulary (a key of :data:`VOCABULARIES`): VARCHAR(32), no CHECK constraint.

    Written (INSERT values, UPDATE SET): checked by the vocabulary's registry, whose error names the bad value and
    the valid ones. Read: the registry's member (the same enum member as ever), or an :class:`UnknownName` for a
    name it does not know. Compared (``col == x``, ``col.in_(...)``): bound as the string, unchecked, so a filter
    by a name read from a newer farm's rows works; a name a person gives is parsed where it enters (queries, CLI).
    Its columns are typed ``Mapped[str]``: a member (a StrEnum) or an UnknownName, both strings.
    """

    impl = String
    cache_ok = True  # its one argument, the vocabulary's name, is its cache key

    def __init__(self, vocabulary: str) -> None:
        if vocabulary not in VOCABULARIES:
            raise BugError(f"unknown vocabulary {vocabulary!r}; valid: {', '.join(VOCABULARIES)}")
        super().__init__(32)
        self.vocabulary = vocabulary
        # parse function -> {stored name: its enum member}: an enum never loses a member, so a name once known keeps
        # it; reads then cost a dict lookup, as an Enum column's did (benchmarks/bench_db.py). Names of registries
        # that can lose one (the stage table, the toolchain drivers: tests unregister theirs) are parsed each time.
        self._known: dict[Callable[[Any], Any], dict[str, Any]] = {}

    def process_bind_param(self, value: Any, dialect: Any) -> str | None:
        return None if value is None else _stored(parse_name(self.vocabulary, value))

    def process_result_value(self, value: str | None, dialect: Any) -> Any:
        if value is None:
            return None
        parse = VOCABULARIES[self.vocabulary]
        known = self._known.get(parse)
        if known is None:
            known = self._known[parse] = {}
        member = known.get(value)
        if member is None:
            try:
                member = parse(value)
            except EdgeLLMError:  # ConfigurationError, or a registry's UnsupportedError
                return UnknownName(value)
            if isinstance(member, enum.Enum):  # an enum never loses a member; a table or driver registry may
                known[value] = member
        return member

    def coerce_compared_value(self, op: Any, value: Any) -> Any:
        return _ComparedName()


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
    kind: Mapped[str] = mapped_column(VocabularyName("run_kind"))
    trigger: Mapped[str] = mapped_column(String(200))
    code_version: Mapped[str] = mapped_column(String(100))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    status: Mapped[RunStatus] = mapped_column(db_enum(RunStatus, "run_status"), default=RunStatus.RUNNING)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # refreshed while the orchestrator lives
    host: Mapped[str | None] = mapped_column(String(200))  # the orchestrator's host and process
    pid: Mapped[int | None] = mapped_column(Integer)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)  # its results are evidence from then on
    report: Mapped[str | None] = mapped_column(String(1000))  # a report directory it wrote (a bring-up's)

    results: Mapped[list[Result]] = relationship(back_populates="run", passive_deletes=True)
    toolchain: Mapped[list[ToolchainVersion]] = relationship(passive_deletes=True)


class Result(Base):
    """One stage of one test of one row (model, precision, platform, job toolchain, variant) in one run."""

    __tablename__ = "results"
    __table_args__ = (
        UniqueConstraint("run_id", "model", "precision", "platform", "stage", "test_id"),
        # "Which rows pass": per row, seek its latest run and read stage, status and stand-in from the index alone.
        Index("ix_results_row_run", "model", "precision", "platform", "job_toolchain", "variant", "run_id", "stage",
              "status", "standin"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    model: Mapped[str] = mapped_column(String(200))
    model_revision: Mapped[str | None] = mapped_column(String(64))  # checkpoint sha256
    precision: Mapped[str] = mapped_column(VocabularyName("precision"))
    platform: Mapped[str] = mapped_column(String(64))
    # the toolchain that made this stage's result: for a quantize stage the quantizer's, which may be another
    # toolchain than the job's; for every other stage the job's
    toolchain: Mapped[str] = mapped_column(VocabularyName("toolchain"))
    toolchain_version: Mapped[str | None] = mapped_column(String(200))  # None: it never ran (plan decisions)
    # the toolchain the job ran with: part of the row's key (a platform may run two toolchains side by side)
    job_toolchain: Mapped[str] = mapped_column(VocabularyName("toolchain"))
    # the row's variant (vocabulary.variant.variant_key: KV cache, LM head, draft, LoRA, vocabulary...; '' default):
    # part of the row's key, a plain string (a new variant feature needs no migration)
    variant: Mapped[str] = mapped_column(String(300), default="", server_default="")
    device: Mapped[str | None] = mapped_column(String(200))
    stage: Mapped[str] = mapped_column(VocabularyName("stage"))
    test_id: Mapped[str] = mapped_column(String(200))
    status: Mapped[ResultStatus] = mapped_column(db_enum(ResultStatus, "result_status"))
    reason: Mapped[str | None] = mapped_column(Text)
    error_kind: Mapped[ErrorKind | None] = mapped_column(db_enum(ErrorKind, "error_kind"))
    duration_s: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    route: Mapped[str | None] = mapped_column(VocabularyName("route"))  # None: the toolchain has one route
    # ran on test stand-ins of the toolchain's tools: kept, never evidence (queries never count it as pass)
    standin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # the toolchain versions a matrix chose for this job ("name==version, ..."): two versions of one row in one
    # run are told apart by it; None: none chosen (each toolchain ran its pinned version)
    chosen_versions: Mapped[str | None] = mapped_column(String(300))
    # the environment it ran in (Environment.digest): the device's for a device stage, the orchestrator's otherwise
    environment: Mapped[str | None] = mapped_column(ForeignKey("environments.digest"))
    # how a benchmark's board differed from its device type's benchmark conditions (power mode, locked clocks);
    # None: they matched, or do not apply. Regressions compare only results of equal conditions.
    bench_conditions: Mapped[str | None] = mapped_column(String(300))

    run: Mapped[Run] = relationship(back_populates="results")
    metrics: Mapped[list[Metric]] = relationship(passive_deletes=True)


class BringupRung(Base):
    """One rung of a bring-up's add-model ladder (``flows.bringup``), in the order it was climbed: its status (the
    results' vocabulary: pass, fail, error, not_applicable, skipped), why, and its evidence (JSON)."""

    __tablename__ = "bringup_rungs"
    __table_args__ = (UniqueConstraint("run_id", "position"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(32))
    checkpoint_sha256: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)
    duration_s: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunWorker(Base):
    """A process that took part in a run: the orchestrator that ran its flow, and every worker a stage was sent to
    (a quantize on a quantization pool). Its code revision (git commit, and the digest of the farm's source files,
    which is what must match), the pool it serves, its host and data dir, and the toolchain versions it had. A
    dispatched stage's outcome comes back through ``outcome`` (JSON), keyed by the Prefect flow run that made it."""

    __tablename__ = "run_workers"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    role: Mapped[str] = mapped_column(String(32))  # orchestrator | the stage it ran (quantize)
    pool: Mapped[str | None] = mapped_column(String(200))  # the work pool it serves (None: not a deployment run)
    host: Mapped[str] = mapped_column(String(200))
    data_dir: Mapped[str] = mapped_column(String(1000))
    revision: Mapped[str] = mapped_column(String(100))  # git commit (+ -dirty), or edgellm-<version>
    source_digest: Mapped[str] = mapped_column(String(64))  # sha256 of the farm's source files
    toolchains: Mapped[dict[str, Any]] = mapped_column(JSON)  # {name: version} it had
    flow_run_id: Mapped[str | None] = mapped_column(String(64), index=True)
    accepted: Mapped[bool] = mapped_column(Boolean, default=True)  # False: it refused (another revision)
    reason: Mapped[str | None] = mapped_column(Text)
    outcome: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # a dispatched stage's outcome (stages.wire)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Bisection(Base):
    """An answer of ``edgefarm bisect``: of a row (model, precision, platform, job toolchain; the good and bad runs
    when the row form was used) or of a checkpoint (its digest), between two ends (as given and as resolved), with
    the first bad commit (full sha) and its subject, the last good one, and every probe (JSON). ``bisected`` names
    the input: this repository's commits (``revision``, also NULL), the checkpoint's commits (``checkpoint``) or the
    versions of the toolchain in ``toolchain`` (``toolchain``: the ends, the first bad and the last good are then
    versions). Names are plain strings (``results.bisections`` reads and writes it)."""

    __tablename__ = "bisections"
    __table_args__ = (Index("ix_bisections_model_precision_platform", "model", "precision", "platform"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    model: Mapped[str | None] = mapped_column(String(200))  # None: a --checkpoint bisection
    precision: Mapped[str] = mapped_column(String(64))
    platform: Mapped[str] = mapped_column(String(100))
    toolchain: Mapped[str | None] = mapped_column(String(100))
    checkpoint_sha256: Mapped[str | None] = mapped_column(String(64))
    good_ref: Mapped[str] = mapped_column(String(200))  # as given: a revision, or a run id with --row
    bad_ref: Mapped[str] = mapped_column(String(200))
    good_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    bad_run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"), index=True)
    good_sha: Mapped[str | None] = mapped_column(String(64))
    bad_sha: Mapped[str | None] = mapped_column(String(64))
    found: Mapped[bool] = mapped_column(Boolean)
    reason: Mapped[str | None] = mapped_column(Text)  # why not found
    first_bad: Mapped[str | None] = mapped_column(String(64))
    first_bad_subject: Mapped[str | None] = mapped_column(Text)
    last_good: Mapped[str | None] = mapped_column(String(64))
    probes: Mapped[list[Any]] = mapped_column(JSON)  # [{revision, status, seconds, ...}]
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    bisected: Mapped[str | None] = mapped_column(String(32))  # revision (NULL too), checkpoint or toolchain


class Environment(Base):
    """One distinct environment results ran in (a device's: L4T/JetPack, the runtime libraries, CUDA, driver, the
    toolchain build's release and revision, power mode, clocks; or the orchestrator's), stored once by its digest."""

    __tablename__ = "environments"

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the canonical JSON of data
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RowLatest(Base):
    """Latest published run id per row (model, precision, platform, job toolchain, variant), moved when a run is
    published (see recorder)."""

    __tablename__ = "row_latest"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    precision: Mapped[str] = mapped_column(VocabularyName("precision"), primary_key=True)
    platform: Mapped[str] = mapped_column(String(64), primary_key=True)
    toolchain: Mapped[str] = mapped_column(VocabularyName("toolchain"), primary_key=True)  # Result.job_toolchain
    variant: Mapped[str] = mapped_column(String(300), primary_key=True, default="", server_default="")
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    # the row's verdict in that run judged with queries.DEFAULT_REQUIRED, every chosen version together (what
    # passing_rows asks); kept with its tallies when the run is published (results.summaries)
    verdict: Mapped[str | None] = mapped_column(String(16))


class RowLatestKind(Base):
    """Latest published run id per row and run kind: the pages of one kind (the nightly's: each row's latest nightly)
    read it instead of every result of that kind; moved with ``row_latest`` when a run is published (see recorder)."""

    __tablename__ = "row_latest_kind"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    precision: Mapped[str] = mapped_column(VocabularyName("precision"), primary_key=True)
    platform: Mapped[str] = mapped_column(String(64), primary_key=True)
    toolchain: Mapped[str] = mapped_column(VocabularyName("toolchain"), primary_key=True)  # Result.job_toolchain
    variant: Mapped[str] = mapped_column(String(300), primary_key=True)
    kind: Mapped[str] = mapped_column(VocabularyName("run_kind"), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)


class RowTally(Base):
    """A row's results in its latest run, one per chosen toolchain versions ('' none chosen), counted by (stage,
    status, toolchain, version, stand-in, route) and packed into one string (results.summaries): the pages read
    these, one per row, instead of the row's results. Kept when a run is published."""

    __tablename__ = "row_tallies"

    model: Mapped[str] = mapped_column(String(200), primary_key=True)
    precision: Mapped[str] = mapped_column(VocabularyName("precision"), primary_key=True)
    platform: Mapped[str] = mapped_column(String(64), primary_key=True)
    toolchain: Mapped[str] = mapped_column(VocabularyName("toolchain"), primary_key=True)  # Result.job_toolchain
    variant: Mapped[str] = mapped_column(String(300), primary_key=True)
    chosen_versions: Mapped[str] = mapped_column(String(300), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    packed: Mapped[str] = mapped_column(Text)


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
    precision: Mapped[str] = mapped_column(VocabularyName("precision"), primary_key=True)
    platform: Mapped[str] = mapped_column(String(64), primary_key=True)
    stage: Mapped[str] = mapped_column(VocabularyName("stage"), primary_key=True)
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
    precision: Mapped[str] = mapped_column(VocabularyName("precision"))
    platform: Mapped[str] = mapped_column(String(64))
    stage: Mapped[str] = mapped_column(VocabularyName("stage"))
    test_id: Mapped[str] = mapped_column(String(200))
    device: Mapped[str | None] = mapped_column(String(200))
    status: Mapped[ResultStatus] = mapped_column(db_enum(ResultStatus, "result_status"))
    error_kind: Mapped[ErrorKind | None] = mapped_column(db_enum(ErrorKind, "error_kind"))
    reason: Mapped[str | None] = mapped_column(Text)
    duration_s: Mapped[float | None] = mapped_column(Float)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    toolchain: Mapped[str] = mapped_column(VocabularyName("toolchain"))
    toolchain_version: Mapped[str | None] = mapped_column(String(200))


class CacheEntry(Base):
    """Content-keyed build cache: key = sha256 of everything an export or engine depends on -> the artifact."""

    __tablename__ = "cache_entries"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[ArtifactKind] = mapped_column(db_enum(ArtifactKind, "artifact_kind"))
    sha256: Mapped[str] = mapped_column(String(64))
    toolchain: Mapped[str | None] = mapped_column(VocabularyName("toolchain"))  # None: the reference
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
    precision: Mapped[str] = mapped_column(VocabularyName("precision"))
    platform: Mapped[str] = mapped_column(String(64))
    stage: Mapped[str] = mapped_column(VocabularyName("stage"))
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
