"""A row is (model, precision, platform, the toolchain its jobs ran with), on SQLite and PostgreSQL.

x86-cpu runs edgellm-ort and onnxruntime-genai side by side: each toolchain's jobs make their own row, with its own
latest run, verdict, history and regression baseline, and the docs and ``edgefarm query`` show the two next to each
other. ``Result.toolchain`` stays what made a stage's result: a quantize stage made by tensorrt-edgellm for an
edgellm-ort job belongs to the edgellm-ort row. Migration 0009 adds ``results.job_toolchain`` (backfilled) and keys
``row_latest`` by it. "Supported" has one definition (``results.queries.supported``), which the docs ask.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, inspect, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.pages.docs import matrix_rows, write_docs
from edgefarm.pages.docs_render import MatrixRow, cell_kind, render_markdown
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import (
    alembic_config,
    current_revision,
    head_revision,
    schema_diff,
    sqlite_foreign_keys_off,
    upgrade,
)
from edgefarm.results.models import Result, ResultStatus, RowLatest
from edgefarm.results.queries import (
    SUPPORT_REQUIRED,
    RowKey,
    Verdict,
    latest_status,
    passing_rows,
    row_history,
    supported,
)
from edgefarm.results.recorder import Recorder, rebuild_row_latest
from edgefarm.results.regressions import find_regressions, flag_regressions, published_regressions
from edgefarm.stages import Stage
from edgellm.types import Precision

ORT, GENAI, TRT = "edgellm-ort", "onnxruntime-genai", "tensorrt-edgellm"
CPU = "x86-cpu"
FP16, FP32, INT4 = Precision.FP16, Precision.FP32, Precision.INT4_AWQ
T0 = "2026-11-01 02:00:00"
INVENTORY = Path(__file__).resolve().parents[1] / "devices" / "inventory"  # the shipped local CPU
SHA = "ab" * 32
ORT_V, GENAI_V, TRT_V = "0.1.0+onnxruntime-1.22.0", "0.7.0", "0.11.0"


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


# -- migration 0009 --------------------------------------------------------------------------------------------------
def test_upgrade_from_empty_keys_rows_by_toolchain(empty: Engine) -> None:
    assert upgrade(empty) == head_revision()
    assert schema_diff(empty) == []
    insp = inspect(empty)
    assert insp.get_pk_constraint("row_latest")["constrained_columns"] == ["model", "precision", "platform",
                                                                           "toolchain", "variant"]  # 0013
    columns = {c["name"]: c for c in insp.get_columns("results")}
    assert columns["job_toolchain"]["nullable"] is False
    index = {i["name"]: i["column_names"] for i in insp.get_indexes("results")}["ix_results_row_run"]
    assert index == ["model", "precision", "platform", "job_toolchain", "variant", "run_id", "stage", "status",
                     "standin"]  # 0014


def _fill_0008(conn: Any) -> None:
    """Rows as a 0008 farm wrote them: run 1 (published) quantized int4 on x86-cpu with tensorrt-edgellm for an
    edgellm-ort job, and only quantized one on orin; run 2 (published) fp16 on x86-cpu; run 3 still running."""
    conn.execute(text("INSERT INTO runs (id, kind, trigger, code_version, started_at, status, published_at) "
                      "VALUES (:id, 'nightly', 'cron', 'v1', :t, :s, :p)"),
                 [{"id": 1, "t": T0, "s": "passed", "p": T0}, {"id": 2, "t": T0, "s": "passed", "p": T0},
                  {"id": 3, "t": T0, "s": "running", "p": None}])
    rows = [(1, 1, "int4_awq", CPU, "quantize", "t-q", TRT), (2, 1, "int4_awq", CPU, "export", "t-q", ORT),
            (3, 1, "int4_awq", CPU, "infer", "t-q", ORT), (4, 1, "int4_awq", CPU, "accuracy", "t-q", ORT),
            (5, 1, "int4_awq", "orin", "quantize", "t-o", TRT),  # a job that recorded nothing else
            (6, 2, "fp16", CPU, "infer", "t-f", ORT), (7, 2, "fp16", CPU, "accuracy", "t-f", ORT),
            (8, 3, "fp16", CPU, "infer", "t-f", ORT)]
    conn.execute(text("INSERT INTO results (id, run_id, model, precision, platform, stage, test_id, status, "
                      "recorded_at, toolchain, toolchain_version, standin) VALUES (:id, :run, 'm', :p, :pl, :st, "
                      ":tid, 'pass', :t, :tc, '1', :f)"),
                 [{"id": i, "run": r, "p": p, "pl": pl, "st": st, "tid": tid, "tc": tc, "t": T0, "f": False}
                  for i, r, p, pl, st, tid, tc in rows])
    conn.execute(text("INSERT INTO metrics (result_id, name, value, unit) VALUES (1, 'unquantized_share', 0, ''), "
                      "(7, 'perplexity_ratio', 1.3, '')"))
    conn.execute(text("INSERT INTO artifact_refs (run_id, result_id, sha256, kind, packing, size) "
                      "VALUES (1, 1, :s, 'checkpoint', 'tar', 10)"), {"s": SHA})
    conn.execute(text("INSERT INTO row_latest (model, precision, platform, run_id) VALUES "
                      "('m', 'int4_awq', 'x86-cpu', 1), ('m', 'int4_awq', 'orin', 1), ('m', 'fp16', 'x86-cpu', 2)"))
    conn.execute(text(
        "INSERT INTO regressions (run_id, model, precision, platform, stage, test_id, metric, unit, value, baseline, "
        "spread, baseline_runs, previous_run_id, change, severity) VALUES (2, 'm', 'fp16', 'x86-cpu', 'accuracy', "
        "'t-f', 'perplexity_ratio', '', 1.3, 1.0, 0.01, 3, 1, 0.3, 'fail')"))


def _table(engine: Engine, table: str, columns: list[str] | None = None) -> list[tuple[Any, ...]]:
    names = ", ".join(f'"{c}"' for c in columns) if columns else "*"
    with engine.connect() as conn:
        return sorted((tuple(r) for r in conn.execute(text(f'SELECT {names} FROM "{table}"'))), key=repr)


UNTOUCHED = ("runs", "metrics", "artifact_refs", "regressions")


def _columns(engine: Engine) -> dict[str, list[str]]:
    """The untouched tables' columns at 0008 (later revisions may add columns after them: runs.report in 0011)."""
    found = inspect(engine)
    return {t: [c["name"] for c in found.get_columns(t)] for t in UNTOUCHED}


def _untouched(engine: Engine, columns: dict[str, list[str]]) -> dict[str, list[tuple[Any, ...]]]:
    return {t: _table(engine, t, columns[t]) for t in UNTOUCHED}


def test_upgrade_from_0008_backfills_the_job_toolchain_and_rebuilds_row_latest(empty: Engine) -> None:
    assert upgrade(empty, "0008") == "0008"
    with empty.begin() as conn:
        _fill_0008(conn)
    columns_0008 = _columns(empty)
    before, latest_0008 = _untouched(empty, columns_0008), _table(empty, "row_latest")
    with empty.connect() as conn:
        results_0008 = {r.id: dict(r._mapping) for r in conn.execute(text("SELECT * FROM results"))}
    assert upgrade(empty) == head_revision()  # through 0009 (and what came after it)
    assert schema_diff(empty) == []
    assert _untouched(empty, columns_0008) == before
    with empty.connect() as conn:
        got = {r.id: r for r in conn.execute(text("SELECT * FROM results"))}
    assert {i: {k: r._mapping[k] for k in results_0008[i]} for i, r in got.items()} == results_0008  # kept
    # the quantize result made by tensorrt-edgellm belongs to its edgellm-ort job; a lone one keeps its own
    assert {i: (r.toolchain, r.job_toolchain) for i, r in got.items()} == {
        1: (TRT, ORT), 2: (ORT, ORT), 3: (ORT, ORT), 4: (ORT, ORT), 5: (TRT, TRT), 6: (ORT, ORT), 7: (ORT, ORT),
        8: (ORT, ORT)}
    latest = ["model", "precision", "platform", "toolchain", "run_id"]  # 0013 adds the variant: '' for these
    assert _table(empty, "row_latest", latest) == sorted([("m", "fp16", CPU, ORT, 2), ("m", "int4_awq", CPU, ORT, 1),
                                                          ("m", "int4_awq", "orin", TRT, 1)], key=repr)
    if empty.dialect.name == "sqlite":  # migrated with foreign keys off, handed back with them on
        with empty.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA foreign_key_check").all() == []
    with pytest.raises(IntegrityError, match="job_toolchain"), empty.begin() as conn:
        conn.execute(text("INSERT INTO results (run_id, model, precision, platform, stage, test_id, status, "
                          "recorded_at, toolchain, standin) VALUES (3, 'n', 'fp16', 'x86-cpu', 'infer', 't', "
                          "'pass', :t, 'edgellm-ort', :f)"), {"t": T0, "f": False})
    # the queries read the migrated rows: one row per job toolchain, the quantizer is not a row of its own
    statuses = {st.key: st for st in latest_status(empty)}
    assert sorted(statuses) == [RowKey("m", FP16, CPU, ORT), RowKey("m", INT4, "orin", TRT),
                                RowKey("m", INT4, CPU, ORT)]
    quantized = statuses[RowKey("m", INT4, CPU, ORT)]
    assert quantized.verdict is Verdict.PASS and quantized.toolchain == ORT and Stage.QUANTIZE in quantized.stages
    [flag] = published_regressions(empty)
    assert (flag.metric, flag.job_toolchain) == ("perplexity_ratio", ORT)

    # downgrade: the 0008 layout and its row_latest again (what the job toolchain told is lost), and back up
    cfg = alembic_config()
    with empty.connect() as conn, sqlite_foreign_keys_off(conn):  # as results.migrate.upgrade migrates
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0008")
        conn.commit()
    assert current_revision(empty) == "0008"
    assert _table(empty, "row_latest") == latest_0008 and _untouched(empty, columns_0008) == before
    with empty.connect() as conn:
        assert {r.id: dict(r._mapping) for r in conn.execute(text("SELECT * FROM results"))} == results_0008
    assert upgrade(empty) == head_revision()
    assert schema_diff(empty) == []
    assert len(_table(empty, "row_latest")) == 3


# -- recording and the queries ---------------------------------------------------------------------------------------
def _job(rec: Recorder, run: int, model: str, precision: Precision, toolchain: str, stages: dict[str, str], *,
         platform: str = CPU, version: str | None = None, metrics: dict[str, tuple[float, str]] | None = None,
         chosen: str | None = None, test_id: str | None = None) -> None:
    """One job's results, as the record writes them (its quantize stage made by tensorrt-edgellm)."""
    tid = test_id or f"{model}-{precision.value}" + ("" if toolchain == ORT else f"-by.{toolchain}")
    for stage, status in stages.items():
        maker = TRT if stage == "quantize" else toolchain
        ran = status in ("pass", "fail", "error")
        rec.record_result(run, model=model, precision=precision, platform=platform, stage=stage, test_id=tid,
                          status=status, toolchain=maker, job_toolchain=toolchain, chosen_versions=chosen,
                          toolchain_version=(TRT_V if maker == TRT else version) if ran else None,
                          metrics=metrics if stage == "bench" or (stage == "accuracy" and "bench" not in stages)
                          else None)


PASSED = {"infer": "pass", "accuracy": "pass"}


def test_a_quantize_stage_made_by_another_toolchain_stays_in_its_jobs_row(engine: Engine) -> None:
    rec = Recorder(engine)
    run = rec.start_run("nightly", "cron", "v1")
    _job(rec, run, "m", INT4, ORT, {"quantize": "pass", "export": "pass", **PASSED}, version=ORT_V)
    # the plan decisions' bulk insert names the job's toolchain too
    rec.record_results(run, [{"model": "m", "precision": INT4, "platform": "orin", "stage": stage, "test_id": "t",
                              "status": "skipped", "toolchain": TRT, "job_toolchain": TRT}
                             for stage in ("quantize", "infer")])
    rec.finish_run(run, "passed")
    with Session(engine) as s:
        made = {(r.platform, r.stage): (r.toolchain, r.job_toolchain) for r in s.scalars(select(Result))}
        assert made[(CPU, Stage.QUANTIZE)] == (TRT, ORT) and made[(CPU, Stage.INFER)] == (ORT, ORT)
        assert made[("orin", Stage.QUANTIZE)] == (TRT, TRT)
        assert {(r.platform, r.toolchain) for r in s.scalars(select(RowLatest))} == {(CPU, ORT), ("orin", TRT)}
    [row] = latest_status(engine, platform=CPU)
    assert row.key == RowKey("m", INT4, CPU, ORT) and row.verdict is Verdict.PASS
    assert (row.toolchain, row.toolchain_version) == (ORT, ORT_V)  # what made the evidence: its last stage
    assert row.stages[Stage.QUANTIZE] is ResultStatus.PASS
    assert passing_rows(engine) == [RowKey("m", INT4, CPU, ORT)]


def test_two_toolchains_of_one_platform_are_two_rows(engine: Engine) -> None:
    rec = Recorder(engine)
    r1 = rec.start_run("nightly", "cron", "v1")
    _job(rec, r1, "m", FP16, ORT, PASSED, version=ORT_V)
    _job(rec, r1, "m", FP16, GENAI, {"infer": "pass", "accuracy": "fail"}, version=GENAI_V)
    rec.finish_run(r1, "failed")
    r2 = rec.start_run("l0", "pr", "v2")  # only onnxruntime-genai again: the edgellm-ort row keeps run 1
    _job(rec, r2, "m", FP16, GENAI, PASSED, version=GENAI_V)
    rec.finish_run(r2, "passed")

    ort, genai = RowKey("m", FP16, CPU, ORT), RowKey("m", FP16, CPU, GENAI)
    statuses = latest_status(engine)
    assert [(st.key, st.run_id, st.verdict, st.toolchain, st.toolchain_version) for st in statuses] == [
        (ort, r1, Verdict.PASS, ORT, ORT_V), (genai, r2, Verdict.PASS, GENAI, GENAI_V)]
    assert passing_rows(engine) == [ort, genai]
    assert passing_rows(engine, toolchain=GENAI) == [genai] and passing_rows(engine, platform="orin") == []
    assert [st.key for st in latest_status(engine, toolchain="ONNXRUNTIME-GENAI")] == [genai]
    history = row_history(engine, "m", "fp16", CPU)
    assert [(h.run_id, h.key.toolchain, h.verdict) for h in history] == [
        (r1, ORT, Verdict.PASS), (r1, GENAI, Verdict.FAIL), (r2, GENAI, Verdict.PASS)]
    assert [(h.run_id, h.verdict) for h in row_history(engine, "m", "fp16", CPU, toolchain=ORT)] == [
        (r1, Verdict.PASS)]
    with Session(engine) as s:
        latest = {r.toolchain: r.run_id for r in s.scalars(select(RowLatest))}
    assert latest == {ORT: r1, GENAI: r2}
    assert rebuild_row_latest(engine) == 2 and latest_status(engine) == statuses
    from edgellm.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="unknown toolchain 'onnxruntime-gnai'"):
        latest_status(engine, toolchain="onnxruntime-gnai")


def test_a_metric_is_compared_with_its_own_toolchains_runs_only(engine: Engine) -> None:
    """edgellm-ort decodes ~100 tok/s on x86-cpu, onnxruntime-genai ~50: neither is the other's baseline, even when
    a job of one takes over the test id the other used (a matrix switched the platform's toolchain)."""
    rec = Recorder(engine)

    def run(toolchain: str, tps: float, finish: bool = True) -> int:
        r = rec.start_run("nightly", "cron", "v")
        _job(rec, r, "m", FP16, toolchain, {**PASSED, "bench": "pass"}, test_id="t",
             metrics={"decode_tokens_per_s": (tps, "tok/s")})
        if finish:
            rec.finish_run(r, "passed")
        return r

    for tps in (100.0, 102.0, 99.0):
        run(ORT, tps)
    first_genai = run(GENAI, 50.0, finish=False)
    assert find_regressions(engine, first_genai) == []  # no run of its own yet: never judged against edgellm-ort
    rec.finish_run(first_genai, "passed")
    for tps in (51.0, 49.0):
        run(GENAI, tps)
    slow = run(GENAI, 20.0, finish=False)
    [flag] = flag_regressions(engine, slow)
    assert (flag.metric, flag.job_toolchain, flag.baseline, flag.baseline_runs) == (
        "decode_tokens_per_s", GENAI, 50.0, 3)
    rec.finish_run(slow, "passed")
    assert [(f.run_id, f.job_toolchain) for f in published_regressions(engine)] == [(slow, GENAI)]
    assert published_regressions(engine, toolchain=ORT) == []
    assert find_regressions(engine, run(ORT, 99.0, finish=False)) == []  # ort's baseline is still ort's


def test_the_record_files_a_quantize_stage_under_its_jobs_toolchain(engine: Engine, tmp_path: Path) -> None:
    from edgefarm.flows.pipeline import RunReport, record_plan_decisions
    from edgefarm.flows.plan import Decision, Job, Plan
    from edgefarm.stages.job import CheckpointRef, JobSpec
    from edgefarm.stages.outcome import StageOutcome
    from edgefarm.tasks.farm import Farm, FarmContext
    from edgefarm.tasks.record import record
    from edgefarm.test_lists.testlist import TestEntry

    rec = Recorder(engine)
    run = rec.start_run("nightly", "cron", "v1")
    ctx = FarmContext(run_id=run, db_url=engine.url.render_as_string(hide_password=False),
                      data_dir=str(tmp_path / "data"), inventory_dir=str(INVENTORY))
    try:
        job = JobSpec(model="m", precision=INT4, platform=CPU, toolchain=ORT, test_id="m-int4", max_seq_len=64,
                      checkpoint=CheckpointRef("m", str(tmp_path), SHA), max_batch_size=1, max_input_len=32,
                      stages=("quantize", "export"))
        record(ctx, job, "quantize", StageOutcome("quantize", ResultStatus.PASS, toolchain=TRT,
                                                  toolchain_version=TRT_V))
        record(ctx, job, "export", StageOutcome("export", ResultStatus.PASS, toolchain_version=ORT_V))
        entry = TestEntry(list_name="l", model="m", precision=FP16, max_seq_len=64, max_batch_size=1,
                          max_input_len=32, stages=(Stage.INFER, Stage.ACCURACY), timeouts={}, toolchain=GENAI)
        skipped = Job(entry=entry, platform=CPU, decision=Decision.SKIPPED, toolchain=GENAI, reason="no device")
        record_plan_decisions(ctx, Plan(name="p", kind="nightly", jobs=[skipped]), RunReport(run_id=run))
    finally:
        Farm.close(ctx)
    with Session(engine) as s:
        made = {(r.precision, r.stage): (r.toolchain, r.job_toolchain) for r in s.scalars(select(Result))}
    assert made == {(INT4, Stage.QUANTIZE): (TRT, ORT), (INT4, Stage.EXPORT): (ORT, ORT),
                    (FP16, Stage.INFER): (GENAI, GENAI), (FP16, Stage.ACCURACY): (GENAI, GENAI)}


# -- "supported": one definition ----------------------------------------------------------------------------------
def test_supported_is_the_queries_pass_verdict_everywhere(engine: Engine, tmp_path: Path) -> None:
    """The docs' supported rows are exactly the rows :func:`results.queries.supported` accepts, which are exactly
    what ``passing_rows`` computes in SQL with SUPPORT_REQUIRED. A required stage with a pass and a waived test
    passes (the waived one neither proves nor blocks): its cell used to be re-checked from the worst status per
    stage, which is ``waived``, and the docs disagreed with the queries."""
    rec = Recorder(engine)
    run = rec.start_run("nightly", "cron", "v1")
    _job(rec, run, "plain", FP16, ORT, PASSED, version=ORT_V)
    _job(rec, run, "waived-too", FP16, ORT, PASSED, version=ORT_V)
    rec.record_result(run, model="waived-too", precision=FP16, platform=CPU, stage="infer", test_id="long-ctx",
                      status="waived", toolchain=ORT)
    _job(rec, run, "only-waived", FP16, ORT, {"infer": "waived", "accuracy": "pass"}, version=ORT_V)
    _job(rec, run, "genai", FP16, GENAI, PASSED, version=GENAI_V)
    _job(rec, run, "export-only", INT4, ORT, {"quantize": "pass", "export": "pass", "infer": "skipped"},
         version=ORT_V)
    rec.record_result(run, model="standin", precision=FP16, platform=CPU, stage="infer", test_id="s",
                      status="pass", toolchain=ORT, standin=True)
    rec.record_result(run, model="standin", precision=FP16, platform=CPU, stage="accuracy", test_id="s",
                      status="pass", toolchain=ORT)
    rec.finish_run(run, "passed")

    by_queries = {st.key for st in latest_status(engine, required=SUPPORT_REQUIRED) if supported(st.verdict)}
    assert by_queries == set(passing_rows(engine, required=SUPPORT_REQUIRED))
    assert {k.model for k in by_queries} == {"plain", "waived-too", "genai"}
    rows = matrix_rows(engine)
    passing = ("l0_covered", "checkpoint_direct")
    by_docs = {(r.model, r.precision, r.platform) for r in rows if cell_kind(r).value in passing}
    assert by_docs == {(k.model, k.precision.value, k.platform) for k in by_queries}
    assert all(supported(r.status) == (cell_kind(r).value in passing) for r in rows)
    assert not supported("waived") and not supported(Verdict.INCOMPLETE) and supported(Verdict.PASS)
    url = engine.url.render_as_string(hide_password=False)
    assert write_docs(url, tmp_path / "docs")["supported"] == len(by_queries)


# -- the docs and `edgefarm query` ---------------------------------------------------------------------------------
@pytest.fixture
def side_by_side(engine: Engine) -> Engine:
    """x86-cpu ran both toolchains for stories260K fp16 (both pass), onnxruntime-genai alone for fp32 (fails); a
    version comparison of onnxruntime-genai; orin and a platform this farm does not know, one toolchain each."""
    rec = Recorder(engine)
    run = rec.start_run("nightly", "cron", "v1")
    metrics = {"decode_tokens_per_s": (400.0, "tok/s"), "perplexity_ratio": (1.0001, "")}
    _job(rec, run, "stories260K", FP16, ORT, {**PASSED, "bench": "pass"}, version=ORT_V, metrics=metrics)
    _job(rec, run, "stories260K", FP16, GENAI, {**PASSED, "bench": "pass"}, version=GENAI_V,
         metrics={"decode_tokens_per_s": (300.0, "tok/s"), "perplexity_ratio": (1.0002, "")})
    _job(rec, run, "stories260K", FP32, GENAI, {"infer": "pass", "accuracy": "fail"}, version=GENAI_V)
    _job(rec, run, "tiny-qwen3", FP16, GENAI, PASSED, version="0.6.0", chosen=f"{GENAI}==0.6.0",
         test_id=f"tiny-fp16-by.{GENAI}-{GENAI}==0.6.0")
    _job(rec, run, "tiny-qwen3", INT4, TRT, {"quantize": "pass", **PASSED}, platform="orin", version=TRT_V)
    _job(rec, run, "<b>m|x</b>", FP16, ORT, PASSED, platform="npu-x", version=ORT_V)
    rec.finish_run(run, "failed")
    return engine


def _section(md: str, platform: str) -> str:
    return md.split(f"## {platform}\n", 1)[1].split("\n## ", 1)[0]


def test_docs_show_two_toolchains_of_a_platform_side_by_side(side_by_side: Engine, tmp_path: Path) -> None:
    out = tmp_path / "docs"
    summary = write_docs(side_by_side.url.render_as_string(hide_password=False), out)
    assert summary["supported"] == 5
    md = (out / "supported-models.md").read_text()
    cpu = _section(md, CPU)
    assert f"Toolchains: {ORT} {ORT_V}, {GENAI} 0.6.0, {GENAI} {GENAI_V}" in cpu
    lines = [x for x in cpu.splitlines() if x.startswith("| ") and not x.startswith("| Model")]
    assert lines == [  # FP32 | FP16; each cell names its toolchain and version; a failed row says so
        f"| stories260K | 260K | never tested | [✓ edgellm-ort {ORT_V}](runs/run-1.md#stories260k-fp16-x86-cpu) |",
        f"| stories260K ({GENAI}) | 260K | ✗ failing ([run 1](runs/run-1.md#stories260k-fp32-x86-cpu-by-{GENAI})) | "
        f"[✓ onnxruntime-genai {GENAI_V}](runs/run-1.md#stories260k-fp16-x86-cpu-by-{GENAI}) |",
        f"| tiny-qwen3 ({GENAI}; {GENAI}==0.6.0) | - | never tested | [✓ onnxruntime-genai 0.6.0](runs/run-1.md#tiny-"
        f"qwen3-fp16-x86-cpu-by-{GENAI}-{GENAI}-0-6-0) |"], cpu
    assert "| tiny-qwen3 | - | [✓](runs/run-1.md#tiny-qwen3-int4-awq-orin) |" in _section(md, "orin")
    assert "(edgellm-ort)" in _section(md, "npu-x")  # a platform this farm does not know: every toolchain named

    page = (out / "runs" / "run-1.md").read_text()
    anchors = re.findall(r"<a id='([^']+)'></a>", page)
    assert len(anchors) == len(set(anchors)) == 6
    for link in re.findall(r"\(runs/run-1\.md#([^)]+)\)", md):
        assert link in anchors
    assert f"## stories260K ({GENAI}) · fp16 · x86-cpu" in page and "## stories260K · fp16 · x86-cpu" in page
    genai = page.split(f"<a id='stories260k-fp16-x86-cpu-by-{GENAI}'></a>", 1)[1].split("<a id=", 1)[0]
    assert f"| infer | pass | {GENAI} {GENAI_V} |" in genai and ORT not in genai

    html = (out / "support-matrix.html").read_text()
    keys = re.findall(r"data-key='([^']+)'", html)
    assert len(keys) == len(set(keys)) == 6
    assert f"<tr data-model='stories260K ({GENAI})'>" in html and "<tr data-model='stories260K'>" in html
    assert "<b>m|x</b>" not in html and "&lt;b&gt;m|x&lt;/b&gt; (edgellm-ort)" in html  # escaped as ever


def test_preferred_toolchain_rows_look_as_before() -> None:
    """A row of the platform's preferred toolchain renders exactly as a row that names no toolchain (the pages of
    runs with one toolchain per platform are pinned by tests/test_docs.py's golden files)."""
    base = dict(model="m", precision="fp16", status="pass", run_id=3, run_started="t", toolchain=ORT,
                toolchain_version=ORT_V, stages={"infer": "pass", "accuracy": "pass"})
    for platform, preferred in ((CPU, ORT), ("orin", TRT), ("x86-h200", TRT)):
        named, plain = MatrixRow(platform=platform, job_toolchain=preferred, **base), MatrixRow(platform=platform,
                                                                                              **base)
        assert (named.label, named.anchor) == (plain.label, plain.anchor) == ("m", f"m-fp16-{platform}")
        assert render_markdown([named], generated_at="t", db_label="x") == render_markdown(
            [plain], generated_at="t", db_label="x")
    other = MatrixRow(platform="x86-h200", job_toolchain="edgellm-torch-cuda", **base)
    assert (other.label, other.anchor) == ("m (edgellm-torch-cuda)", "m-fp16-x86-h200-by-edgellm-torch-cuda")


def _query(db: Engine, *args: str) -> Any:
    result = CliRunner().invoke(app, ["query", "--db", db.url.render_as_string(hide_password=False), *args],
                                env={"COLUMNS": "300"})
    return result


def test_query_names_each_rows_toolchain(side_by_side: Engine) -> None:
    result = _query(side_by_side, "--platform", CPU, "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["model"], r["precision"], r["job_toolchain"], r["toolchain"], r["toolchain_version"], r["status"])
            for r in rows] == [
        ("stories260K", "fp16", ORT, ORT, ORT_V, "l0_covered"),
        ("stories260K", "fp16", GENAI, GENAI, GENAI_V, "l0_covered"),
        ("stories260K", "fp32", GENAI, GENAI, GENAI_V, "failing"),
        ("tiny-qwen3", "fp16", GENAI, GENAI, "0.6.0", "l0_covered")]
    result = _query(side_by_side, "--toolchain", "edgellm-ort", "--format", "csv")
    assert result.exit_code == 0, result.output
    parsed = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [(r["model"], r["platform"], r["job_toolchain"]) for r in parsed] == [
        ("<b>m|x</b>", "npu-x", ORT), ("stories260K", CPU, ORT)]
    result = _query(side_by_side, "--platform", CPU)
    assert result.exit_code == 0, result.output
    assert f"stories260K ({GENAI})" in result.stdout and GENAI_V in result.stdout
    result = _query(side_by_side, "--platform", "npu-x")
    assert "<b>m|x</b> (edgellm-ort)" in result.stdout  # Rich markup in a name is printed, never applied
    bad = _query(side_by_side, "--toolchain", "onnxruntime-gnai")
    assert bad.exit_code == 2 and "unknown toolchain 'onnxruntime-gnai'" in bad.output


def test_query_regressions_name_the_rows_toolchain(engine: Engine) -> None:
    rec = Recorder(engine)
    for tps in (50.0, 51.0, 49.0, 10.0):
        run = rec.start_run("nightly", "cron", "v")
        _job(rec, run, "m", FP16, GENAI, {**PASSED, "bench": "pass"}, metrics={"decode_tokens_per_s": (tps, "t/s")})
        if tps == 10.0:
            flag_regressions(engine, run)
        rec.finish_run(run, "passed")
    result = _query(engine, "--regressions", "--format", "json")
    assert result.exit_code == 0, result.output
    assert [(r["metric"], r["job_toolchain"]) for r in json.loads(result.stdout)] == [("decode_tokens_per_s", GENAI)]
    table = _query(engine, "--regressions")
    assert f"m ({GENAI})" in table.stdout
    assert json.loads(_query(engine, "--regressions", "--toolchain", ORT, "--format", "json").stdout) == []
