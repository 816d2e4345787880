"""Recording (idempotent, one transaction) and the queries, on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.results.db import make_engine, read_session
from edgefarm.results.models import (
    ArtifactRecord,
    DeviceHealth,
    Metric,
    RegressionSeverity,
    Result,
    ResultStatus,
    Run,
    RunStatus,
    ToolchainVersion,
)
from edgefarm.results.queries import (
    RowKey,
    Verdict,
    latest_status,
    passing_rows,
    row_history,
)
from edgefarm.results.recorder import ArtifactLink, Recorder, rebuild_row_latest
from edgefarm.results.regressions import find_regressions, flag_regressions, published_regressions
from edgefarm.stages import Stage
from edgellm.errors import ConfigurationError, ErrorKind
from edgellm.types import Precision

SHA = "ab" * 32
TC = "edgellm-ort"
P, FP16 = "x86-cpu", Precision.FP16


@pytest.fixture
def rec(migrated_db_url: str) -> Iterator[Recorder]:
    r = Recorder(make_engine(migrated_db_url))
    yield r
    r.engine.dispose()


def _row(rec: Recorder, run: int, model: str, stages: dict[str, str], precision: Precision = FP16,
         platform: str = P, metrics: dict[str, tuple[float, str]] | None = None) -> None:
    for stage, status in stages.items():
        rec.record_result(run, model=model, precision=precision, platform=platform, stage=stage, test_id="t",
                          status=status, toolchain=TC, metrics=metrics if stage == "bench" else None)


def _count(rec: Recorder, table: type) -> int:
    with read_session(rec.engine) as s:
        return int(s.scalar(select(func.count()).select_from(table)) or 0)


def test_record_is_idempotent_and_complete(rec: Recorder) -> None:
    run = rec.start_run("nightly", "cron", "abc123", toolchain={"onnxruntime": "1.32", "python": "3.11"})
    kw = dict(model="stories", precision="fp16", platform=P, stage="bench", test_id="bench-128",
              device="cpu-1", model_revision=SHA, duration_s=1.5, toolchain=TC,
              toolchain_version="0.1.0+onnxruntime-1.32")
    art = ArtifactLink(SHA, 10, ArtifactKind.ONNX, Packing.FILE, "model.onnx")
    rid = rec.record_result(run, status="fail", reason="slow", error_kind=ErrorKind.TEST_FAILURE,
                            metrics={"tokens_per_s": (10.0, "tok/s"), "ms_per_token": (100.0, "ms")},
                            artifacts=[art], **kw)
    # the retried task: same key, new outcome and metrics -> same row, metrics replaced, artifact not duplicated
    rid2 = rec.record_result(run, status="pass", metrics={"tokens_per_s": (12.0, "tok/s")}, artifacts=[art], **kw)
    assert rid2 == rid
    rec.record_artifact(run, ArtifactLink("cd" * 32, 5, ArtifactKind.LOG))
    rec.record_artifact(run, ArtifactLink("cd" * 32, 5, ArtifactKind.LOG))
    rec.finish_run(run, "passed")
    with read_session(rec.engine) as s:
        r = s.get(Result, rid)
        assert r is not None and (r.status, r.reason, r.error_kind) == (ResultStatus.PASS, None, None)
        assert r.precision is Precision.FP16 and r.stage is Stage.BENCH
        assert [(m.name, m.value) for m in s.scalars(select(Metric))] == [("tokens_per_s", 12.0)]
        run_row = s.get(Run, run)
        assert run_row is not None and run_row.status is RunStatus.PASSED
        assert run_row.finished_at is not None and run_row.finished_at.tzinfo is not None
        assert {t.name: t.version for t in s.scalars(select(ToolchainVersion))} == {"onnxruntime": "1.32",
                                                                                    "python": "3.11"}
    assert _count(rec, Result) == 1 and _count(rec, ArtifactRecord) == 2
    assert rec.referenced_artifacts() == {SHA, "cd" * 32}


def test_result_and_metrics_are_one_transaction(rec: Recorder) -> None:
    run = rec.start_run("l0", "pr", "abc")
    with pytest.raises(ConfigurationError, match="metric name"):
        rec.record_result(run, model="m", precision="fp32", platform=P, stage="bench", test_id="t", status="pass",
                          toolchain=TC, metrics={"tokens_per_s": (1.0, "tok/s"), "": (2.0, "x")})
    assert _count(rec, Result) == 0 and _count(rec, Metric) == 0
    # a database-level failure mid-transaction (bad artifact kind reaches the CHECK) also leaves nothing
    with pytest.raises(ConfigurationError, match="artifact kind"):
        rec.record_result(run, model="m", precision="fp32", platform=P, stage="bench", test_id="t", status="pass",
                          toolchain=TC, metrics={"tokens_per_s": (1.0, "tok/s")},
                          artifacts=[ArtifactLink(SHA, 1, "tarball")])
    assert _count(rec, Result) == 0 and _count(rec, Metric) == 0


def test_a_stage_record_is_one_transaction(rec: Recorder) -> None:
    """A stage's result, metrics, artifact refs and attempt go in one transaction, its links read once; an environment
    this recorder saw committed is not written again; the retried record replaces, never duplicates."""
    from sqlalchemy import event

    from edgefarm.results.models import Attempt, Environment

    run = rec.start_run("nightly", "cron", "abc")
    links = [ArtifactLink(SHA, 10, ArtifactKind.ONNX), ArtifactLink("cd" * 32, 5, ArtifactKind.LOG),
             ArtifactLink(SHA, 10, ArtifactKind.ONNX)]
    result = dict(model="m", precision="fp16", platform=P, stage="bench", test_id="t", status="pass", toolchain=TC,
                  device="d1", metrics={"tokens_per_s": (1.0, "tok/s")}, artifacts=links,
                  environment={"host": "h", "python": "3.11"})
    attempt = dict(model="m", precision="fp16", platform=P, stage="bench", test_id="t", device="d1", status="pass",
                   toolchain=TC, duration_s=1.0)
    seen: list[str] = []

    def count(conn: object, cursor: object, statement: str, *_: object) -> None:
        seen.append(statement.split()[0].upper() + " " + next(
            (w for p, w in zip(statement.split(), statement.split()[1:], strict=False)
             if p.upper() in ("FROM", "INTO")), "").strip('"'))

    event.listen(rec.engine, "before_cursor_execute", count)
    try:
        first = rec.record_results(run, [result], [attempt])
        once = list(seen)
        seen.clear()
        again = rec.record_results(run, [{**result, "status": "fail"}], [{**attempt, "status": "fail"}])
    finally:
        event.remove(rec.engine, "before_cursor_execute", count)
    assert first == again
    assert once.count("SELECT artifact_refs") == 1 and once.count("INSERT environments") == 1, once
    assert once.count("SELECT runs") == 1 and seen.count("SELECT runs") == 1, (once, seen)
    assert "INSERT environments" not in seen, seen  # committed once: content-addressed, never rewritten
    if rec.engine.dialect.name == "sqlite":  # our own BEGIN: one transaction for the whole stage
        assert [k for k in once if k.startswith("BEGIN")] == ["BEGIN "], once
    assert _count(rec, Result) == 1 and _count(rec, ArtifactRecord) == 2 and _count(rec, Environment) == 1
    assert _count(rec, Attempt) == 2 and _count(rec, Metric) == 1
    with read_session(rec.engine) as s:
        assert {(a.sha256, a.kind) for a in s.scalars(select(ArtifactRecord))} == {(SHA, ArtifactKind.ONNX),
                                                                                  ("cd" * 32, ArtifactKind.LOG)}
        assert s.scalars(select(Result.status)).one() is ResultStatus.FAIL
    # a bad attempt leaves nothing of its stage
    with pytest.raises(ConfigurationError, match="result status"):
        rec.record_results(run, [{**result, "test_id": "t2"}], [{**attempt, "test_id": "t2", "status": "ok"}])
    assert _count(rec, Result) == 1


BAD = [("toolchain", "tensorrt", "tensorrt"), ("precision", "fp64", "fp64"), ("stage", "deploy", "deploy"),
       ("status", "ok", "'ok'"),
       ("model_revision", "abc", "abc"), ("error_kind", "oops", "oops"), ("platform", "", "platform")]


def test_bad_values_are_named(rec: Recorder) -> None:
    run = rec.start_run("adhoc", "me", "abc")
    for field, value, named in BAD:
        kw: dict[str, object] = dict(model="m", precision="fp32", platform=P, stage="infer", test_id="t",
                                     status="pass", toolchain=TC)
        kw[field] = value
        with pytest.raises(ConfigurationError, match=named):
            rec.record_result(run, **kw)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="unknown run id 999"):
        rec.record_result(999, model="m", precision="fp32", platform=P, stage="infer", test_id="t", status="pass",
                          toolchain=TC)
    with pytest.raises(ConfigurationError, match="weekly"):
        rec.start_run("weekly", "me", "abc")
    assert _count(rec, Result) == 0


def test_queries_tricky_rows(rec: Recorder) -> None:
    r1 = rec.start_run("nightly", "cron", "v1")
    _row(rec, r1, "flip", {"infer": "pass", "accuracy": "pass"})  # passes, then fails in run 2
    _row(rec, r1, "good", {"infer": "pass", "accuracy": "pass", "bench": "pass"})
    _row(rec, r1, "missing", {"infer": "pass"})  # accuracy never recorded
    _row(rec, r1, "na", {"infer": "not_applicable", "accuracy": "not_applicable"})
    _row(rec, r1, "waived", {"infer": "pass", "accuracy": "waived"})
    _row(rec, r1, "skipped", {"infer": "pass", "accuracy": "skipped"})
    _row(rec, r1, "errored", {"infer": "error", "accuracy": "pass"})
    _row(rec, r1, "fixed", {"infer": "fail", "accuracy": "pass"})  # fails, then passes in run 2
    assert latest_status(rec.engine) == [] and passing_rows(rec.engine) == []  # nothing published while it runs
    rec.finish_run(r1, "failed")
    r2 = rec.start_run("l0", "pr", "v2")
    _row(rec, r2, "flip", {"infer": "pass", "accuracy": "fail"})
    _row(rec, r2, "fixed", {"infer": "pass", "accuracy": "pass"})
    rec.record_result(r2, model="good", precision="fp16", platform="orin", stage="infer", test_id="t",
                      status="pass", toolchain=TC)  # same model elsewhere: another row, incomplete there
    # a second test id of a required stage that is not applicable does not block
    rec.record_result(r2, model="fixed", precision="fp16", platform=P, stage="accuracy", test_id="long-ctx",
                      status="not_applicable", toolchain=TC)
    unfinished = {(s.key.model, s.run_id) for s in latest_status(rec.engine)}
    assert ("flip", r1) in unfinished and ("fixed", r1) in unfinished  # run 2 is still running: run 1 stands
    assert passing_rows(rec.engine) == [RowKey("flip", FP16, P, TC), RowKey("good", FP16, P, TC)]
    assert [h.run_id for h in row_history(rec.engine, "flip", "fp16", P)] == [r1]
    rec.finish_run(r2, "failed")

    status = {(s.key.model, s.key.platform): s for s in latest_status(rec.engine)}
    assert {k: s.verdict for k, s in status.items()} == {
        ("errored", P): Verdict.ERROR, ("fixed", P): Verdict.PASS, ("flip", P): Verdict.FAIL,
        ("good", P): Verdict.PASS, ("good", "orin"): Verdict.INCOMPLETE, ("missing", P): Verdict.INCOMPLETE,
        ("na", P): Verdict.NOT_APPLICABLE, ("skipped", P): Verdict.INCOMPLETE, ("waived", P): Verdict.INCOMPLETE,
    }
    assert status[("flip", P)].run_id == r2 and status[("good", P)].run_id == r1
    assert status[("flip", P)].stages == {Stage.INFER: ResultStatus.PASS, Stage.ACCURACY: ResultStatus.FAIL}

    passing = passing_rows(rec.engine)
    assert passing == [RowKey("fixed", FP16, P, TC), RowKey("good", FP16, P, TC)]
    assert passing == sorted(s.key for s in status.values() if s.verdict is Verdict.PASS)
    # a different required set: only infer -> "missing" and "waived" and "skipped" pass too
    assert {k.model for k in passing_rows(rec.engine, required=["infer"])} == {
        "fixed", "good", "missing", "waived", "skipped"}
    assert passing_rows(rec.engine, required=["infer"], platform="orin") == [RowKey("good", FP16, "orin", TC)]
    assert passing_rows(rec.engine, required=["bench"]) == [RowKey("good", FP16, P, TC)]
    with pytest.raises(ConfigurationError, match="deploy"):
        passing_rows(rec.engine, required=["deploy"])

    with read_session(rec.engine) as s:  # a caller's session works too, and stays usable
        assert passing_rows(s) == passing
        assert latest_status(s, model="flip")[0].verdict is Verdict.FAIL
        assert s.scalar(select(func.count()).select_from(Run)) == 2
    history = row_history(rec.engine, "flip", "fp16", P)
    assert [(h.run_id, h.verdict, h.run_kind) for h in history] == [(r1, Verdict.PASS, "nightly"),
                                                                     (r2, Verdict.FAIL, "l0")]
    assert row_history(rec.engine, "nope", "fp16", P) == []

    # the helper table can be rebuilt from results and gives the same answers
    assert rebuild_row_latest(rec.engine) == len(status)
    assert passing_rows(rec.engine) == passing


def test_regressions_against_the_median_of_finished_nightly_runs(rec: Recorder) -> None:
    def run(tps: float, ratio: float, *, kind: str = "nightly", status: str = "pass", finish: bool = True) -> int:
        r = rec.start_run(kind, "cron", "v")
        rec.record_result(r, model="m", precision="fp16", platform=P, stage="bench", test_id="b", status=status,
                          toolchain=TC, metrics={"decode_tokens_per_s": (tps, "tokens/s")})
        rec.record_result(r, model="m", precision="fp16", platform=P, stage="accuracy", test_id="b",
                          status=status, toolchain=TC, metrics={"perplexity_ratio": (ratio, "")})
        rec.record_result(r, model="m", precision="fp16", platform=P, stage="infer", test_id="b", status="pass",
                          toolchain=TC)
        if finish:
            rec.finish_run(r, "passed" if status == "pass" else "failed")
        return r

    first = run(100.0, 1.00)
    assert find_regressions(rec.engine, run(50.0, 2.0, finish=False)) == []  # fewer than 3 baseline runs
    base = [first] + [run(tps, ratio) for tps, ratio in ((104.0, 1.01), (98.0, 1.00), (101.0, 1.02))]
    run(1.0, 9.0, status="fail")  # a failed result is never a baseline
    run(1.0, 9.0, kind="l0")  # nor an L0 run
    run(1.0, 9.0, finish=False)  # nor an unfinished one
    assert find_regressions(rec.engine, run(97.0, 1.015, finish=False)) == []  # inside the spread

    bad = run(80.0, 1.30, finish=False)  # both worse than the median by far more than 3 x 1.4826 x MAD
    flags = flag_regressions(rec.engine, bad)
    assert [(f.metric, f.severity, f.baseline, f.baseline_runs, f.previous_run_id) for f in flags] == [
        ("perplexity_ratio", RegressionSeverity.FAIL, pytest.approx(1.005), 4, base[-1]),
        ("decode_tokens_per_s", RegressionSeverity.WARN, pytest.approx(100.5), 4, base[-1])]
    assert flags[1].change == pytest.approx((100.5 - 80.0) / 100.5)
    rec.finish_run(bad, "failed")
    with read_session(rec.engine) as s:  # the accuracy regression failed its row; the bench one only warns
        got = {r.stage: r for r in s.scalars(select(Result).where(Result.run_id == bad))}
    assert got[Stage.ACCURACY].status is ResultStatus.FAIL and "perplexity_ratio 1.3 vs 1.005" in got[
        Stage.ACCURACY].reason
    assert got[Stage.BENCH].status is ResultStatus.PASS
    assert latest_status(rec.engine)[0].verdict is Verdict.FAIL
    assert [f.metric for f in published_regressions(rec.engine)] == ["perplexity_ratio", "decode_tokens_per_s"]
    assert published_regressions(rec.engine, model="other") == []
    with pytest.raises(ConfigurationError, match="baseline run count 1"):
        find_regressions(rec.engine, bad, runs=1)


def test_record_health(rec: Recorder) -> None:
    hid = rec.record_health("orin-1", reachable=True, disk_free_bytes=5 * 2**40, python_version="3.11.2",
                            edgellm_version="0.1.0", details={"load": [0.1, 0.2]})
    rec.record_health("orin-1", reachable=False, details={"error": "timeout"})
    with read_session(rec.engine) as s:
        rows = list(s.scalars(select(DeviceHealth).order_by(DeviceHealth.id)))
    assert rows[0].id == hid
    assert (rows[0].reachable, rows[0].disk_free_bytes, rows[0].details) == (True, 5 * 2**40, {"load": [0.1, 0.2]})
    assert (rows[1].reachable, rows[1].details) == (False, {"error": "timeout"})
