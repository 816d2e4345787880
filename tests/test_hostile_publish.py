"""A run that breaks off is never evidence (issue 24 item 12): an error or a cancellation in the middle of a plan
ends the run unpublished, and the matrix, the passing rows, a row's history and the trend pages all ignore it. The
same run carried to its end is published (the control: the test can see publishing)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

import edgefarm.flows.execute as execute
from edgefarm.flows.settings import Settings
from edgefarm.pages.docs import trend_points, write_docs
from edgefarm.results.db import make_engine
from edgefarm.results.models import Run, RunStatus
from edgefarm.results.queries import latest_status, passing_rows, row_history
from edgefarm.results.recorder import Recorder
from tests.helpers.docs_db import PIPELINE, build_docs_db

ROW = ("tiny-qwen3", "fp32", "x86-cpu")  # its accuracy failed in both published nightly runs
POISON = 987654.0  # a decode rate no published run has


class _Cancelled(BaseException):
    """What a cancelled flow's process sees: not an Exception (Prefect's termination and KeyboardInterrupt alike)."""


def _run_plan(tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch, breaks: BaseException | None) -> int:
    """execute_plan of a nightly plan whose jobs record the row as passing (and a poisoned trend metric), then
    break off with ``breaks`` (None: finish)."""
    started: list[int] = []

    def submit_jobs(ctx: Any, jobs: Any, report: Any, sources: Any, checkpoints: Any = None) -> None:
        started.append(ctx.run_id)
        rec = Recorder(make_engine(url))
        for stage in PIPELINE:
            rec.record_result(ctx.run_id, model=ROW[0], precision=ROW[1], platform=ROW[2], stage=stage,
                              test_id="tiny-qwen3-fp32", status="pass", device="local-cpu",
                              toolchain="edgellm-ort", toolchain_version="0.1.0+onnxruntime-1.22.0",
                              metrics={"decode_tokens_per_s": (POISON, "tok/s")} if stage == "bench" else None)
        rec.engine.dispose()
        if breaks is not None:
            raise breaks

    farm = SimpleNamespace(inventory=[], touched_devices=set())
    monkeypatch.setattr(execute, "Farm", SimpleNamespace(get=lambda ctx: farm, close=lambda ctx: None))
    monkeypatch.setattr(execute, "record_plan_decisions", lambda ctx, plan, report: None)
    monkeypatch.setattr(execute, "locate_checkpoints", lambda *a: {})
    monkeypatch.setattr(execute, "submit_jobs", submit_jobs)
    monkeypatch.setattr(execute, "timing_summary", lambda *a: {})
    monkeypatch.setattr(execute, "toolchain_versions", lambda: {"edgellm-farm": "0.1.0"})
    plan = SimpleNamespace(kind="nightly", name="nightly", jobs=[], runnable=lambda: [], sources={}, quantize_on=None)
    settings = Settings(db_url=url, data_dir=tmp_path, inventory_dir=tmp_path, docs_dir=tmp_path / "docs")
    if breaks is None:
        execute.execute_plan(plan, settings, trigger="test")  # type: ignore[arg-type]
    else:
        with pytest.raises(type(breaks)):
            execute.execute_plan(plan, settings, trigger="test")  # type: ignore[arg-type]
    return started[0]


@pytest.mark.parametrize("breaks", [RuntimeError("device lost mid-plan"), _Cancelled()], ids=["error", "cancelled"])
def test_a_run_that_breaks_off_is_never_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  breaks: BaseException) -> None:
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    before = latest_status(engine, model=ROW[0], precision=ROW[1], platform=ROW[2])
    run_id = _run_plan(tmp_path, url, monkeypatch, breaks)
    with Session(engine) as s:
        run = s.get(Run, run_id)
        assert run is not None and run.status is RunStatus.ERROR and run.finished_at is not None
        assert run.published_at is None
    after = latest_status(engine, model=ROW[0], precision=ROW[1], platform=ROW[2])
    assert [(r.run_id, r.verdict) for r in after] == [(r.run_id, r.verdict) for r in before]
    assert after[0].verdict.value == "fail" and after[0].run_id != run_id
    assert ROW not in [(k.model, k.precision.value, k.platform) for k in passing_rows(engine)]
    assert run_id not in [h.run_id for h in row_history(engine, *ROW)]
    assert run_id not in {p.run_id for p in trend_points(engine)}
    assert POISON not in {p.value for p in trend_points(engine)}
    write_docs(url, tmp_path / "docs", tmp_path)
    pages = "\n".join(p.read_text(encoding="utf-8", errors="replace") for p in (tmp_path / "docs").rglob("*")
                      if p.is_file())
    assert "987654" not in pages and f"run-{run_id}" not in pages
    engine.dispose()


def test_the_same_run_finished_is_published(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    run_id = _run_plan(tmp_path, url, monkeypatch, None)
    with Session(engine) as s:
        assert s.scalar(select(Run.published_at).where(Run.id == run_id)) is not None
    assert [(r.run_id, r.verdict.value) for r in latest_status(engine, model=ROW[0], precision=ROW[1],
                                                                platform=ROW[2])] == [(run_id, "pass")]
    assert ROW in [(k.model, k.precision.value, k.platform) for k in passing_rows(engine)]
    assert run_id in [h.run_id for h in row_history(engine, *ROW)]
    assert POISON in {p.value for p in trend_points(engine)}
    engine.dispose()


def test_a_cancelled_run_is_not_published_even_when_asked(tmp_path: Path) -> None:
    """Recorder.finish_run(status cancelled) never publishes, whatever its caller passes."""
    url = build_docs_db(tmp_path / "r.db", tmp_path)
    engine = make_engine(url)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc123", toolchain={"edgellm-farm": "0.1.0"})
    rec.record_result(run, model=ROW[0], precision=ROW[1], platform=ROW[2], stage="accuracy", test_id="t",
                      status="pass", device="local-cpu", toolchain="edgellm-ort", toolchain_version="0.1.0")
    rec.finish_run(run, "cancelled", publish=True)
    with Session(engine) as s:
        assert s.scalar(select(Run.published_at).where(Run.id == run)) is None
    assert run not in [r.run_id for r in latest_status(engine)]
    assert run not in [h.run_id for h in row_history(engine, *ROW)]
    engine.dispose()
