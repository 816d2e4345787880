"""The docs: supported-models.md, the HTML support matrix, per-run evidence pages and perf trends, generated
from the results database only. Whether a row is "supported" is results/queries.py's one definition
(:func:`results.queries.supported`: inference and its accuracy baseline passed on that platform in the latest run
that tested it); a row is one (model, precision, platform, the toolchain its jobs ran with). Every page shows a
row's status in the one vocabulary of ``results.support`` (``SupportStatus``).

Pages per purpose: the nightly's pages (:func:`write_docs`: supported-models.md, support-matrix.html, the toolchains'
layouts, trends; and :func:`publish_matrix_artifacts`, the Prefect artifacts) show the nightly-page runs only
(``results.support.NIGHTLY_PAGE_KINDS``); a test-list run publishes its own page, ``lists/<list>.md`` and ``.html``
(:func:`publish_test_list`, called at the end of ``flows.test_list.run_test_list``); neither rewrites the other.
Each run a page links has ``runs/run-N.md`` and ``runs/run-N.html`` (``pages.docs_runs``), with its logs beside
them (``runs/logs/``).

Published pages name the database backend only and carry no orchestrator paths, hosts or URLs (see ``scrub``).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgefarm.pages import docs_runs
from edgefarm.pages.compare import ensure_index as ensure_compare_index
from edgefarm.pages.docs_html import html_status, render_html
from edgefarm.pages.docs_layout import write_layout_pages
from edgefarm.pages.docs_regressions import RegressionMark
from edgefarm.pages.docs_render import (
    MatrixRow,
    TrendPoint,
    render_markdown,
    render_trends,
    row_anchor,
    row_label,
    scrub,
    shown_toolchain,
    supported,
    write_atomic,
)
from edgefarm.pages.escape import markdown_text, safe_link
from edgefarm.registries import current
from edgefarm.results.bisections import bisection_lines_of_run
from edgefarm.results.db import Db, Engine, backend_name, read_only_engine, reading, redact
from edgefarm.results.migrate import require_current
from edgefarm.results.models import ArtifactKind, RunKind
from edgefarm.results.pages import MatrixEvidence, ResultLine, matrix_evidence, run_record, run_results, trend_rows
from edgefarm.results.queries import RowStatus
from edgefarm.results.regressions import published_regressions
from edgefarm.results.support import NIGHTLY_PAGE_KINDS, Support, row_supports, stage_order
from edgefarm.toolchains.base import docs_layouts

log = logging.getLogger(__name__)
TREND_METRICS = ("decode_tokens_per_s", "prefill_tokens_per_s", "perplexity_ratio")
BACKEND_NAMES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def db_label(db_url: str) -> str:
    """The database backend only: published pages never carry its path, host or credentials."""
    backend = backend_name(db_url)
    return BACKEND_NAMES.get(backend, backend)


def model_parameters(models: set[str], data_dir: Path | None) -> dict[str, int]:
    """Parameter counts (headers only) of the catalog models whose checkpoint is already here; nothing is
    materialized or downloaded for the docs, so a model whose checkpoint is absent has no count."""
    from edgefarm.test_lists.catalog import Catalog
    from edgellm.checkpoint.checkpoint import Checkpoint
    from edgellm.errors import EdgeLLMError

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


def matrix_rows(engine: Engine, data_dir: Path | None = None, *, kinds: Collection[RunKind | str] | None =
                NIGHTLY_PAGE_KINDS, run_id: int | None = None) -> list[MatrixRow]:
    """The latest evidence per row (model, precision, platform, job toolchain), with the key metrics of that run
    and its support status (``results.support``): from each row's latest published run of ``kinds`` (the
    nightly's pages: ``NIGHTLY_PAGE_KINDS``; None: any run), or from the one run ``run_id`` (a test list's page)."""
    with reading(engine) as s:
        evidence = matrix_evidence(s, kinds=kinds, run_id=run_id)
        marks = regression_marks(s)
    return _matrix_rows(evidence, marks, data_dir)


def _matrix_rows(evidence: list[MatrixEvidence], marks: dict[tuple[str, str, str, str], list[RegressionMark]],
                 data_dir: Path | None) -> list[MatrixRow]:
    rows = []
    params = model_parameters({ev.status.key.model for ev in evidence}, data_dir)
    for ev in evidence:
        st, support, results, metrics = ev.status, ev.support, ev.results, dict(ev.metrics)
        reasons = row_reasons(results, support, st, data_dir)
        devices = sorted({r.device for r in results if r.device and r.device != "orchestrator"})
        rows.append(MatrixRow(
            model=st.key.model, precision=st.key.precision.value, platform=st.key.platform,
            status=st.verdict.value, run_id=st.run_id, run_started=ev.run_started_at.isoformat(timespec="seconds"),
            device=scrub(", ".join(devices), data_dir) or None,
            reason="; ".join(reasons) or None, reasons=tuple(reasons),
            stages={k.value: v.value for k, v in st.stages.items()}, metrics=metrics,
            toolchain=st.toolchain, toolchain_version=st.toolchain_version, params=params.get(st.key.model),
            regressions=tuple(marks.get((st.key.model, st.key.precision.value, st.key.platform,
                                         str(st.key.toolchain)), ())),
            chosen_versions=st.chosen_versions, job_toolchain=str(st.key.toolchain), route=st.route,
            variant=st.key.variant, support=replace(support, reason=scrub(support.reason, data_dir)),
            bug=safe_link(support.link),
        ))
    return rows


def row_reasons(results: Sequence[ResultLine], support: Support, st: RowStatus, data_dir: Path | None) -> list[str]:
    """A row's reasons, each once, scrubbed: its root cause first (``Support.reason``), then the others in pipeline
    order, each with the stages that gave it unless every stage did."""
    by_reason: dict[str, list[str]] = defaultdict(list)
    for r in sorted(results, key=lambda r: stage_order(r.stage)):
        if r.reason and r.status != "pass" and r.stage not in by_reason[r.reason]:
            by_reason[r.reason].append(r.stage)
    stages = {r.stage for r in results}
    reasons = []
    if support.reason:
        reasons.append(support.reason)
    for why, named in by_reason.items():
        if why != support.reason:
            reasons.append(f"{'/'.join(named)}: {why}" if len(named) < len(stages) else why)
    if st.standin:  # its passes ran on stand-ins: never supported (queries keep its verdict incomplete)
        reasons.insert(0, "STAND-IN tools (test only, never evidence)")
    if st.route:
        reasons.append(f"route: {st.route}")
    return [x for x in dict.fromkeys(scrub(x, data_dir) or "" for x in reasons) if x]


def regression_marks(db: Db) -> dict[tuple[str, str, str, str], list[RegressionMark]]:
    """Regressions flagged in each row's latest published run, by row (model, precision, platform, job toolchain)."""
    marks: dict[tuple[str, str, str, str], list[RegressionMark]] = defaultdict(list)
    for f in published_regressions(db):
        marks[(f.model, f.precision.value, f.platform, str(f.job_toolchain))].append(RegressionMark(
            f.metric, f.value, f.baseline, f.change, f.severity.value, f.run_id, f.previous_run_id))
    return marks


def trend_points(engine: Engine) -> list[TrendPoint]:
    """Trend metrics of the published nightly runs; a row of a platform's other toolchain is its own line, named
    by its label."""
    return [TrendPoint(run_id=t.run_id, started=t.started_at.isoformat(),
                       model=row_label(t.model, None, shown_toolchain(t.platform, t.job_toolchain)),
                       precision=t.precision, platform=t.platform, metric=t.metric, value=t.value)
            for t in trend_rows(engine, TREND_METRICS)]


def run_evidence(engine: Engine, run_id: int,
                 data_dir: Path | None = None) -> tuple[dict[str, object], list[dict[str, object]]]:
    run = run_record(engine, run_id)
    info = {"id": run.id, "kind": run.kind, "status": run.status, "trigger": scrub(run.trigger),
            "code_version": run.code_version, "started_at": run.started_at.isoformat(timespec="seconds"),
            "finished_at": run.finished_at.isoformat(timespec="seconds") if run.finished_at else None,
            "report": scrub(run.report, data_dir), "report_path": run.report,
            "rungs": [{"position": g.position, "name": g.name, "status": g.status,
                       "reason": scrub(g.reason, data_dir), "duration_s": g.duration_s} for g in run.rungs]}
    results = [{"model": r.model, "precision": r.precision, "platform": r.platform, "stage": r.stage,
                "status": r.status, "device": scrub(r.device, data_dir), "toolchain": r.toolchain,
                "toolchain_version": r.toolchain_version, "job_toolchain": r.job_toolchain,
                "chosen_versions": r.chosen_versions, "variant": r.variant,
                "reason": scrub(r.reason, data_dir), "duration_s": r.duration_s,
                "metrics": sorted(r.evidence.metrics), "artifacts": list(r.evidence.artifacts)}
               for r in run_results(engine, run_id)]
    return info, results


LOG_BYTES = 1_000_000  # a log's copy beside its run page keeps its last MB (its tail: where a failure says why)


def run_states(engine: Engine, run_id: int, data_dir: Path | None = None) -> dict[str, Support]:
    """Each row's support status in one run, by its anchor on the run's pages (reasons scrubbed)."""
    out = {}
    for st, support in row_supports(engine, run_id=run_id):
        key = st.key
        out[row_anchor(key.model, str(key.precision), key.platform, st.chosen_versions,
                       shown_toolchain(key.platform, str(key.toolchain)), key.variant)] = replace(
            support, reason=scrub(support.reason, data_dir))
    return out


def copy_logs(results: Sequence[dict[str, object]], runs_dir: Path, data_dir: Path | None) -> dict[str, str]:
    """Copy the run's log artifacts that this host's store holds beside its pages (``runs/logs/<sha12>.txt``, their
    last ``LOG_BYTES``, scrubbed like every published text); returns sha256 -> the copy, relative to ``runs_dir``."""
    if data_dir is None:
        return {}
    from edgefarm.artifacts.store import ArtifactStore
    from edgellm.errors import EdgeLLMError

    store = ArtifactStore(data_dir / "artifacts")
    out = {}
    for res in results:
        for kind, sha in res.get("artifacts", []):  # type: ignore[attr-defined]
            if kind != ArtifactKind.LOG.value or sha in out:
                continue
            try:
                blob = store.path(sha)
                with blob.open("rb") as f:
                    size = blob.stat().st_size
                    f.seek(max(0, size - LOG_BYTES))
                    data = f.read()
            except (OSError, ValueError, EdgeLLMError) as exc:  # not in this host's store (another's, collected)
                log.info("log %s not copied beside its run page: %s", sha[:12], exc)
                continue
            cut = f"[first {size - LOG_BYTES} bytes not copied]\n" if size > LOG_BYTES else ""
            name = docs_runs.log_name(sha)
            write_atomic(runs_dir / name, cut + (scrub(data.decode("utf-8", "replace"), data_dir) or ""))
            out[sha] = name
    return out


def prefect_link(engine: Engine, run_id: int) -> dict[str, str]:
    """The Prefect flow run that orchestrated ``run_id`` and its page in the UI, when a server that keeps it is
    known (``PREFECT_API_URL``: ``edgefarm serve`` or production; a command's temporary server is gone after it)."""
    from edgefarm.pages.prefect_ui import flow_run_ui_url
    from edgefarm.results.runs import orchestrator_flow_run

    flow_run_id = orchestrator_flow_run(engine, run_id)
    url = flow_run_ui_url(flow_run_id) if flow_run_id else None
    return {"flow_run_id": flow_run_id, "prefect_url": url} if flow_run_id and url else {}


def write_run_pages(engine: Engine, out_dir: Path, run_ids: Iterable[int], data_dir: Path | None) -> list[int]:
    """``runs/run-N.md`` and ``runs/run-N.html`` of each run, with its rows' statuses and its logs beside them."""
    written = []
    for run_id in sorted(set(run_ids)):
        info, results = run_evidence(engine, run_id, data_dir)
        if info.get("report_path"):  # relative to the run page, so the docs and data dir can move together
            info["report_link"] = os.path.relpath(Path(str(info["report_path"])) / "report.md", out_dir / "runs")
        info.update(prefect_link(engine, run_id))
        info["bisections"] = bisection_lines_of_run(engine, run_id)
        states = run_states(engine, run_id, data_dir)
        logs = copy_logs(results, out_dir / "runs", data_dir)
        write_atomic(out_dir / "runs" / f"run-{run_id}.md", docs_runs.render_markdown(info, results, states, logs))
        write_atomic(out_dir / "runs" / f"run-{run_id}.html", docs_runs.render_html(info, results, states, logs))
        written.append(run_id)
    return written


def usable_memory() -> dict[str, float]:
    """Each device type's usable memory (GiB: ``memory_gb`` less its OS share), what the matrix's "fits on" filter
    offers: the packaged types and the site directory's."""
    return {name: t.usable_memory_gb for name, t in current().device_types.items()}


def write_docs(db_url: str, out_dir: Path, data_dir: Path | None = None) -> dict[str, Any]:
    """The nightly's pages (supported-models.md, support-matrix.html, the toolchains' layouts, trends) from the
    nightly-page runs only (``results.support.NIGHTLY_PAGE_KINDS``), and the run pages they link. A test list's
    page (``lists/``, :func:`publish_test_list`) and a bring-up's run page (:func:`publish_bringup`) are left as
    they are."""
    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        rows = matrix_rows(engine, data_dir)
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        label = db_label(db_url)
        out_dir.mkdir(parents=True, exist_ok=True)
        trends = render_trends(trend_points(engine), out_dir)
        ensure_compare_index(out_dir)  # the pages link the comparisons' index: it exists before any compare
        write_atomic(out_dir / "supported-models.md", render_markdown(rows, generated_at=now, db_label=label))
        write_atomic(out_dir / "support-matrix.html",
                     render_html(rows, generated_at=now, db_label=label, trends=trends, docs_dir=out_dir,
                                 usable_gb=usable_memory()))
        linked = {m.previous_run_id for r in rows for m in r.regressions if m.previous_run_id is not None}
        write_run_pages(engine, out_dir, {r.run_id for r in rows} | linked, data_dir)
        # the same evidence in each toolchain's own page layout (<its directory>/supported-models.md, ...)
        layout_pages = [page for layout in docs_layouts()
                        for page in write_layout_pages(engine, out_dir, layout, generated_at=now, db_label=label,
                                                       data_dir=data_dir)["pages"]]
    finally:
        engine.dispose()
    return {"out_dir": str(out_dir), "rows": len(rows), "supported": len(supported(rows)),
            "trend_images": [t.file for t in trends], "layout_pages": layout_pages}


def publish_bringup(db_url: str, docs_dir: Path, run_id: int, data_dir: Path | None = None) -> Path:
    """A bring-up's own run page (``runs/run-N.md`` and ``.html``: its rungs, its rows, a link to its report) and
    nothing else: a bring-up never rewrites or joins the nightly's pages (issue 41: a scratch checkpoint brought up
    once is not support). Returns the markdown page."""
    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        write_run_pages(engine, docs_dir, [run_id], data_dir)
    finally:
        engine.dispose()
    return docs_dir / "runs" / f"run-{run_id}.md"


LISTS_DIR = "lists"  # a test list's own page: <docs>/lists/<list name>.md and .html


def list_page_name(list_name: str) -> str:
    """The file name (without suffix) of a test list's page: the list's name, or its slug where it has other
    characters (a list's name is its file's stem)."""
    from edgefarm.pages.docs_render import slug

    return list_name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", list_name) else (slug(list_name) or "list")


def publish_test_list(db_url: str, docs_dir: Path, list_name: str, run_id: int,
                      data_dir: Path | None = None) -> dict[str, Any]:
    """A test-list run's own page: ``<docs_dir>/lists/<list>.md`` and ``.html`` with the rows of its run ``run_id``
    (each row's status in the one vocabulary, linked to the run's pages, which are written too). The nightly's pages
    are never read or rewritten here, and the nightly's never show a list run's rows."""
    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        rows = [replace(r, link_base="../", regressions=()) for r in matrix_rows(engine, data_dir, kinds=None,
                                                                                 run_id=run_id)]
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        label = db_label(db_url)
        name = list_page_name(list_name)
        title = f"Test list {list_name}"
        md_intro = [f"The rows of the latest run of the test list (run {run_id}); the nightly's pages are "
                    "[supported models](../supported-models.md) and [support matrix](../support-matrix.html).", ""]
        html_intro = (f"<p>The rows of the latest run of the test list (run {run_id}); the nightly's pages are "
                      "<a href='../supported-models.md'>supported models</a> and "
                      "<a href='../support-matrix.html'>support matrix</a>.</p>")
        folder = docs_dir / LISTS_DIR
        write_atomic(folder / f"{name}.md", render_markdown(rows, generated_at=now, db_label=label,
                                                            title=markdown_text(title), intro=md_intro))
        write_atomic(folder / f"{name}.html", render_html(rows, generated_at=now, db_label=label, title=title,
                                                          intro=html_intro, see_also=False,
                                                          usable_gb=usable_memory()))
        write_run_pages(engine, docs_dir, [run_id], data_dir)
    finally:
        engine.dispose()
    return {"pages": [f"{LISTS_DIR}/{name}.md", f"{LISTS_DIR}/{name}.html"], "rows": len(rows), "run_id": run_id}


def publish_matrix_artifacts(db_url: str, data_dir: Path | None = None) -> None:
    """Inside a flow run: the support matrix as a Prefect table artifact and the supported rows as a markdown
    artifact, so the run's page in Prefect's UI shows the result (the nightly's pages' rows: nightly-page runs
    only); statuses in the one vocabulary, the root cause first, a waiver's bug link kept."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    engine = read_only_engine(db_url)
    try:
        rows = matrix_rows(engine, data_dir)
    finally:
        engine.dispose()
    table = [{"model": r.model, "precision": r.precision, "platform": r.platform, "job_toolchain": r.job_toolchain,
              "status": html_status(r), "label": r.state.label, "toolchain": r.made_by or "-", "run": r.run_id,
              "reason": r.reason or "", "bug": r.bug or ""}
             for r in rows]
    create_table_artifact(table=table, key="support-matrix",
                          description="Latest evidence per model x precision x platform")
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    create_markdown_artifact(markdown=render_markdown(rows, generated_at=now, db_label=db_label(db_url), links=False),
                             key="supported-models", description="Supported models, one table per platform")
