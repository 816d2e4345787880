"""``edgefarm runs``: the runs the farm recorded, newest first (id, kind, status, started, duration, rows per status),
from the results database (``results.runs``), so a run id is never read off a summary line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import typer
from rich.table import Table

from edgefarm.cli.common import DataDirOption, DbOption, farm_errors, print_table
from edgefarm.cli.listing import FormatOption, OutputOption, check_format, emit, to_output
from edgefarm.cli.text import cell

FIELDS = ("id", "kind", "status", "started_at", "duration_s", "rows", "published", "trigger", "flow_run_id")
STYLE = {"passed": "green", "failed": "red", "error": "yellow", "running": "cyan"}


def runs_rows(db_url: str, last: int) -> list[dict[str, Any]]:
    from edgefarm.results.db import read_only_engine, redact
    from edgefarm.results.migrate import require_current
    from edgefarm.results.runs import recent_runs

    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        listed = recent_runs(engine, last)
    finally:
        engine.dispose()
    return [{"id": r.id, "kind": r.kind, "status": r.status,
             "started_at": r.started_at.isoformat(timespec="seconds"), "duration_s": r.duration_s,
             "rows": dict(r.rows), "rungs": r.rungs, "published": r.published, "trigger": r.trigger,
             "flow_run_id": r.flow_run_id} for r in listed]


def _rows_text(r: Mapping[str, Any]) -> str:
    text = ", ".join(f"{n} {k}" for k, n in r["rows"].items())
    if r["rungs"]:
        text = ", ".join(x for x in (text, f"{r['rungs']} rung(s)") if x)
    return text or "-"


def _table(rows: Sequence[Mapping[str, Any]]) -> None:
    t = Table(title=f"{len(rows)} run(s), newest first")
    for col in ("id", "kind", "status", "started", "duration", "rows"):
        t.add_column(col, no_wrap=col in ("id", "started"))
    for r in rows:
        dur = "running" if r["duration_s"] is None else f"{r['duration_s']:.1f} s"
        t.add_row(cell(r["id"]), cell(r["kind"]), cell(r["status"], STYLE.get(r["status"], "")),
                  cell(r["started_at"].replace("T", " ")), cell(dur), cell(_rows_text(r)))
    print_table(t)


def runs(
    last: Annotated[int, typer.Option("--last", help="how many runs, newest first")] = 20,
    fmt: FormatOption = "table",
    output: OutputOption = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """The latest runs: id, kind, status, started, duration and rows per status (a row counted under its worst
    stage)."""
    with farm_errors("runs"):
        from edgefarm.flows.settings import Settings

        fmt = check_format(fmt)
        db_url = Settings.resolve(db=db, data_dir=data_dir, create=False).existing_db_url()
        rows = runs_rows(db_url, last)
        with to_output(output):
            emit(rows, FIELDS, fmt, _table)
