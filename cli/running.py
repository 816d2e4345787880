"""Running a plan from the command line: a temporary Prefect server when none is configured, progress while the
flow runs (a live table on a terminal, one plain line per stage start and end otherwise), the end summary and the
exit code."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from edgefarm.cli.common import err, out
from edgefarm.cli.progress import Progress, ProgressLines
from edgefarm.cli.text import visible

TEMPORARY_SERVER_STARTUP_S = 300.0  # its first start migrates a new database; shared machines are slow
NOTHING_RAN = 5  # the exit code when no stage ran (pytest's "no tests collected")


def _say(console: Console, text: str) -> None:
    """A plain status line (what the command is doing), with the time: readable in any log."""
    console.print(f"{time.strftime('%H:%M:%S')} {visible(text)}", markup=False, highlight=False)


@contextmanager
def temporary_server(data_dir: Path, console: Console | None = None) -> Iterator[None]:
    """With no Prefect API configured, run the command's flow against a temporary server started here (Prefect's
    own ephemeral one would outlive a killed orchestrator): it dies with this process, or when the block ends."""
    from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

    if get_current_settings().api.url:  # a server of its own (edgefarm serve, production): its logs reach it now
        try:
            yield
        finally:
            _flush_logs()
        return
    from edgefarm.flows.prefect_env import free_port
    from edgefarm.flows.serve import start_server, stop_server

    say = console or err
    server_log = data_dir / "prefect" / "temporary-server.log"
    _say(say, f"starting a temporary Prefect server for this run (log: {server_log}; `edgefarm serve` keeps one "
              f"with its UI)")
    t0 = time.monotonic()
    proc, api_url = start_server("127.0.0.1", free_port(), server_log, timeout_s=TEMPORARY_SERVER_STARTUP_S)
    _say(say, f"Prefect server up in {time.monotonic() - t0:.1f} s at {api_url}")
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


def announce_flow_run(flow: Any, console: Console | None = None) -> Any:
    """The flow, printing its run's URL when it starts if runs are reported to a server (not a temporary one)."""
    from edgefarm.pages.prefect_ui import flow_run_ui_url, reporting_server

    if reporting_server() is None:
        return flow

    def announce(_flow: Any, flow_run: Any, _state: Any) -> None:
        (console or out).print(f"flow run: {flow_run_ui_url(flow_run.id)}", markup=False)

    return flow.with_options(on_running=[announce])


PlanFormatOption = Annotated[str, typer.Option("--format", help="text | json: how the plan (--dry-run) or the run's "
                                                               "summary is printed")]


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


def _run_with_progress(plan: Any, fn: Callable[[], dict[str, Any]], console: Console) -> dict[str, Any]:
    """``fn()`` with its stages' progress on ``console``: a live table on a terminal, else one line per stage start
    and end."""
    from edgefarm.stages import progress_columns
    from edgefarm.tasks.progress import subscribe

    jobs = plan.runnable()
    stages = progress_columns(j.entry.stages for j in jobs)
    live_table = console.is_terminal and bool(jobs)
    progress: Progress | ProgressLines = Progress(plan.name, jobs, stages) if live_table else \
        ProgressLines(console, jobs)
    unsubscribe = subscribe(progress.update)
    try:
        if isinstance(progress, Progress):
            with Live(progress.table(), console=console, refresh_per_second=2) as live:
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


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))) or "none"


def _jobs(plan_counts: dict[str, int]) -> str:
    """A plan's decisions in words: ``3 jobs to run, 44 not applicable, 2 skipped``."""
    parts = [f"{n} job{'s' if n != 1 else ''} to run" for k, n in plan_counts.items() if k == "run"]
    parts += [f"{n} {k.replace('_', ' ')}" for k, n in sorted(plan_counts.items()) if k != "run"]
    return ", ".join(parts) or "no jobs"


def _print_summary(result: dict[str, Any]) -> int:
    """The end of a run for a person: what ran, every failing row with its root cause and how to open its log;
    returns the exit code (0 passed, 1 a row failed, 5 nothing ran)."""
    t = result.get("timing") or {}
    ran = f"run {result['run_id']}" if result.get("run_id") is not None else "no run recorded (nothing to do)"
    out.print(f"{ran}: {sum((result.get('stages') or {}).values())} stage results "
              f"({_counts(result.get('stages') or {})}); plan: {_jobs(result.get('plan') or {})}", markup=False)
    hits = result.get("cache_hits") or {}
    out.print("reused (inputs unchanged): " + (", ".join(f"{k} {v}" for k, v in sorted(hits.items())) or "none"),
              markup=False)
    if t:
        out.print(f"wall {t.get('wall_s')} s, critical path {t.get('critical_path_s')} s "
                  f"(ratio {t.get('wall_over_critical_path')}); Prefect overhead per task "
                  f"{t.get('median_task_overhead_ms')} ms (median), start latency once inputs are ready "
                  f"{t.get('median_task_start_latency_ms')} ms", markup=False)
    if result.get("docs"):
        d = result["docs"]
        out.print(f"docs: {d['out_dir']}/support-matrix.html and supported-models.md "
                  f"({d['supported']} supported of {d['rows']} rows)", markup=False)
    failed = result["failures"]
    if failed:
        out.print(Text(f"{len(failed)} row(s) failed (root cause: the first stage that failed):", style="red"))
        for f in failed:
            kind = f" ({f['error_kind']})" if f.get("error_kind") else ""
            where = f" on {f['device']}" if f.get("device") else ""
            out.print(Text.assemble("  ✗ ", (visible(f["row"]), "bold"),
                                    visible(f": {f['stage']} {f['status']}{kind}{where}: {f['reason']}")))
            for log_id in f.get("logs") or []:  # the check's evidence (report:) first, then the tools' logs
                what = "evidence" if str(log_id).startswith("report:") else "log"
                out.print(f"      {what}: edgefarm show {visible(log_id)}", markup=False)
        return 1
    if result.get("nothing_ran"):
        out.print(Text(f"nothing ran (exit {NOTHING_RAN}):", style="yellow"))
        for why in result.get("why_nothing_ran") or []:
            out.print(f"  {visible(why)}", markup=False)
        return NOTHING_RAN
    return 0


def _plan_and_run(settings: Any, plan_of: Callable[[bool], Any], flow: Any, *, dry_run: bool, fmt: str,
                  console: Console | None = None, **params: Any) -> dict[str, Any] | None:
    """Plan once; a dry run prints the plan (None), otherwise the flow runs with that plan on a temporary Prefect
    server (unless one is configured) with its progress on ``console`` (stdout; stderr when stdout carries JSON).
    ``plan_of(install)`` makes the plan, installing pinned toolchains only for a real run."""
    from edgefarm.flows.run_state import flow_summary
    from edgefarm.results.db import for_parameters

    say = console or out
    if not dry_run:
        _say(say, "planning (a toolchain the plan needs and lacks is installed first: minutes, once)")
    t0 = time.monotonic()
    plan = plan_of(not dry_run)
    if dry_run:
        if fmt == "text":  # the plan depends on the data dir (the toolchains installed there): say which one
            where = ("the default: ./.data relative to the current directory" if settings.data_dir_from == "default"
                     else f"from {settings.data_dir_from}")
            out.print(f"data dir: {visible(settings.data_dir)} ({where})", markup=False)
        _print_plan(plan, fmt)
        return None
    _say(say, f"plan {plan.name}: {_jobs(plan.counts())} (planned in {time.monotonic() - t0:.1f} s)")
    if not plan.runnable():  # nothing to do: no server started, no run id taken
        from edgefarm.flows.nightly import why_nothing_ran

        return {"run_id": None, "plan": plan.counts(), "stages": {}, "cache_hits": {}, "failed": [],
                "failures": [], "results": [], "nothing_ran": True, "why_nothing_ran": why_nothing_ran(plan, {}),
                "timing": {}, "transfers": {}, "docs": None}
    db_param = for_parameters(settings.db_url)  # the flow, run in this process, gets the real URL back
    with temporary_server(settings.data_dir, say):
        return _run_with_progress(plan, lambda: flow_summary(announce_flow_run(flow, say)(
            db_url=db_param, data_dir=str(settings.data_dir), inventory=str(settings.inventory_dir),
            trigger="cli", plan=plan, return_state=True, **params)), say)


def exit_code(result: dict[str, Any]) -> int:
    """0 passed, 1 a row failed, 5 nothing ran."""
    if result.get("failed"):
        return 1
    return NOTHING_RAN if result.get("nothing_ran") else 0


def _finish(result: dict[str, Any], *, json_out: bool, matrix_of: str | None = None, junit: Path | None = None,
            suite: str = "edgefarm") -> None:
    """The run's summary (JSON, or the support matrix of ``matrix_of``'s database and a summary), and its JUnit XML
    in ``junit``; the exit code of :func:`exit_code`."""
    if junit is not None:
        from edgefarm.cli.junit import write_junit

        write_junit(result, junit, suite)
    if json_out:
        out.print_json(json.dumps(result, default=str))
        raise typer.Exit(exit_code(result))
    if matrix_of is not None and result.get("run_id") is not None:
        from edgefarm.cli.query import print_matrix

        print_matrix(matrix_of)
    raise typer.Exit(_print_summary(result))


JsonOption = Annotated[bool, typer.Option("--json", help="print the run summary as JSON")]
JsonAliasOption = Annotated[bool, typer.Option("--json", help="the same as --format json (deprecated)")]
JunitOption = Annotated[Path | None, typer.Option("--junit", help="also write the run as JUnit XML to FILE (one test "
                                                                  "case per row and stage)", dir_okay=False)]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="print and validate the plan; touch no device")]
