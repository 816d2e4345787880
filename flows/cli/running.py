"""Running a plan from the command line: a temporary Prefect server when none is configured, progress while the
flow runs (a live table on a terminal, one plain line per stage start and end otherwise), the end summary and the
exit code."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, ClassVar

import typer
from rich.live import Live
from rich.table import Table
from rich.text import Text

from flows.cli.common import err, out
from flows.cli.text import cell, visible

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
        from flows.cli.query import print_matrix

        print_matrix(matrix_of)
    raise typer.Exit(_print_summary(result))


JsonOption = Annotated[bool, typer.Option("--json", help="print the run summary as JSON")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="print and validate the plan; touch no device")]
