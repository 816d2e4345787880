"""``edgefarm nightly | run | query | docs | serve | gc``: what release and QA engineers type every day.

Exit codes: 0 all passed, 1 some failed, 2 bad input (every problem listed), 3 infrastructure failure.
Prefect is imported only inside the commands that run flows, after its settings point at the data dir.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer
from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from edgellm.errors import EdgeLLMError, ErrorKind
from flows.cli.text import cell, visible
from flows.escape import spreadsheet_cell

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[str | None, typer.Option("--db", help="results database URL (default: $EDGEFARM_DB_URL, "
                                                           "else <data dir>/edgefarm.db)")]
DataDirOption = Annotated[Path | None, typer.Option("--data-dir", help="farm state (default: $EDGEFARM_DATA_DIR, "
                                                                       "else ./.data)", file_okay=False)]
InventoryOption = Annotated[Path | None, typer.Option(
    "--inventory", help="inventory directory (default: $EDGEFARM_INVENTORY, else devices/inventory)", file_okay=False)]


@contextmanager
def farm_errors(command: str) -> Iterator[None]:
    """Map the library's error kinds to exit codes, one readable block, no traceback."""
    from pydantic import ValidationError

    try:
        yield
    except EdgeLLMError as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        err.print(f"edgefarm {command}: error ({exc.kind.value}): {visible(lines[0])}", markup=False)
        for line in lines[1:]:
            err.print(f"  {visible(line)}", markup=False)
        raise typer.Exit(exc.kind.exit_code) from None
    except ValidationError as exc:  # a flow parameter of the wrong type
        err.print(f"edgefarm {command}: error (configuration): {exc}", markup=False)
        raise typer.Exit(ErrorKind.CONFIGURATION.exit_code) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:  # database, migration, disk, memory...: its kind decides the exit code
        from results.errors import classify

        known = classify(exc)
        err.print(f"edgefarm {command}: error ({known.kind.value}): {known}", markup=False)
        raise typer.Exit(known.kind.exit_code) from None


def _prefect(data_dir: Path) -> None:
    from flows.prefect_env import configure_prefect

    configure_prefect(data_dir)


TEMPORARY_SERVER_STARTUP_S = 300.0  # its first start migrates a new database; shared machines are slow


@contextmanager
def _temporary_server(data_dir: Path) -> Iterator[None]:
    """With no Prefect API configured, run the command's flow against a temporary server started here (Prefect's
    own ephemeral one would outlive a killed orchestrator): it dies with this process, or when the block ends."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url:
        yield
        return
    from flows.prefect_env import free_port
    from flows.serve import start_server, stop_server

    proc, api_url = start_server("127.0.0.1", free_port(), data_dir / "prefect" / "temporary-server.log",
                                 timeout_s=TEMPORARY_SERVER_STARTUP_S)
    try:
        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            try:
                yield
            finally:
                _flush_logs()
    finally:
        stop_server(proc)


def _flush_logs() -> None:
    """Send the flow's queued log records to the server before it stops (they would fail at exit otherwise)."""
    from prefect.logging.handlers import APILogHandler

    try:
        APILogHandler().flush()
    except Exception as exc:
        err.print(f"edgefarm: could not send the run's logs to Prefect: {visible(exc)}", markup=False)


class Progress:
    """Live table of jobs x stages, fed by stage events from the tasks (in-process)."""

    SYMBOL: ClassVar[dict[str, tuple[str, str]]] = {
        "pass": ("pass", "green"), "fail": ("FAIL", "red"), "error": ("ERROR", "yellow"), "skipped": ("skip", "dim"),
        "waived": ("waived", "magenta"), "not_applicable": ("n/a", "dim")}

    def __init__(self, jobs: list[str], stages: list[str]) -> None:
        self.jobs, self.stages = jobs, stages
        self.cells: dict[tuple[str, str], Text] = {}
        self.lock = threading.Lock()

    def update(self, event: Any) -> None:
        mark = cell(*self.SYMBOL.get(event.status, (event.status, "")))
        if event.cached:
            mark.append(" (cached)", style="cyan")
        with self.lock:
            self.cells[(event.job, event.stage)] = mark

    def table(self) -> Table:
        t = Table(title="nightly progress", show_lines=False)
        t.add_column("job")
        for s in self.stages:
            t.add_column(s)
        with self.lock:
            done = len(self.cells)
            for job in self.jobs:
                t.add_row(cell(job), *[self.cells.get((job, s), cell("…", "dim")) for s in self.stages])
        t.caption = f"{done} stage results recorded"
        return t


def _announce_flow_run(flow: Any) -> Any:
    """The flow, printing its run's URL when it starts if runs are reported to a server (not a temporary one)."""
    from flows.prefect_env import flow_run_ui_url, reporting_server

    if reporting_server() is None:
        return flow

    def announce(_flow: Any, flow_run: Any, _state: Any) -> None:
        out.print(f"flow run: {flow_run_ui_url(flow_run.id)}", markup=False)

    return flow.with_options(on_running=[announce])


PlanFormatOption = Annotated[str, typer.Option("--format", help="how --dry-run prints the plan: text | json")]


def _print_plan(plan: Any, fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(plan.to_json(), indent=2) + "\n")
        return
    for line in plan.describe():
        out.print(line, markup=False)


def _plan_format(fmt: str) -> str:
    from edgellm.errors import ConfigurationError

    if fmt not in ("text", "json"):
        raise ConfigurationError(f"unknown --format {fmt!r}; valid: text, json")
    return fmt


def _run_with_progress(plan: Any, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    from stages import progress_columns
    from tasks.progress import subscribe

    jobs = [j.key for j in plan.runnable()]
    stages = progress_columns(j.entry.stages for j in plan.runnable())
    progress = Progress(jobs, stages)
    unsubscribe = subscribe(progress.update)
    try:
        if out.is_terminal and jobs:
            with Live(progress.table(), console=out, refresh_per_second=2) as live:
                stop = threading.Event()

                def refresh() -> None:
                    while not stop.wait(0.5):
                        live.update(progress.table())

                th = threading.Thread(target=refresh, daemon=True)
                th.start()
                try:
                    return fn()
                finally:
                    stop.set()
                    th.join()
                    live.update(progress.table())
        return fn()
    finally:
        unsubscribe()


def _print_summary(result: dict[str, Any]) -> int:
    t = result.get("timing", {})
    out.print(f"run {result['run_id']}: plan {result['plan']}; stage results {result['stages']}", markup=False)
    hits = result.get("cache_hits") or {}
    out.print("cache hits: " + (", ".join(f"{k} {v}" for k, v in sorted(hits.items())) or "none")
              + " (exports and engines are reused when their inputs are unchanged)", markup=False)
    if t:
        out.print(f"wall {t.get('wall_s')} s, critical path {t.get('critical_path_s')} s "
                  f"(ratio {t.get('wall_over_critical_path')}); Prefect overhead per task "
                  f"{t.get('median_task_overhead_ms')} ms (median), start latency once inputs are ready "
                  f"{t.get('median_task_start_latency_ms')} ms", markup=False)
    if result.get("docs"):
        d = result["docs"]
        out.print(f"docs: {d['out_dir']}/supported-models.md and support-matrix.html "
                  f"({d['supported']} supported of {d['rows']} rows)", markup=False)
    if result["failed"]:
        out.print(Text.assemble((f"{len(result['failed'])} job(s) failed: ", "red"),
                                visible(", ".join(result["failed"]))))
        return 1
    return 0


def _plan_and_run(settings: Any, plan_of: Callable[[bool], Any], flow: Any, *, dry_run: bool, fmt: str,
                  **params: Any) -> dict[str, Any] | None:
    """Plan once; a dry run prints the plan (None), otherwise the flow runs with that plan on a temporary Prefect
    server (unless one is configured) with the progress table. ``plan_of(install)`` makes the plan, installing
    pinned toolchains only for a real run."""
    from results.db import for_parameters

    plan = plan_of(not dry_run)
    if dry_run:
        _print_plan(plan, fmt)
        return None
    db_param = for_parameters(settings.db_url)  # the flow, run in this process, gets the real URL back
    with _temporary_server(settings.data_dir):
        return _run_with_progress(plan, lambda: _announce_flow_run(flow)(
            db_url=db_param, data_dir=str(settings.data_dir), inventory=str(settings.inventory_dir),
            trigger="cli", plan=plan, **params))


def _finish(result: dict[str, Any], *, json_out: bool, matrix_of: str | None = None) -> None:
    """The run's summary (JSON, or the support matrix of ``matrix_of``'s database and a summary); exit 1 if a
    job failed."""
    if json_out:
        out.print_json(json.dumps(result, default=str))
        raise typer.Exit(1 if result["failed"] else 0)
    if matrix_of is not None:
        _print_matrix(matrix_of)
    raise typer.Exit(_print_summary(result))


JsonOption = Annotated[bool, typer.Option("--json", help="print the run summary as JSON")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="print and validate the plan; touch no device")]


def nightly(
    matrix: Annotated[Path | None, typer.Option("--matrix", help="matrix file (default: flows/matrices/"
                                                                 "nightly.yml)", dir_okay=False)] = None,
    dry_run: DryRunOption = False,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    inventory: InventoryOption = None,
    docs_dir: Annotated[Path | None, typer.Option("--docs-dir", help="where docs are written (default: "
                                                                     "<data dir>/docs)", file_okay=False)] = None,
    json_out: JsonOption = False,
    fmt: PlanFormatOption = "text",
) -> None:
    """Run the nightly support matrix (models x precisions x platforms) and publish the docs."""
    with farm_errors("nightly"):
        fmt = _plan_format(fmt)
        from flows.plan import DEFAULT_MATRIX
        from flows.settings import Settings

        settings = Settings.resolve(db=db, data_dir=data_dir, inventory=inventory, docs_dir=docs_dir)
        _prefect(settings.data_dir)
        from flows.nightly import make_plan, nightly_support_matrix

        matrix_path = matrix or DEFAULT_MATRIX
        result = _plan_and_run(settings, lambda install: make_plan(matrix_path, settings, install=install),
                               nightly_support_matrix, dry_run=dry_run, fmt=fmt, matrix=str(matrix_path),
                               docs_dir=str(settings.docs_dir))
    if result is not None:
        _finish(result, json_out=json_out, matrix_of=settings.db_url)


def run(
    priority: Annotated[str, typer.Option("--priority", help="test list name, e.g. l0_pipeline_x86cpu")],
    dry_run: DryRunOption = False,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    inventory: InventoryOption = None,
    json_out: JsonOption = False,
    fmt: PlanFormatOption = "text",
) -> None:
    """Run one priority list on the devices its platform selector matches."""
    with farm_errors("run"):
        fmt = _plan_format(fmt)
        from flows.settings import Settings

        settings = Settings.resolve(db=db, data_dir=data_dir, inventory=inventory)
        _prefect(settings.data_dir)
        from flows.test_list import make_plan, run_test_list

        result = _plan_and_run(settings, lambda install: make_plan(priority, settings, install=install),
                               run_test_list, dry_run=dry_run, fmt=fmt, priority=priority)
    if result is not None:
        _finish(result, json_out=json_out)


# a row is (model, precision, platform, job_toolchain: the toolchain its jobs ran with); toolchain and
# toolchain_version name what made its evidence (the last stage that ran)
QUERY_FIELDS = ("model", "precision", "platform", "job_toolchain", "chosen_versions", "status", "toolchain",
                "toolchain_version", "route", "standin", "run_id", "run_kind", "run_started_at", "stages")


def query_rows(db_url: str, *, model: str | None, precision: str | None, platform: str | None,
               status: str | None, toolchain: str | None = None) -> list[dict[str, Any]]:
    from sqlalchemy.orm import Session

    from flows.docs import display_status
    from results.db import read_only_engine, redact
    from results.migrate import require_current
    from results.models import Run
    from results.queries import Verdict, latest_status

    valid = [v.value for v in Verdict] + ["skipped", "waived"]
    if status is not None and status not in valid:
        from edgellm.errors import ConfigurationError

        raise ConfigurationError(f"unknown status {status!r}; valid: {', '.join(valid)}")
    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        with Session(engine) as s:
            rows = latest_status(s, model=model, precision=precision, platform=platform, toolchain=toolchain)
            runs = {r.id: r for r in s.query(Run).filter(Run.id.in_({r.run_id for r in rows}))}
    finally:
        engine.dispose()
    rows_out = [
        {"model": r.key.model, "precision": r.key.precision.value, "platform": r.key.platform,
         "job_toolchain": str(r.key.toolchain),  # a platform running two toolchains: one row each
         "chosen_versions": r.chosen_versions,  # a run comparing toolchain versions: one row per version
         "status": display_status(r.verdict.value, {k.value: v.value for k, v in r.stages.items()}),
         "toolchain": r.toolchain, "toolchain_version": r.toolchain_version, "route": r.route,
         "standin": r.standin, "run_id": r.run_id, "run_kind": runs[r.run_id].kind.value,
         "run_started_at": runs[r.run_id].started_at.isoformat(timespec="seconds"),
         "stages": {k.value: v.value for k, v in r.stages.items()}}
        for r in rows
    ]
    return [r for r in rows_out if status is None or r["status"] == status]


def query(
    model: Annotated[str | None, typer.Option("--model")] = None,
    precision: Annotated[str | None, typer.Option("--precision")] = None,
    platform: Annotated[str | None, typer.Option("--platform")] = None,
    toolchain: Annotated[str | None, typer.Option("--toolchain", help="only rows whose jobs ran with this "
                                                                      "toolchain")] = None,
    status: Annotated[str | None, typer.Option("--status", help="pass | fail | error | incomplete | "
                                                                 "not_applicable | skipped | waived")] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json | csv")] = "table",
    show_regressions: Annotated[bool, typer.Option("--regressions", help="the metrics outside their baseline in "
                                                                         "each row's latest run instead")] = False,
    db: DbOption = None,
) -> None:
    """Which rows pass? The latest status of every (model, precision, platform, toolchain its jobs ran with), from
    the results database."""
    with farm_errors("query"):
        from edgellm.errors import ConfigurationError
        from edgellm.types import Precision
        from flows.settings import Settings
        from toolchains.base import parse as parse_toolchain

        if fmt not in ("table", "json", "csv"):
            raise ConfigurationError(f"unknown --format {fmt!r}; valid: table, json, csv")
        if precision is not None:
            precision = Precision.parse(precision, what="precision").value
        if toolchain is not None:
            toolchain = parse_toolchain(toolchain)
        db_url = Settings.resolve(db=db, create=False).db_url
        if show_regressions:
            _print_regressions(regression_rows(db_url, model=model, precision=precision, platform=platform,
                                               toolchain=toolchain), fmt)
            return
        rows = query_rows(db_url, model=model, precision=precision, platform=platform, status=status,
                          toolchain=toolchain)
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=QUERY_FIELDS)
        writer.writeheader()
        for r in rows:
            row = {**r, "stages": ";".join(f"{k}={v}" for k, v in r["stages"].items())}
            writer.writerow({k: spreadsheet_cell(v) for k, v in row.items()})
        sys.stdout.write(buf.getvalue())
    else:
        from flows.docs_render import row_label, shown_toolchain

        t = Table(title=f"latest status ({len(rows)} rows)")
        compared = any(r["chosen_versions"] for r in rows)  # a column only when some run compared versions
        for col in ("model", "precision", "platform", *(["versions"] if compared else []), "status", "toolchain",
                    "run", "failing stages"):
            t.add_column(col)
        for r in rows:
            colour = {"pass": "green", "fail": "red", "error": "yellow"}.get(r["status"], "dim")
            bad = " ".join(f"{k}:{v}" for k, v in r["stages"].items() if v in ("fail", "error"))
            made_by = " ".join(x for x in (r["toolchain"], r["toolchain_version"],
                                           r["route"] and f"({r['route']} route)",
                                           "STAND-IN (never evidence)" if r["standin"] else None) if x)
            versions = [r["chosen_versions"] or "pinned"] if compared else []
            # as in the docs: a row of a toolchain other than the platform's preferred one names it
            label = row_label(r["model"], None, shown_toolchain(r["platform"], r["job_toolchain"]))
            t.add_row(*map(cell, (label, r["precision"], r["platform"], *versions)), cell(r["status"], colour),
                      *map(cell, (made_by, r["run_id"], bad)))
        out.print(t)


REGRESSION_FIELDS = ("model", "precision", "platform", "job_toolchain", "stage", "test_id", "metric", "severity",
                     "value", "baseline", "spread", "change", "baseline_runs", "run_id", "previous_run_id")


def regression_rows(db_url: str, *, model: str | None, precision: str | None,
                    platform: str | None, toolchain: str | None = None) -> list[dict[str, Any]]:
    from sqlalchemy.orm import Session

    from results.db import read_only_engine, redact
    from results.migrate import require_current
    from results.regressions import published_regressions

    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        with Session(engine) as s:
            flags = published_regressions(s, model=model, platform=platform, toolchain=toolchain)
    finally:
        engine.dispose()
    return [{k: (v.value if hasattr(v, "value") else v) for k, v in
             ((k, getattr(f, k)) for k in REGRESSION_FIELDS)}
            for f in flags if precision is None or f.precision.value == precision]


def _print_regressions(rows: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=REGRESSION_FIELDS)
        writer.writeheader()
        writer.writerows({k: spreadsheet_cell(v) for k, v in r.items()} for r in rows)
        sys.stdout.write(buf.getvalue())
        return
    from flows.docs_render import row_label, shown_toolchain

    t = Table(title=f"regressions in the latest runs ({len(rows)})")
    for col in ("model", "precision", "platform", "metric", "severity", "value", "baseline (median)", "change",
                "runs"):
        t.add_column(col)
    for r in rows:
        colour = "red" if r["severity"] == "fail" else "yellow"
        label = row_label(r["model"], None, shown_toolchain(r["platform"], r["job_toolchain"]))
        t.add_row(*map(cell, (label, r["precision"], r["platform"], r["metric"])), cell(r["severity"], colour),
                  *map(cell, (f"{r['value']:.4g}", f"{r['baseline']:.4g}", f"{r['change']:.1%} worse",
                              f"{r['previous_run_id']} -> {r['run_id']}")))
    out.print(t)


def _print_matrix(db_url: str) -> None:
    """The nightly's end table: one line per model (and toolchain, where a platform runs several) x precision."""
    from flows.docs_render import row_label, shown_toolchain

    rows = query_rows(db_url, model=None, precision=None, platform=None, status=None)
    platforms = sorted({r["platform"] for r in rows})
    t = Table(title="support matrix (latest evidence)")
    t.add_column("model")
    t.add_column("precision")
    for p in platforms:
        t.add_column(cell(p))

    def label(r: dict[str, Any]) -> str:
        return row_label(r["model"], r["chosen_versions"], shown_toolchain(r["platform"], r["job_toolchain"]))

    cells = {(label(r), r["precision"], r["platform"]): r["status"] for r in rows}
    colour = {"pass": "green", "fail": "red", "error": "yellow"}
    for model, precision in sorted({(label(r), r["precision"]) for r in rows}):
        vals = []
        for p in platforms:
            st = cells.get((model, precision, p), "")
            vals.append(cell(st, colour.get(st, "dim")) if st else cell(""))
        t.add_row(cell(model), cell(precision), *vals)
    out.print(t)


def docs(
    out_dir: Annotated[Path | None, typer.Option("--out", help="output directory (default: $EDGEFARM_DOCS_DIR, "
                                                              "else <data dir>/docs)", file_okay=False)] = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Regenerate supported-models.md, the HTML support matrix and the perf trends from the database."""
    with farm_errors("docs"):
        from flows.docs import write_docs
        from flows.settings import Settings

        settings = Settings.resolve(db=db, data_dir=data_dir, docs_dir=out_dir)
        result = write_docs(settings.db_url, settings.docs_dir, settings.data_dir)
    out.print(f"wrote {result['out_dir']}/supported-models.md, support-matrix.html, runs/ and "
              f"{len(result['trend_images'])} trend plot(s): {result['supported']} supported of {result['rows']} rows",
              markup=False)


def _announce_ui(url: str) -> None:
    out.print(f"Prefect UI: {url} (deployments, schedules, runs, logs); stop with Ctrl-C", markup=False)


def serve(
    port: Annotated[int, typer.Option("--port", help="Prefect server port on 127.0.0.1")] = 4200,
    data_dir: DataDirOption = None,
    deployment: Annotated[list[str] | None, typer.Option("--deployment", help="deployments of infra/prefect.yaml "
                                                                              "to serve (default: nightly, "
                                                                              "l0-x86-cpu)")] = None,
) -> None:
    """A local Prefect server with its UI plus a runner serving the nightly schedule (02:00) and the L0 deployment."""
    with farm_errors("serve"):
        from flows.settings import Settings

        settings = Settings.resolve(data_dir=data_dir)
        _prefect(settings.data_dir)
        from flows.serve import serve as run_serve

        raise typer.Exit(run_serve("127.0.0.1", port, settings.data_dir, deployment, announce=_announce_ui,
                                   auth=settings.serve_auth))


MAX_GC_AGE_DAYS = 36500  # a century: anything larger is a typo, and would overflow to an infinite age


def gc(
    older_than_days: Annotated[float, typer.Option("--older-than-days", help="only blobs last stored before this "
                                                                            "many days ago")] = 14.0,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Remove artifacts no result and no cache entry refers to (never referenced or recent ones)."""
    with farm_errors("gc"):
        from edgellm.errors import ConfigurationError
        from flows.settings import Settings
        from results import cache
        from results.db import read_only_engine, redact
        from results.migrate import require_current
        from results.recorder import Recorder
        from tasks.host import sweep_dead_work
        from toolchains import base as toolchains

        if not (math.isfinite(older_than_days) and 0 <= older_than_days <= MAX_GC_AGE_DAYS):
            raise ConfigurationError(f"bad --older-than-days {older_than_days!r}: need a number of days from 0 to "
                                     f"{MAX_GC_AGE_DAYS} (0: every unreferenced blob; not nan, inf or negative)")
        settings = Settings.resolve(db=db, data_dir=data_dir)
        engine = read_only_engine(settings.db_url)
        referenced: set[str] = set()

        def read_references() -> set[str]:  # read by the store once puts are held off
            referenced.update(Recorder(engine).referenced_artifacts() | cache.referenced(engine))
            return referenced

        store = settings.artifact_store()
        try:
            require_current(engine, redact(settings.db_url))
            removed = store.gc(read_references, older_than_days * 86400)
        finally:
            engine.dispose()
            store.close()
        dead = sweep_dead_work(settings.data_dir)  # left by killed runs, whatever their age
        installs = [p for name in toolchains.names()
                    for p in toolchains.driver(name, settings.data_dir).sweep_dead_installs()]
    out.print(f"removed {len(removed)} unreferenced blob(s) older than {older_than_days:g} day(s); "
              f"{len(referenced)} referenced blob(s) kept; {len(dead)} scratch dir(s) of dead runs removed; "
              f"{len(installs)} leftover(s) of killed toolchain installs removed", markup=False)
