"""``edgefarm lists ...``: check test lists before anything runs."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Annotated

import typer

from edgefarm.registries import Registries, current
from edgefarm.test_lists.loader import validate_paths
from edgefarm.test_lists.validate import Report

app = typer.Typer(name="lists", help="Test lists: which tests run on which platform.", no_args_is_help=True)


def _summary(report: Report) -> str:
    entries = sum(len(t.entries) for t in report.lists)
    platforms = sorted({p for t in report.lists for p in t.platforms})
    expired = len(report.expired)
    return (
        f"{len(report.lists)} list(s), {entries} entries, platforms: {', '.join(platforms) or '-'}; "
        f"waivers: {len(report.waivers) - expired} active, {expired} expired"
    )


def _origins(report: Report, registries: Registries) -> None:
    """Which files came from the site directory (``$EDGEFARM_SITE_DIR`` / ``--site-dir``), and which of them replace a
    shipped file of the same name."""
    from edgefarm.test_lists.loader import LISTS_DIR

    for f in report.files:
        if registries.origin(f) == "site":
            replaced = " (replaces the shipped one)" if (LISTS_DIR / f.name).is_file() else ""
            typer.echo(f"site: {f}{replaced}")


@app.command("validate")
def validate(
    paths: Annotated[
        list[Path] | None, typer.Argument(help="list files, waivers.yml or directories (default: the shipped lists)")
    ] = None,
    today: Annotated[
        str | None, typer.Option(help="date (YYYY-MM-DD) that waiver expiry is judged against; default: today (UTC)")
    ] = None,
    strict: Annotated[bool, typer.Option(help="treat warnings (expired or unused waivers) as errors")] = False,
) -> None:
    """Validate test lists: print every problem (file:line: entry: field: reason); exit 2 if any."""
    when = None
    if today is not None:
        try:
            when = dt.date.fromisoformat(today)
        except ValueError:
            typer.echo(f"ERROR --today {today!r} is not a date YYYY-MM-DD")
            raise typer.Exit(2) from None
    registries = current()
    report = validate_paths(paths or None, today=when, registries=registries)
    _origins(report, registries)
    for problem in report.errors:
        typer.echo(f"ERROR {problem}")
    for problem in report.warnings:
        typer.echo(f"WARNING {problem}")
    failed = bool(report.errors) or (strict and bool(report.warnings))
    if failed:
        typer.echo(f"FAILED: {len(report.errors)} error(s), {len(report.warnings)} warning(s) "
                   f"in {len(report.files)} file(s)")
        raise typer.Exit(2)
    typer.echo(f"OK: {_summary(report)}; {len(report.warnings)} warning(s)")
