"""Open and closed vocabularies in the results database, on SQLite and PostgreSQL.

Open ones (precision, stage, toolchain, route, run kind) are plain strings checked by their registry in code
(``results.models.VOCABULARIES``): migration 0008 dropped their CHECK constraints, a name new to a registry is
written without a migration, an unknown one is refused in Python naming it, and one a newer farm wrote is read
back. Closed ones (statuses, error kind, severity, artifact kind, packing) keep CHECK constraints, which must list
exactly their enum's members.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, func, inspect, select, text
from sqlalchemy import Enum as SAEnum
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.orm import Session

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.results import cache, models, summaries
from edgefarm.results.db import make_engine
from edgefarm.results.errors import classify
from edgefarm.results.migrate import alembic_config, current_revision, head_revision, schema_diff, upgrade
from edgefarm.results.models import (
    Attempt,
    Base,
    MetricBaseline,
    Regression,
    Result,
    RowLatest,
    Run,
    RunKind,
    UnknownName,
    VocabularyName,
)
from edgefarm.results.queries import RowKey, Verdict, latest_status, passing_rows, row_history
from edgefarm.results.recorder import Recorder
from edgefarm.results.regressions import flag_regressions, published_regressions
from edgefarm.stages import Stage
from edgefarm.toolchains.base import Route
from edgellm.errors import BugError, ConfigurationError
from edgellm.types import Precision

# Every open-vocabulary column: (table, column) -> vocabulary. Written out so a column that silently goes back to
# a constrained enum (or a new one that forgets the type) fails here.
OPEN_COLUMNS = {
    ("runs", "kind"): "run_kind",
    ("results", "precision"): "precision",
    ("results", "stage"): "stage",
    ("results", "toolchain"): "toolchain",
    ("results", "job_toolchain"): "toolchain",
    ("results", "route"): "route",
    ("row_latest", "precision"): "precision",
    ("row_latest", "toolchain"): "toolchain",
    ("row_tallies", "precision"): "precision",
    ("row_tallies", "toolchain"): "toolchain",
    ("row_latest_kind", "precision"): "precision",
    ("row_latest_kind", "toolchain"): "toolchain",
    ("row_latest_kind", "kind"): "run_kind",
    ("metric_baselines", "precision"): "precision",
    ("metric_baselines", "stage"): "stage",
    ("attempts", "precision"): "precision",
    ("attempts", "stage"): "stage",
    ("attempts", "toolchain"): "toolchain",
    ("cache_entries", "toolchain"): "toolchain",
    ("regressions", "precision"): "precision",
    ("regressions", "stage"): "stage",
}
# made by 0009, 0017 and 0018, never with a CHECK
NEWER_COLUMNS = {("results", "job_toolchain"), ("row_latest", "toolchain"), ("row_tallies", "precision"),
                 ("row_tallies", "toolchain"), ("row_latest_kind", "precision"), ("row_latest_kind", "toolchain"),
                 ("row_latest_kind", "kind")}
KNOWN = {"precision": "fp16", "stage": "infer", "toolchain": "edgellm-ort", "route": "onnx", "run_kind": "l0"}
T0 = "2026-11-01 02:00:00"
SHA = "ab" * 32


@dataclass(frozen=True)
class Check:
    table: str
    name: str
    column: str
    values: tuple[str, ...]


def _balanced(sql: str, start: int) -> str:
    """The text inside the parenthesis opened just before ``start`` (quotes respected)."""
    depth, quoted = 1, False
    for i in range(start, len(sql)):
        ch = sql[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
            if depth == 0:
                return sql[start:i]
    raise AssertionError(f"unbalanced CHECK in {sql!r}")


def _quoted(sql: str) -> tuple[str, ...]:
    return tuple(v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", sql))


def db_checks(conn: Connection) -> list[Check]:
    """Every CHECK constraint of the database, read from the catalog: sqlite_master's CREATE TABLE text, or
    PostgreSQL's pg_constraint."""
    found = []
    if conn.dialect.name == "sqlite":
        for table, sql in conn.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'table'"):
            for m in re.finditer(r'CONSTRAINT\s+"?(\w+)"?\s+CHECK\s*\(', sql):
                body = _balanced(sql, m.end())
                column = re.match(r'\s*\(?\s*"?(\w+)"?\s+IN\s*\(', body)
                assert column, f"unexpected CHECK {m.group(1)}: {body}"
                found.append(Check(table, m.group(1), column.group(1), _quoted(body)))
        return found
    rows = conn.exec_driver_sql(
        "SELECT cl.relname, con.conname, pg_get_constraintdef(con.oid), "
        "  (SELECT array_agg(a.attname::text) FROM pg_attribute a "
        "   WHERE a.attrelid = con.conrelid AND a.attnum = ANY(con.conkey)) "
        "FROM pg_constraint con JOIN pg_class cl ON cl.oid = con.conrelid "
        "JOIN pg_namespace ns ON ns.oid = cl.relnamespace "
        "WHERE con.contype = 'c' AND ns.nspname = current_schema()")
    for table, name, definition, columns in rows:
        assert len(columns) == 1, f"CHECK {name} covers {columns}"
        found.append(Check(table, name, columns[0], _quoted(definition)))
    return found


def closed_columns() -> dict[tuple[str, str], SAEnum]:
    """The models' constrained enum columns: (table, column) -> its Enum type."""
    return {(t.name, c.name): c.type for t in Base.metadata.sorted_tables for c in t.columns
            if isinstance(c.type, SAEnum)}


def _engine(url: str) -> Iterator[Engine]:
    engine = make_engine(url)
    yield engine
    engine.dispose()


@pytest.fixture
def engine(migrated_db_url: str) -> Iterator[Engine]:
    yield from _engine(migrated_db_url)


@pytest.fixture
def empty(db_url: str) -> Iterator[Engine]:
    yield from _engine(db_url)


# -- the models ------------------------------------------------------------------------------------------------------
def test_the_open_vocabulary_columns_are_the_registry_checked_ones() -> None:
    columns = {(t.name, c.name): c.type.vocabulary for t in Base.metadata.sorted_tables for c in t.columns
               if isinstance(c.type, VocabularyName)}
    assert columns == OPEN_COLUMNS
    assert set(OPEN_COLUMNS.values()) == set(models.VOCABULARIES)
    assert not set(OPEN_COLUMNS) & set(closed_columns())


@pytest.mark.parametrize(("table", "column"), sorted(OPEN_COLUMNS))
def test_every_open_column_refuses_an_unknown_name_naming_it_and_the_valid_ones(table: str, column: str) -> None:
    col_type = Base.metadata.tables[table].c[column].type
    with pytest.raises(ConfigurationError, match=r"unknown .*'no-such-name'") as info:
        col_type.process_bind_param("no-such-name", None)
    assert KNOWN[OPEN_COLUMNS[(table, column)]] in str(info.value)  # and the valid ones


# -- the migrated schema -------------------------------------------------------------------------------------------
def _assert_checks_match_enums(engine: Engine) -> None:
    with engine.connect() as conn:
        checks = db_checks(conn)
    closed = closed_columns()
    by_column = {(c.table, c.column): c for c in checks}
    assert len(by_column) == len(checks), checks  # one CHECK per column
    assert set(by_column) == set(closed), "CHECK constraints and the models' closed enums cover other columns"
    for key, check in by_column.items():
        enum_type = closed[key]
        assert check.name == f"ck_{key[0]}_{enum_type.name}"
        assert check.values == tuple(enum_type.enums), f"{check.name} lists {check.values}, enum {enum_type.enums}"


def _assert_open_columns_unchecked(engine: Engine) -> None:
    with engine.connect() as conn:
        checked = {(c.table, c.column): c.name for c in db_checks(conn)}
    assert not {k: checked[k] for k in OPEN_COLUMNS if k in checked}


def test_every_check_list_of_a_migrated_database_is_its_enum(engine: Engine) -> None:
    _assert_checks_match_enums(engine)


def test_no_open_vocabulary_column_has_a_check_after_upgrade(empty: Engine) -> None:
    assert upgrade(empty) == head_revision()
    _assert_open_columns_unchecked(empty)
    _assert_checks_match_enums(empty)
    assert schema_diff(empty) == []


def test_the_check_reader_sees_the_open_checks_of_0007(empty: Engine) -> None:
    """The reader above finds what 0008 removes (so the tests using it are not vacuous)."""
    upgrade(empty, "0007")
    with empty.connect() as conn:
        checked = {(c.table, c.column) for c in db_checks(conn)}
    assert {k for k in OPEN_COLUMNS if k not in NEWER_COLUMNS} <= checked


def _dump(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    with engine.connect() as conn:
        tables = [t for t in inspect(conn).get_table_names() if t != "alembic_version"]
        return {t: sorted((tuple(r) for r in conn.execute(text(f'SELECT * FROM "{t}"'))), key=repr) for t in tables}


def _layout(engine: Engine) -> dict[str, Any]:
    """Indexes, unique constraints and foreign keys per table."""
    insp = inspect(engine)
    return {t: (sorted((i["name"], tuple(i["column_names"])) for i in insp.get_indexes(t)),
                sorted((u["name"], tuple(u["column_names"])) for u in insp.get_unique_constraints(t)),
                sorted((f["name"], tuple(f["constrained_columns"]), f["referred_table"],
                        f["options"].get("ondelete")) for f in insp.get_foreign_keys(t)))
            for t in insp.get_table_names()}


def _fill_0007(conn: Connection) -> None:
    """Rows in every table, as a 0007 farm wrote them (every name then allowed)."""
    def sql(statement: str, *rows: dict[str, Any]) -> None:
        conn.execute(text(statement), list(rows) or [{}])

    sql("INSERT INTO runs (id, kind, trigger, code_version, started_at, finished_at, status, heartbeat_at, host, "
        "pid, published_at) VALUES (:id, :k, 'cron', 'v1', :t, :t, :s, :t, 'h', 7, :p)",
        {"id": 1, "k": "nightly", "t": T0, "s": "passed", "p": T0},
        {"id": 2, "k": "l0", "t": T0, "s": "running", "p": None})
    sql("INSERT INTO toolchain_versions (run_id, name, version) VALUES (1, 'onnxruntime', '1.20'), (2, 'x', 'y')")
    sql("INSERT INTO results (id, run_id, model, model_revision, precision, platform, device, stage, test_id, status, "
        "reason, error_kind, duration_s, recorded_at, toolchain, toolchain_version, route, standin, chosen_versions) "
        "VALUES (:id, :run, 'm', :rev, :p, 'orin', 'd1', :st, 't', :status, :why, :ek, 1.5, :t, :tc, '1.0', :route, "
        ":standin, :chosen)",
        {"id": 1, "run": 1, "rev": SHA, "p": "fp16", "st": "infer", "status": "pass", "why": None, "ek": None,
         "t": T0, "tc": "edgellm-ort", "route": None, "standin": False, "chosen": None},
        {"id": 2, "run": 1, "rev": None, "p": "mxfp8", "st": "build", "status": "fail", "why": "boom",
         "ek": "test_failure", "t": T0, "tc": "tensorrt-edgellm", "route": "direct", "standin": True,
         "chosen": "tensorrt-edgellm==0.4"},
        {"id": 3, "run": 2, "rev": None, "p": "int4_awq", "st": "quantize", "status": "skipped", "why": None,
         "ek": None, "t": T0, "tc": "edgellm-torch-cuda", "route": "onnx", "standin": False, "chosen": None})
    sql("INSERT INTO metrics (result_id, name, value, unit) VALUES (1, 'ttft_ms', 3.5, 'ms'), (2, 'size', 9, 'B')")
    sql("INSERT INTO artifact_refs (run_id, result_id, sha256, kind, packing, size, path_hint) VALUES "
        "(1, 1, :sha, 'engine', 'tar', 10, 'e'), (1, NULL, :sha, 'log', 'file', 5, NULL)", {"sha": SHA})
    sql("INSERT INTO row_latest (model, precision, platform, run_id) VALUES ('m', 'fp16', 'orin', 1), "
        "('m', 'mxfp8', 'orin', 1)")
    sql("INSERT INTO metric_baselines (model, precision, platform, stage, test_id, name, value, unit, set_at, "
        "source_run_id) VALUES ('m', 'mxfp8', 'orin', 'bench', 't', 'ttft_ms', 3.0, 'ms', :t, 1)", {"t": T0})
    sql("INSERT INTO attempts (run_id, model, precision, platform, stage, test_id, device, status, error_kind, "
        "reason, duration_s, recorded_at, toolchain, toolchain_version) VALUES "
        "(1, 'm', 'mxfp8', 'orin', 'build', 't', 'd1', 'error', 'infrastructure', 'lost', 2.0, :t, "
        "'tensorrt-edgellm', '0.4')", {"t": T0})
    sql("INSERT INTO cache_entries (key, kind, sha256, inputs, created_at, last_used_at, hits, toolchain, "
        "toolchain_version) VALUES (:k1, 'engine', :sha, '{\"stage\": \"build\"}', :t, :t, 2, 'edgellm-ort', '1'), "
        "(:k2, 'checkpoint', :sha, '{}', :t, :t, 0, NULL, NULL)", {"k1": "1" * 64, "k2": "2" * 64, "sha": SHA, "t": T0})
    sql("INSERT INTO regressions (run_id, model, precision, platform, stage, test_id, metric, unit, value, baseline, "
        "spread, baseline_runs, previous_run_id, change, severity) VALUES "
        "(2, 'm', 'fp16', 'orin', 'bench', 't', 'ttft_ms', 'ms', 5.0, 3.0, 0.1, 3, 1, 0.6, 'warn')")
    sql("INSERT INTO device_health (id, device_id, checked_at, reachable, details) VALUES (1, 'd1', :t, true, '{}')",
        {"t": T0})
    sql("INSERT INTO device_quarantine (device_id, since, reason, error_rate, released_by) "
        "VALUES ('d1', :t, 'flaky', 0.5, 1)", {"t": T0})
    sql("INSERT INTO lease_devices (device_id, max_jobs) VALUES ('d1', 2)")
    sql("INSERT INTO device_leases (device_id, holder, acquired_at, heartbeat_at, ttl_s, slots) "
        "VALUES ('d1', 'h:1:x', 1.0, 2.0, 30.0, 2)")


def test_upgrade_from_0007_keeps_every_row_index_and_key(empty: Engine) -> None:
    assert upgrade(empty, "0007") == "0007"
    with empty.begin() as conn:
        _fill_0007(conn)
    before, layout = _dump(empty), _layout(empty)
    assert all(before.values()), {t: len(r) for t, r in before.items()}
    assert upgrade(empty, "0008") == "0008"  # 0009 adds columns (tests/test_row_toolchain.py)
    assert _dump(empty) == before
    assert _layout(empty) == layout
    _assert_open_columns_unchecked(empty)
    assert upgrade(empty) == head_revision()
    _assert_open_columns_unchecked(empty)
    _assert_checks_match_enums(empty)
    assert schema_diff(empty) == []
    if empty.dialect.name == "sqlite":  # migrated with foreign keys off, handed back with them on
        with empty.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
            assert not conn.exec_driver_sql("SELECT name FROM sqlite_master WHERE name LIKE '_alembic_tmp%'").all()
    with Session(empty) as s:  # the ORM reads the migrated rows as the same members as ever
        r = s.get(Result, 2)
        assert r is not None
        assert (r.precision, r.stage, r.toolchain, r.route) == ("mxfp8", "build", "tensorrt-edgellm", "direct")
        assert r.precision is Precision.MXFP8 and r.stage is Stage.BUILD
        assert r.toolchain == "tensorrt-edgellm" and r.route is Route.DIRECT  # a route the registry knows again


def test_downgrade_leaves_the_columns_open_and_upgrade_runs_again(empty: Engine) -> None:
    upgrade(empty)
    cfg = alembic_config()
    with empty.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0007")
        conn.commit()
    assert current_revision(empty) == "0007"
    _assert_open_columns_unchecked(empty)  # documented no-op
    assert upgrade(empty) == head_revision()
    _assert_checks_match_enums(empty)


def _regression(run_id: int, precision: str) -> dict[str, Any]:
    return {"run_id": run_id, "model": "m", "precision": precision, "platform": "orin", "stage": "bench",
            "test_id": "t", "metric": "ttft_ms", "unit": "ms", "value": 5.0, "baseline": 3.0, "spread": 0.1,
            "baseline_runs": 3, "previous_run_id": None, "change": 0.6, "severity": "warn"}


INSERT_REGRESSION = text(
    "INSERT INTO regressions (run_id, model, precision, platform, stage, test_id, metric, unit, value, baseline, "
    "spread, baseline_runs, previous_run_id, change, severity) VALUES (:run_id, :model, :precision, :platform, "
    ":stage, :test_id, :metric, :unit, :value, :baseline, :spread, :baseline_runs, :previous_run_id, :change, "
    ":severity)")


def test_an_mxfp8_regression_refused_at_0007_is_stored_after_0008(empty: Engine) -> None:
    upgrade(empty, "0007")
    with empty.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, kind, trigger, code_version, started_at, status) "
                          "VALUES (1, 'nightly', 'cron', 'v1', :t, 'passed')"), {"t": T0})
    with pytest.raises(IntegrityError, match="ck_regressions_precision"), empty.begin() as conn:
        conn.execute(INSERT_REGRESSION, _regression(1, "mxfp8"))
    upgrade(empty)
    with empty.begin() as conn:
        conn.execute(INSERT_REGRESSION, _regression(1, "mxfp8"))
    with Session(empty) as s, s.begin():  # and through the ORM, as flag_regressions writes them
        s.add(Regression(**{**_regression(1, Precision.MXFP8), "metric": "decode_ms_per_token"}))
    flags = published_regressions(empty, run_id=1)
    assert [(f.precision, f.metric) for f in flags] == [("mxfp8", "decode_ms_per_token"), ("mxfp8", "ttft_ms")]
    assert all(f.precision is Precision.MXFP8 for f in flags)


# -- names new to a registry, unknown names ------------------------------------------------------------------------
class Newer(enum.StrEnum):
    """Names a registry learns after the schema was made (registered only in this test)."""

    FP6 = "fp6_e3m2"
    LINT = "lint"
    ACME = "acme-npu"
    JIT = "jit"
    WEEKLY = "weekly"


def _learn(monkeypatch: pytest.MonkeyPatch, vocabulary: str, member: Newer) -> None:
    parse: Callable[[Any], Any] = models.VOCABULARIES[vocabulary]

    def learned(value: Any) -> Any:
        return member if str(value).strip().lower() == member.value else parse(value)

    monkeypatch.setitem(models.VOCABULARIES, vocabulary, learned)


NEWER = {"precision": Newer.FP6, "stage": Newer.LINT, "toolchain": Newer.ACME, "route": Newer.JIT,
         "run_kind": Newer.WEEKLY}


def test_a_name_new_to_its_registry_is_written_without_a_migration(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    for vocabulary, member in NEWER.items():
        _learn(monkeypatch, vocabulary, member)
    rec = Recorder(engine)
    run = rec.start_run("weekly", "cron", "v2")
    for stage in ("lint", "infer", "accuracy"):
        rec.record_result(run, model="m", precision="fp6_e3m2", platform="npu", stage=stage, test_id="t",
                          status="pass", toolchain="acme-npu", toolchain_version="9", route="jit")
    rec.record_attempt(run, model="m", precision="fp6_e3m2", platform="npu", stage="lint", test_id="t", device="n1",
                       status="pass", toolchain="acme-npu")
    rec.set_baseline(model="m", precision="fp6_e3m2", platform="npu", stage="lint", test_id="t", name="x", value=1,
                     unit="u")
    cache.remember(engine, "3" * 64, ArtifactKind.ENGINE, SHA, {"stage": "build"}, toolchain="acme-npu",
                   toolchain_version="9")
    rec.finish_run(run, "passed")
    with Session(engine) as s:
        assert s.get(Run, run).kind is Newer.WEEKLY  # type: ignore[union-attr]
        rows = s.scalars(select(Result).order_by(Result.id)).all()
        assert {(r.precision, r.stage, r.toolchain, r.route) for r in rows} == {
            (Newer.FP6, st, Newer.ACME, Newer.JIT) for st in (Newer.LINT, Stage.INFER, Stage.ACCURACY)}
        assert s.scalars(select(Attempt.stage)).one() is Newer.LINT
        assert s.scalars(select(MetricBaseline.precision)).one() is Newer.FP6
        assert s.scalars(select(RowLatest.precision)).one() is Newer.FP6
        s.add(Regression(**{**_regression(run, "fp6_e3m2"), "stage": "lint"}))
        s.commit()
    assert cache.lookup(engine, "3" * 64).toolchain is Newer.ACME  # type: ignore[union-attr]
    assert passing_rows(engine) == [RowKey("m", Newer.FP6, "npu", Newer.ACME)]  # type: ignore[arg-type]
    [status] = latest_status(engine, precision="fp6_e3m2")
    assert status.verdict is Verdict.PASS and list(status.stages) == [Stage.INFER, Stage.ACCURACY, Newer.LINT]
    assert status.toolchain == "acme-npu" and status.route == "jit"


def test_a_regression_of_a_name_new_to_its_registry_is_flagged(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    for vocabulary in ("precision", "stage"):
        _learn(monkeypatch, vocabulary, NEWER[vocabulary])
    rec = Recorder(engine)

    def run(ms: float, finish: bool = True) -> int:
        r = rec.start_run("nightly", "cron", "v")
        rec.record_result(r, model="m", precision="fp6_e3m2", platform="npu", stage="lint", test_id="t",
                          status="pass", toolchain="edgellm-ort", metrics={"ttft_ms": (ms, "ms")})
        if finish:
            rec.finish_run(r, "passed")
        return r

    for ms in (10.0, 10.2, 9.9):
        run(ms)
    bad = run(20.0, finish=False)
    [flag] = flag_regressions(engine, bad)
    assert (flag.precision, flag.stage, flag.metric) == (Newer.FP6, Newer.LINT, "ttft_ms")
    rec.finish_run(bad, "passed")
    assert [(f.precision, f.stage) for f in published_regressions(engine)] == [(Newer.FP6, Newer.LINT)]


BAD_NAMES = {"precision": "fp7", "stage": "deploy", "toolchain": "acme-npu", "route": "jit"}


@pytest.mark.parametrize("field", sorted(BAD_NAMES))
def test_an_unknown_name_is_refused_in_python_naming_it(engine: Engine, field: str) -> None:
    rec = Recorder(engine)
    run = rec.start_run("adhoc", "me", "v1")
    kw: dict[str, Any] = dict(model="m", precision="fp16", platform="orin", stage="infer", test_id="t",
                              status="pass", toolchain="edgellm-ort")
    kw[field] = BAD_NAMES[field]
    with pytest.raises(ConfigurationError, match=rf"unknown {field} '{BAD_NAMES[field]}'") as refused:
        rec.record_result(run, **kw)
    assert KNOWN[field] in str(refused.value)  # and the valid ones
    # a write past the recorder is refused by the column type, and keeps its kind
    row = Result(run_id=run, model="m", precision="fp16", platform="orin", stage="infer", test_id="t",
                 status="pass", toolchain="edgellm-ort", recorded_at=datetime.now(UTC))
    setattr(row, field, BAD_NAMES[field])
    with pytest.raises(StatementError) as info, Session(engine) as s, s.begin():
        s.add(row)
    err = classify(info.value)
    assert isinstance(err, ConfigurationError) and str(err) == str(refused.value)
    with pytest.raises(ConfigurationError, match="unknown run kind 'weekly'; valid: nightly, l0, l1, adhoc"):
        rec.start_run("weekly", "me", "v1")
    with Session(engine) as s:
        assert s.scalar(select(func.count()).select_from(Result)) == 0
        assert s.scalar(select(func.count()).select_from(Run)) == 1


def test_names_a_newer_farm_wrote_are_read_back(engine: Engine, tmp_path: Path) -> None:
    rec = Recorder(engine)
    old = rec.start_run("nightly", "cron", "v1")
    for stage in ("infer", "accuracy"):
        rec.record_result(old, model="m", precision="fp16", platform="orin", stage=stage, test_id="t",
                          status="pass", toolchain="tensorrt-edgellm", route="onnx")
    rec.finish_run(old, "passed")
    with engine.begin() as conn:  # what a newer farm, with more names in its registries, wrote
        conn.execute(text("INSERT INTO runs (id, kind, trigger, code_version, started_at, finished_at, status, "
                          "published_at) VALUES (50, 'weekly', 'cron', 'v9', :t, :t, 'passed', :t)"), {"t": T0})
        for i, stage in enumerate(("lint", "infer", "accuracy")):
            conn.execute(text(
                "INSERT INTO results (run_id, model, precision, platform, stage, test_id, status, recorded_at, "
                "toolchain, job_toolchain, route, standin) VALUES (50, 'm', 'fp6_e3m2', 'npu', :st, 't', 'pass', :t, "
                "'acme-npu', 'acme-npu', 'jit', :f)"), {"st": stage, "t": T0, "f": False})
            conn.execute(text("INSERT INTO metrics (result_id, name, value, unit) VALUES "
                              "((SELECT max(id) FROM results), 'ttft_ms', :v, 'ms')"), {"v": 1.0 + i})
        conn.execute(text("INSERT INTO row_latest (model, precision, platform, toolchain, run_id) "
                          "VALUES ('m', 'fp6_e3m2', 'npu', 'acme-npu', 50)"))
        conn.execute(INSERT_REGRESSION, {**_regression(50, "fp6_e3m2"), "stage": "lint", "platform": "npu"})
        conn.execute(text("INSERT INTO attempts (run_id, model, precision, platform, stage, test_id, status, "
                          "recorded_at, toolchain) VALUES (50, 'm', 'fp6_e3m2', 'npu', 'lint', 't', 'pass', :t, "
                          "'acme-npu')"), {"t": T0})
        conn.execute(text("INSERT INTO cache_entries (key, kind, sha256, inputs, created_at, last_used_at, hits, "
                          "toolchain) VALUES (:k, 'engine', :sha, '{}', :t, :t, 0, 'acme-npu')"),
                     {"k": "4" * 64, "sha": SHA, "t": T0})
        summaries.refresh(Session(bind=conn), 50)  # as the newer farm's publishing keeps them
    with Session(engine) as s:
        new = s.scalars(select(Result).where(Result.run_id == 50).order_by(Result.id)).all()
        first, run = new[0], s.get(Run, 50)
        assert run is not None
        assert (first.precision, first.stage, first.toolchain, first.route) == ("fp6_e3m2", "lint", "acme-npu", "jit")
        for value in (first.precision, first.stage, first.toolchain, first.route, run.kind):
            assert type(value) is UnknownName and value.value == value
        assert new[1].stage is Stage.INFER
        known = s.scalars(select(Result).where(Result.run_id == old)).first()
        assert known is not None and known.precision is Precision.FP16 and known.toolchain == "tensorrt-edgellm"
        assert known.route is Route.ONNX and s.get(Run, old).kind is RunKind.NIGHTLY  # type: ignore[union-attr]
        # filters by a name read back work (they bind it unchecked)
        assert s.scalar(select(func.count()).where(Result.precision == new[0].precision)) == 3
        assert s.scalar(select(func.count()).where(Result.stage.in_([new[0].stage, Stage.INFER]))) == 3
        assert s.scalars(select(Attempt.toolchain)).one() == "acme-npu"
    assert cache.lookup(engine, "4" * 64).toolchain == "acme-npu"  # type: ignore[union-attr]
    statuses = {st.key: st for st in latest_status(engine)}
    newer = statuses[RowKey("m", "fp6_e3m2", "npu", "acme-npu")]  # type: ignore[arg-type]
    assert newer.verdict is Verdict.PASS and list(newer.stages) == [Stage.INFER, Stage.ACCURACY, "lint"]
    assert type(newer.key.toolchain) is UnknownName
    assert statuses[RowKey("m", Precision.FP16, "orin", "tensorrt-edgellm")].verdict is Verdict.PASS
    newer_key = RowKey("m", "fp6_e3m2", "npu", "acme-npu")  # type: ignore[arg-type]
    assert passing_rows(engine) == [RowKey("m", Precision.FP16, "orin", "tensorrt-edgellm"), newer_key]
    assert [h.run_id for h in row_history(engine, "m", "fp16", "orin")] == [old]
    [flag] = published_regressions(engine)
    assert (flag.precision, flag.stage) == ("fp6_e3m2", "lint")
    # the evidence pages read them too (they show names through .value)
    from edgefarm.pages.docs import matrix_rows, run_evidence

    assert {(r.precision, r.status) for r in matrix_rows(engine, kinds=None)} == {("fp16", "pass"),
                                                                                ("fp6_e3m2", "pass")}
    assert {r.precision for r in matrix_rows(engine)} == {"fp16"}  # the nightly's pages: a "weekly" run is not one
    info, results = run_evidence(engine, 50)
    assert info["kind"] == "weekly" and {r["stage"] for r in results} == {"lint", "infer", "accuracy"}


def test_a_migration_that_leaves_a_dangling_reference_is_refused(tmp_path: Path) -> None:
    """SQLite migrates with foreign keys off; each migration checks them before it commits."""
    engine = make_engine(f"sqlite:///{tmp_path / 'fk.db'}")
    upgrade(engine, "0007")
    raw = engine.raw_connection()
    try:  # a dangling metric, as a migration with foreign keys off could leave one
        raw.driver_connection.execute("PRAGMA foreign_keys = OFF")  # type: ignore[union-attr]
        raw.driver_connection.execute(  # type: ignore[union-attr]
            "INSERT INTO metrics (result_id, name, value, unit) VALUES (999, 'x', 1, 'u')")
        raw.driver_connection.execute("PRAGMA foreign_keys = ON")  # type: ignore[union-attr]
    finally:
        raw.close()
    with pytest.raises(BugError, match="migration 0008 leaves 1 dangling reference"):
        upgrade(engine)
    assert current_revision(engine) == "0007"
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    engine.dispose()
