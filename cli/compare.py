"""``edgefarm compare``: what changed between two toolchain versions, two runs or two commits of the farm (the logic
and the pages: pages/compare.py). Exit codes: 0 compared, 1 a row regressed (only with --fail-on-regression),
2 bad input (the message names the bad value and the valid ones), 3 infrastructure failure."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from edgefarm.cli.common import DataDirOption, DbOption, err, farm_errors, out, print_table
from edgefarm.cli.query import colour
from edgefarm.cli.text import cell

FORMATS = ("table", "json")


def _side_args(toolchain: str | None, against: str | None, runs: tuple[int, int] | None,
               commits: tuple[str, str] | None) -> tuple[Any, Any]:
    from edgefarm.pages.compare import RunSide, parse_commit, parse_toolchain_sides
    from edgellm.errors import ConfigurationError

    given = [name for name, v in (("--toolchain/--against", toolchain or against), ("--runs", runs),
                                  ("--commits", commits)) if v]
    if len(given) != 1:
        raise ConfigurationError(f"give exactly one of --toolchain NAME==A --against ==B, --runs A B, --commits X Y "
                                 f"(got {', '.join(given) or 'none'})")
    if toolchain or against:
        if not (toolchain and against):
            missing = "--against" if toolchain else "--toolchain"
            raise ConfigurationError(f"{missing} is missing: give --toolchain NAME==A --against ==B")
        return parse_toolchain_sides(toolchain, against)
    if runs:
        bad = [r for r in runs if r < 1]
        if bad:
            raise ConfigurationError(f"bad run id {bad[0]!r}; valid: a run id >= 1")
        return RunSide(runs[0]), RunSide(runs[1])
    assert commits is not None
    return parse_commit(commits[0]), parse_commit(commits[1])


def compare(
    toolchain: Annotated[str | None, typer.Option("--toolchain", help="side A: a toolchain at a version, "
                                                                      "NAME==VERSION")] = None,
    against: Annotated[str | None, typer.Option("--against", help="side B: ==VERSION (or NAME==VERSION) of the "
                                                                  "same toolchain")] = None,
    runs: Annotated[tuple[int, int] | None, typer.Option("--runs", help="two published run ids: A B")] = None,
    commits: Annotated[tuple[str, str] | None, typer.Option("--commits", help="two commits of this farm (prefixes): "
                                                                              "the latest published nightly of each")
                       ] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json")] = "table",
    docs_dir: Annotated[Path | None, typer.Option("--docs-dir", help="where the pages go (default: where `edgefarm "
                                                                     "docs` writes: $EDGEFARM_DOCS_DIR, else <data "
                                                                     "dir>/docs)", file_okay=False)] = None,
    publish: Annotated[bool, typer.Option("--publish/--no-publish", help="also write <docs dir>/compare/<slug>.md, "
                                                                         ".html and index.md (default: print "
                                                                         "only)")] = False,
    fail_on_regression: Annotated[bool, typer.Option("--fail-on-regression", help="exit 1 when a row on both sides "
                                                                                  "went from supported (l0_covered, "
                                                                                  "checkpoint_direct) to anything "
                                                                                  "else")] = False,
    metric: Annotated[list[str] | None, typer.Option("--metric", help="print only the metric deltas whose "
                                                                      "stage/metric matches this glob (repeatable, "
                                                                      "e.g. 'bench/*'); the pages keep them all")
                      ] = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """What changed between two sides: rows gained and lost, status changes, metric deltas against their noise band."""
    with farm_errors("compare"):
        from edgefarm.flows.settings import Settings
        from edgefarm.pages.compare import build_comparison
        from edgefarm.pages.compare import publish as publish_pages
        from edgefarm.pages.docs import db_label
        from edgefarm.results.db import read_only_engine, redact
        from edgefarm.results.migrate import require_current
        from edgellm.errors import ConfigurationError

        if fmt not in FORMATS:
            raise ConfigurationError(f"unknown --format {fmt!r}; valid: {', '.join(FORMATS)}")
        a, b = _side_args(toolchain, against, runs, commits)
        settings = Settings.resolve(db=db, data_dir=data_dir, docs_dir=docs_dir, create=False)
        db_url = settings.existing_db_url()
        engine = read_only_engine(db_url)
        try:
            require_current(engine, redact(db_url))
            comparison = build_comparison(engine, a, b, data_dir=settings.data_dir)
        finally:
            engine.dispose()
        written = (publish_pages(comparison, settings.docs_dir, db_label=db_label(settings.db_url))
                   if publish else [])
        if metric:
            comparison = _only_metrics(comparison, metric)
    if fmt == "json":
        sys.stdout.write(json.dumps({**comparison.to_json(), "pages": [str(p) for p in written]}, indent=2) + "\n")
    else:
        _print(comparison)
        for p in written:
            out.print(f"wrote {p}", markup=False, highlight=False)
    if fail_on_regression and comparison.regressions:
        err.print(f"edgefarm compare: {len(comparison.regressions)} row(s) went from supported to something else",
                  markup=False)
        raise typer.Exit(1)


def _only_metrics(c: Any, patterns: list[str]) -> Any:
    """The comparison with only the metric deltas ``patterns`` match (``stage/metric`` globs); a pattern that
    matches none is bad input naming the metrics there are."""
    import dataclasses
    import fnmatch

    from edgellm.errors import ConfigurationError

    names = sorted({f"{d.stage}/{d.metric}" for d in c.deltas})
    unmatched = [p for p in patterns if not fnmatch.filter(names, p)]
    if unmatched:
        raise ConfigurationError(f"--metric {', '.join(map(repr, unmatched))} matches no metric delta; there are: "
                                 f"{', '.join(names) or '(none)'}")
    keep = [d for d in c.deltas if any(fnmatch.fnmatchcase(f"{d.stage}/{d.metric}", p) for p in patterns)]
    return dataclasses.replace(c, deltas=keep)


def _print(c: Any) -> None:
    from edgefarm.pages.compare import stage_text

    out.print(cell(c.summary()))  # the answer first
    out.print(cell(f"A: {c.a}"))
    out.print(cell(f"B: {c.b}"))
    if not (c.changed or c.gained or c.lost or c.deltas):
        return
    rows = Table(title=f"rows ({len(c.gained)} gained, {len(c.lost)} lost, {len(c.changed)} changed, {c.same} same)")
    for col in ("change", "row", "A", "B", "stages", "why (B)"):
        rows.add_column(col)
    for ch in c.changed:
        rows.add_row(cell("REGRESSION" if ch.regression else "status", "red" if ch.regression else ""),
                     cell(ch.row.text()), cell(ch.a.verdict, colour(ch.a.verdict)),
                     cell(ch.b.verdict, colour(ch.b.verdict)), cell(stage_text(ch.stages)),
                     cell(ch.b.why(ch.stages)))
    for row, side in c.gained:
        rows.add_row(cell("gained", "green"), cell(row.text()), cell("-"),
                     cell(side.verdict, colour(side.verdict)), cell(""), cell(side.why(side.reasons)))
    for row, side in c.lost:
        rows.add_row(cell("lost", "yellow"), cell(row.text()), cell(side.verdict, colour(side.verdict)),
                     cell("-"), cell(""), cell(""))
    if c.changed or c.gained or c.lost:  # never an empty bordered table
        print_table(rows)
    if c.deltas:
        from edgefarm.pages.compare import fmt_delta, fmt_num, fmt_rel

        t = Table(title=f"metric deltas ({len(c.deltas)}; B - A, band: side A's history)")
        for col in ("row", "metric", "A", "B", "B - A", "rel", "band", "noise"):
            t.add_column(col)
        for d in c.deltas:
            noise = "red" if d.noise == "outside noise" else "green" if d.noise == "within noise" else "dim"
            t.add_row(cell(d.row.text()), cell(f"{d.stage}/{d.metric}"),
                      *map(cell, (fmt_num(d.a), fmt_num(d.b), fmt_delta(d.delta), fmt_rel(d.relative), d.band.text)),
                      cell(d.noise if d.band.half_width is not None else "-", noise))
        print_table(t)
