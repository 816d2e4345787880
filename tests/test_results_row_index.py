"""The row index (migration 0014) and the kept row summaries (0017): "which rows pass" reads the kept verdicts alone
on both backends, never a result; the schema still matches the models, and downgrade/upgrade keep the rows;
latest_status (the docs' query) agrees row by row with row_history."""

from __future__ import annotations

import gc
from dataclasses import replace

from alembic import command
from sqlalchemy import inspect

from benchmarks.db_data import Shape, expected_passing, load
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import alembic_config, current_revision, head_revision, schema_diff, upgrade
from edgefarm.results.queries import latest_status, latest_status_stmt, passing_rows, passing_rows_stmt, row_history

SHAPE = Shape.for_results(rows=800, runs=12, results=8000)


def _plan(url: str) -> str:
    engine = make_engine(url)
    sql = str(passing_rows_stmt().compile(engine, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            lines = list(conn.exec_driver_sql("EXPLAIN " + sql).scalars())
        else:
            lines = [str(r[3]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
    engine.dispose()
    return "\n".join(lines)


def test_passing_rows_reads_the_kept_verdicts_alone(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    load(engine, SHAPE)
    engine.dispose()
    plan = _plan(migrated_db_url)
    assert "row_latest" in plan and "results" not in plan, plan  # was: an index range scan of results per row
    for stmt in (passing_rows_stmt(), latest_status_stmt()):
        tables = {t.name for t in stmt.get_final_froms()}
        assert tables <= {"row_latest", "row_tallies"}, tables


def test_passing_rows_with_other_required_stages_judges_the_kept_tallies(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    load(engine, SHAPE)
    statuses = latest_status(engine, required=("export", "infer"))
    want = sorted({s.key for s in statuses if s.verdict == "pass"} - {s.key for s in statuses if s.verdict != "pass"})
    assert passing_rows(engine, required=("export", "infer")) == want
    assert passing_rows(engine, required=("export", "infer")) != passing_rows(engine)
    engine.dispose()


def test_0014_downgrade_and_upgrade_keep_rows_and_the_schema(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    load(engine, SHAPE)
    want = passing_rows(engine)
    assert [(k.model, k.precision, k.platform, k.toolchain, k.variant) for k in want] == expected_passing(SHAPE)
    cfg = alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0013")
        conn.commit()
    assert current_revision(engine) == "0013"
    cols = {ix["name"]: ix["column_names"] for ix in inspect(engine).get_indexes("results")}
    assert cols["ix_results_row_run"][-1] == "status"
    with engine.connect() as conn:  # the rows are kept (this code's queries read 0017's summaries: not there yet)
        assert conn.exec_driver_sql("SELECT count(*) FROM row_latest").scalar() == SHAPE.rows
        assert "row_tallies" not in inspect(conn).get_table_names()
    assert upgrade(engine) == head_revision()
    assert schema_diff(engine) == []
    cols = {ix["name"]: ix["column_names"] for ix in inspect(engine).get_indexes("results")}
    assert cols["ix_results_row_run"][-1] == "standin"
    assert passing_rows(engine) == want
    engine.dispose()


def test_latest_status_agrees_with_row_history(migrated_db_url: str) -> None:
    """The docs' query (one packed row per row, judged once per distinct pattern) against row_history (the same
    rules over each row's results one by one), on rows with stand-ins, waived, skipped and n/a results."""
    engine = make_engine(migrated_db_url)
    shape = Shape.for_results(rows=400, runs=8, results=4000)
    load(engine, shape)
    statuses = latest_status(engine)
    assert len(statuses) == shape.rows
    assert {s.verdict.value for s in statuses} >= {"pass", "fail", "incomplete"}
    assert any(s.standin for s in statuses)
    for st in statuses[::7]:
        history = row_history(engine, st.key.model, st.key.precision, st.key.platform, toolchain=st.key.toolchain,
                              variant=st.key.variant)
        assert replace(history[-1], run_kind=None, run_started_at=None) == st, (history[-1], st)
    passing = [s.key for s in statuses if s.verdict == "pass"]
    assert passing == passing_rows(engine)
    engine.dispose()


def test_latest_status_is_sorted_and_makes_its_statuses_without_a_collection(migrated_db_url: str) -> None:
    """The docs' query makes a status per row (tens of thousands at production size) with Python's cyclic collector
    paused (its full passes were most of the query's time at 20,000 rows): one collection at most, after, where
    unpaused it ran dozens; and leaves the collector as it was."""
    engine = make_engine(migrated_db_url)
    load(engine, SHAPE)
    latest_status(engine)  # the first call's one-time work (the session, the statement's compilation) done
    collections: list[str] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            collections.append(f"generation {info['generation']}")

    threshold = gc.get_threshold()
    gc.set_threshold(100)  # a collection every 100 allocations: many while 800 rows' statuses are made, unpaused
    gc.callbacks.append(seen)
    try:
        statuses = latest_status(engine)
        during = list(collections)
        assert gc.isenabled()
        gc.disable()
        latest_status(engine)
        assert not gc.isenabled()  # left as it was
        gc.enable()
    finally:
        gc.callbacks.remove(seen)
        gc.set_threshold(*threshold)
    assert len(during) <= 1, during[:5]  # at most one, when it is back on after the statuses are made
    assert len(statuses) == SHAPE.rows
    keys = [(s.key.model, str(s.key.precision), s.key.platform, str(s.key.toolchain), s.key.variant, s.run_id,
             s.chosen_versions or "") for s in statuses]
    assert keys == sorted(keys)
    assert all(s.chosen_versions is None for s in statuses)  # '' in the statement is None here, as before
    engine.dispose()


def test_the_bulk_makers_set_every_field_as_the_constructors_do() -> None:
    """latest_status makes its keys and statuses without their ``__init__`` (tens of thousands a call): each field
    set (a field added to the class and not to the maker fails here), equal to the constructor's, stages its own."""
    from dataclasses import fields

    from edgefarm.results.models import ResultStatus
    from edgefarm.results.queries import RowKey, RowStatus, Verdict, _row_key, _row_status
    from edgefarm.stages import Stage
    from edgellm.types import Precision

    key = _row_key("m", Precision("fp16"), "orin", "edgellm-ort", "kv=fp8")
    assert key == RowKey("m", Precision("fp16"), "orin", "edgellm-ort", "kv=fp8")
    assert set(vars(key)) == {f.name for f in fields(RowKey)}
    worst = {Stage.INFER: ResultStatus.PASS}
    status = _row_status(key, 7, (Verdict.PASS, worst, "edgellm-ort", "1.0", True, "onnx"), "edgellm-ort==1.0")
    assert status == RowStatus(key, 7, Verdict.PASS, worst, None, None, "edgellm-ort", "1.0", True, "onnx",
                               "edgellm-ort==1.0")
    assert set(vars(status)) == {f.name for f in fields(RowStatus)}
    assert status.stages == worst and status.stages is not worst  # a status's stages are its own


def test_0018_fills_each_rows_latest_run_of_each_kind_from_the_published_results(db_url: str) -> None:
    """Upgrading to 0018 fills ``row_latest_kind`` from the results as the recorder keeps it (and as
    ``rebuild_row_latest`` recomputes it); the nightly's pages then read the same rows as before the upgrade."""
    from edgefarm.results.support import NIGHTLY_PAGE_KINDS, row_supports

    engine = make_engine(db_url)
    upgrade(engine)
    load(engine, SHAPE)
    per_kind = "SELECT model, precision, platform, toolchain, variant, kind, run_id FROM row_latest_kind"
    with engine.connect() as conn:
        kept = sorted(conn.exec_driver_sql(per_kind).all())
    pages = row_supports(engine, kinds=NIGHTLY_PAGE_KINDS)
    assert {k for *_, k, _ in kept} == {"nightly", "l0"} and 0 < len(pages) < SHAPE.rows  # rows a nightly ran
    cfg = alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0017")
        conn.commit()
    assert "row_latest_kind" not in inspect(engine).get_table_names()
    assert upgrade(engine) == head_revision()
    assert schema_diff(engine) == []
    with engine.connect() as conn:
        assert sorted(conn.exec_driver_sql(per_kind).all()) == kept
    assert row_supports(engine, kinds=NIGHTLY_PAGE_KINDS) == pages
    engine.dispose()
