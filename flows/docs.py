"""The docs: supported-models.md, the HTML support matrix, per-run evidence pages and perf trends, generated
from the results database only. Whether a row is "supported" is results/queries.py's one definition
(:func:`results.queries.supported`: inference and its accuracy baseline passed on that platform in the latest run
that tested it); a row is one (model, precision, platform, the toolchain its jobs ran with).

Published pages name the database backend only and carry no orchestrator paths, hosts or URLs (see ``scrub``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from flows.docs_html import html_status, render_html
from flows.docs_layout import write_layout_pages
from flows.docs_regressions import RegressionMark
from flows.docs_render import (
    MatrixRow,
    TrendPoint,
    render_markdown,
    render_run_page,
    render_trends,
    row_label,
    scrub,
    shown_toolchain,
    supported,
    write_atomic,
)
from results.db import read_only_engine, redact
from results.migrate import require_current
from results.models import ArtifactRecord, BringupRung, Metric, Result, Run, RunKind
from results.queries import SUPPORT_REQUIRED, latest_status
from results.regressions import published_regressions
from toolchains.base import docs_layouts

log = logging.getLogger(__name__)
BRINGUP_PAGES = 50  # the latest bring-ups get a run page (with their rungs and report) even without rows
TREND_METRICS = ("decode_tokens_per_s", "prefill_tokens_per_s", "perplexity_ratio")
BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def db_label(db_url: str) -> str:
    """The database backend only: published pages never carry its path, host or credentials."""
    backend = make_url(db_url).get_backend_name()
    return BACKEND_NAMES.get(backend, backend)


def model_parameters(models: set[str], data_dir: Path | None) -> dict[str, int]:
    """Parameter counts (headers only) of the catalog models whose checkpoint is already here; nothing is
    materialized or downloaded for the docs, so a model whose checkpoint is absent has no count."""
    from edgellm.checkpoint.checkpoint import Checkpoint
    from edgellm.errors import EdgeLLMError
    from test_lists.catalog import Catalog

    catalog = Catalog.load()
    counts = {}
    for name in sorted(models):
        if name not in catalog:
            continue
        src = catalog.get(name)
        try:
            if src.kind == "synthetic":
                if data_dir is None:
                    continue
                path = data_dir / "checkpoints" / name.replace("/", "--")
                if not (path / "config.json").is_file():
                    continue
            else:
                path = src.locate(data_dir or Path("."))
            counts[name] = Checkpoint.open(path).parameter_count
        except EdgeLLMError as exc:
            log.info("no parameter count for %s: %s", name, exc)
    return counts


def matrix_rows(engine: Engine, data_dir: Path | None = None) -> list[MatrixRow]:
    """The latest evidence per row (model, precision, platform, job toolchain), with the key metrics of that run."""
    rows = []
    with Session(engine) as s:
        runs = {r.id: r for r in s.scalars(select(Run))}
        marks = regression_marks(s)
        statuses = latest_status(s, required=SUPPORT_REQUIRED)
        params = model_parameters({st.key.model for st in statuses}, data_dir)
        for st in statuses:
            results = s.scalars(select(Result).where(
                Result.run_id == st.run_id, Result.model == st.key.model, Result.precision == st.key.precision,
                Result.platform == st.key.platform, Result.job_toolchain == st.key.toolchain,
                Result.variant == st.key.variant,
                Result.chosen_versions.is_(None) if st.chosen_versions is None
                else Result.chosen_versions == st.chosen_versions)).all()
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
            if st.standin:  # its passes ran on stand-ins: never supported (queries keep its verdict incomplete)
                reasons.insert(0, "STAND-IN tools (test only, never evidence)")
            if st.route:
                reasons.append(f"route: {st.route}")
            devices = sorted({r.device for r in results if r.device and r.device != "orchestrator"})
            run = runs[st.run_id]
            rows.append(MatrixRow(
                model=st.key.model, precision=st.key.precision.value, platform=st.key.platform,
                status=display_status(st.verdict.value, {k.value: v.value for k, v in st.stages.items()}),
                run_id=st.run_id, run_started=run.started_at.isoformat(timespec="seconds"),
                device=scrub(", ".join(devices), data_dir) or None,
                reason=scrub("; ".join(reasons), data_dir) or None,
                stages={k.value: v.value for k, v in st.stages.items()}, metrics=metrics,
                toolchain=st.toolchain, toolchain_version=st.toolchain_version, params=params.get(st.key.model),
                regressions=tuple(marks.get((st.key.model, st.key.precision.value, st.key.platform,
                                             str(st.key.toolchain)), ())),
                chosen_versions=st.chosen_versions, job_toolchain=str(st.key.toolchain), route=st.route,
                variant=st.key.variant,
            ))
    return rows


def regression_marks(s: Session) -> dict[tuple[str, str, str, str], list[RegressionMark]]:
    """Regressions flagged in each row's latest published run, by row (model, precision, platform, job toolchain)."""
    marks: dict[tuple[str, str, str, str], list[RegressionMark]] = defaultdict(list)
    for f in published_regressions(s):
        marks[(f.model, f.precision.value, f.platform, str(f.job_toolchain))].append(RegressionMark(
            f.metric, f.value, f.baseline, f.change, f.severity.value, f.run_id, f.previous_run_id))
    return marks


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
    """Trend metrics of the published nightly runs; a row of a platform's other toolchain is its own line, named
    by its label."""
    stmt = (select(Run.id, Run.started_at, Result.model, Result.precision, Result.platform, Result.job_toolchain,
                   Metric.name, Metric.value)
            .join(Result, Result.run_id == Run.id).join(Metric, Metric.result_id == Result.id)
            .where(Run.kind == RunKind.NIGHTLY, Run.published_at.is_not(None), Metric.name.in_(TREND_METRICS)))
    with Session(engine) as s:
        return [TrendPoint(run_id=r, started=t.isoformat(), model=row_label(m, None, shown_toolchain(pl, tc)),
                           precision=p.value, platform=pl, metric=n, value=v)
                for r, t, m, p, pl, tc, n, v in s.execute(stmt)]


def run_evidence(engine: Engine, run_id: int,
                 data_dir: Path | None = None) -> tuple[dict[str, object], list[dict[str, object]]]:
    with Session(engine) as s:
        run = s.get(Run, run_id)
        assert run is not None
        info = {"id": run.id, "kind": run.kind.value, "status": run.status.value, "trigger": scrub(run.trigger),
                "code_version": run.code_version, "started_at": run.started_at.isoformat(timespec="seconds"),
                "finished_at": run.finished_at.isoformat(timespec="seconds") if run.finished_at else None,
                "report": scrub(run.report, data_dir), "report_path": run.report,
                "rungs": [{"position": g.position, "name": g.name, "status": g.status,
                           "reason": scrub(g.reason, data_dir), "duration_s": g.duration_s}
                          for g in s.scalars(select(BringupRung).where(BringupRung.run_id == run_id)
                                             .order_by(BringupRung.position))]}
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
                            "stage": r.stage.value, "status": r.status.value, "device": scrub(r.device, data_dir),
                            "toolchain": str(r.toolchain), "toolchain_version": r.toolchain_version,
                            "job_toolchain": str(r.job_toolchain), "chosen_versions": r.chosen_versions,
                            "variant": r.variant,
                            "reason": scrub(r.reason, data_dir), "duration_s": r.duration_s,
                            "metrics": sorted(metrics[r.id]), "artifacts": arts[r.id]})
    return info, results


def write_docs(db_url: str, out_dir: Path, data_dir: Path | None = None) -> dict[str, Any]:
    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        rows = matrix_rows(engine, data_dir)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        label = db_label(db_url)
        out_dir.mkdir(parents=True, exist_ok=True)
        trends = render_trends(trend_points(engine), out_dir)
        write_atomic(out_dir / "supported-models.md", render_markdown(rows, generated_at=now, db_label=label))
        write_atomic(out_dir / "support-matrix.html",
                     render_html(rows, generated_at=now, db_label=label, trends=trends, docs_dir=out_dir))
        linked = {m.previous_run_id for r in rows for m in r.regressions if m.previous_run_id is not None}
        with Session(engine) as s:  # a bring-up's run page links its report, whether or not it made rows
            bringups = set(s.scalars(select(Run.id).where(Run.kind == RunKind.BRINGUP.value)
                                     .order_by(Run.id.desc()).limit(BRINGUP_PAGES)))
        for run_id in sorted({r.run_id for r in rows} | linked | bringups):
            info, results = run_evidence(engine, run_id, data_dir)
            if info.get("report_path"):  # relative to the run page, so the docs and data dir can move together
                info["report_link"] = os.path.relpath(Path(str(info["report_path"])) / "report.md", out_dir / "runs")
            write_atomic(out_dir / "runs" / f"run-{run_id}.md", render_run_page(info, results))
        # the same evidence in each toolchain's own page layout (<its directory>/supported-models.md, ...)
        layout_pages = [page for layout in docs_layouts()
                        for page in write_layout_pages(engine, out_dir, layout, generated_at=now, db_label=label,
                                                       data_dir=data_dir)["pages"]]
    finally:
        engine.dispose()
    return {"out_dir": str(out_dir), "rows": len(rows), "supported": len(supported(rows)),
            "trend_images": [t.file for t in trends], "layout_pages": layout_pages}


def publish_matrix_artifacts(db_url: str, data_dir: Path | None = None) -> None:
    """Inside a flow run: the support matrix as a Prefect table artifact and the supported rows as a markdown
    artifact, so the run's page in Prefect's UI shows the result."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    engine = read_only_engine(db_url)
    try:
        rows = matrix_rows(engine, data_dir)
    finally:
        engine.dispose()
    table = [{"model": r.model, "precision": r.precision, "platform": r.platform, "job_toolchain": r.job_toolchain,
              "status": html_status(r), "toolchain": r.made_by or "-", "run": r.run_id, "reason": r.reason or ""}
             for r in rows]
    create_table_artifact(table=table, key="support-matrix",
                          description="Latest evidence per model x precision x platform")
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    create_markdown_artifact(markdown=render_markdown(rows, generated_at=now, db_label=db_label(db_url), links=False),
                             key="supported-models", description="Supported models, one table per platform")
