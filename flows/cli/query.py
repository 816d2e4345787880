"""``edgefarm query``: which rows pass, from the results database (and the nightly's end table)."""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from flows.cli.common import DbOption, farm_errors, out
from flows.cli.text import cell
from flows.escape import spreadsheet_cell

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


def print_matrix(db_url: str) -> None:
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
