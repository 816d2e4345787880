"""The docs: supported-models.md, the HTML support matrix, per-run evidence pages and perf trends, generated
from the results database only. A combination is "supported" only when inference and its accuracy baseline
passed on that platform in the latest run that tested it.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from flows.docs_render import (
    MatrixRow,
    TrendPoint,
    render_html,
    render_markdown,
    render_run_page,
    render_trends,
    write_atomic,
)
from results.db import make_engine, redact
from results.migrate import upgrade
from results.models import ArtifactRecord, Metric, Result, Run, RunKind
from results.queries import latest_status

log = logging.getLogger(__name__)
TREND_METRICS = ("decode_tokens_per_s", "prefill_tokens_per_s", "perplexity_ratio")
_BAD = ("fail", "error")


def matrix_rows(engine: Engine) -> list[MatrixRow]:
    """The latest evidence per (model, precision, platform), with the key metrics of that run."""
    rows = []
    with Session(engine) as s:
        runs = {r.id: r for r in s.scalars(select(Run))}
        for st in latest_status(s):
            results = s.scalars(select(Result).where(
                Result.run_id == st.run_id, Result.model == st.key.model, Result.precision == st.key.precision,
                Result.platform == st.key.platform)).all()
            metrics: dict[str, float] = {}
            for name, value in s.execute(select(Metric.name, Metric.value).where(
                    Metric.result_id.in_([r.id for r in results]))):
                metrics[name] = value
            by_reason: dict[str, list[str]] = defaultdict(list)
            for r in results:
                if r.reason and r.status.value != "pass":
                    by_reason[r.reason].append(r.stage.value)
            reasons = [f"{'/'.join(stages)}: {why}" if len(stages) < len(results) else why
                       for why, stages in by_reason.items()]
            devices = sorted({r.device for r in results if r.device and r.device != "orchestrator"})
            run = runs[st.run_id]
            rows.append(MatrixRow(
                model=st.key.model, precision=st.key.precision.value, platform=st.key.platform,
                status=display_status(st.verdict.value, {k.value: v.value for k, v in st.stages.items()}),
                run_id=st.run_id, run_started=run.started_at.isoformat(timespec="seconds"),
                device=", ".join(devices) or None, reason="; ".join(reasons) or None,
                stages={k.value: v.value for k, v in st.stages.items()}, metrics=metrics,
                toolchain=st.toolchain, toolchain_version=st.toolchain_version,
            ))
    return rows


def display_status(verdict: str, stages: dict[str, str]) -> str:
    """The verdict, except that a row nothing ran for says why: waived or skipped rather than incomplete."""
    if verdict != "incomplete":
        return verdict
    values = set(stages.values())
    for status in ("waived", "skipped"):
        if values == {status}:
            return status
    return verdict


def trend_points(engine: Engine) -> list[TrendPoint]:
    stmt = (select(Run.id, Run.started_at, Result.model, Result.precision, Result.platform, Metric.name,
                   Metric.value)
            .join(Result, Result.run_id == Run.id).join(Metric, Metric.result_id == Result.id)
            .where(Run.kind == RunKind.NIGHTLY, Metric.name.in_(TREND_METRICS)))
    with Session(engine) as s:
        return [TrendPoint(run_id=r, started=t.isoformat(), model=m, precision=p.value, platform=pl, metric=n,
                           value=v) for r, t, m, p, pl, n, v in s.execute(stmt)]


def run_evidence(engine: Engine, run_id: int) -> tuple[dict[str, object], list[dict[str, object]]]:
    with Session(engine) as s:
        run = s.get(Run, run_id)
        assert run is not None
        info = {"id": run.id, "kind": run.kind.value, "status": run.status.value, "trigger": run.trigger,
                "code_version": run.code_version, "started_at": run.started_at.isoformat(timespec="seconds"),
                "finished_at": run.finished_at.isoformat(timespec="seconds") if run.finished_at else None}
        metrics: dict[int, list[tuple[str, float, str]]] = defaultdict(list)
        for rid, name, value, unit in s.execute(select(Metric.result_id, Metric.name, Metric.value, Metric.unit)
                                                .join(Result, Result.id == Metric.result_id)
                                                .where(Result.run_id == run_id)):
            metrics[rid].append((name, value, unit))
        arts: dict[int, list[tuple[str, str]]] = defaultdict(list)
        for rid, kind, sha in s.execute(select(ArtifactRecord.result_id, ArtifactRecord.kind, ArtifactRecord.sha256)
                                        .where(ArtifactRecord.run_id == run_id)):
            if rid is not None:
                arts[rid].append((kind.value, sha))
        results = []
        for r in s.scalars(select(Result).where(Result.run_id == run_id).order_by(Result.id)):
            results.append({"model": r.model, "precision": r.precision.value, "platform": r.platform,
                            "stage": r.stage.value, "status": r.status.value, "device": r.device,
                            "toolchain": r.toolchain.value, "toolchain_version": r.toolchain_version,
                            "reason": r.reason, "duration_s": r.duration_s, "metrics": sorted(metrics[r.id]),
                            "artifacts": arts[r.id]})
    return info, results


def write_docs(db_url: str, out_dir: Path) -> dict[str, Any]:
    engine = make_engine(db_url)
    try:
        upgrade(engine)
        rows = matrix_rows(engine)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        label = redact(db_url)
        out_dir.mkdir(parents=True, exist_ok=True)
        images = render_trends(trend_points(engine), out_dir)
        write_atomic(out_dir / "supported-models.md", render_markdown(rows, generated_at=now, db_label=label))
        write_atomic(out_dir / "support-matrix.html",
                     render_html(rows, generated_at=now, db_label=label, trend_images=images))
        for run_id in sorted({r.run_id for r in rows}):
            info, results = run_evidence(engine, run_id)
            write_atomic(out_dir / "runs" / f"run-{run_id}.md", render_run_page(info, results))
    finally:
        engine.dispose()
    supported = [r for r in rows if r.status == "pass"]
    return {"out_dir": str(out_dir), "rows": len(rows), "supported": len(supported), "trend_images": images}

