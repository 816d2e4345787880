"""``edgefarm query``: each row's support status (``results.support.SupportStatus``, the one vocabulary of the pages,
the terminal and Prefect) with its root-cause reason, error kind, metrics and logs, from the results database (and
the nightly's end table)."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from edgefarm.cli.common import DataDirOption, DbOption, check_name, farm_errors, out, print_table
from edgefarm.cli.listing import OutputOption, check_file_option, check_format, to_output
from edgefarm.cli.text import cell
from edgefarm.pages.escape import spreadsheet_cell
from edgefarm.results.support import SupportStatus

if TYPE_CHECKING:
    from edgellm.types import Precision

QUERY_FIELDS = ("model", "precision", "platform", "job_toolchain", "variant", "chosen_versions", "status", "reason",
                "error_kind", "failing_since_run", "toolchain", "toolchain_version", "route", "standin", "run_id",
                "run_kind", "run_started_at", "stages", "metrics", "logs", "root_cause_log")
# other spellings --status accepts: the pages' older word for implemented (export verified only)
# what people type for a status (issue 41: `--status pass` was refused); the canonical names are SupportStatus's
STATUS_ALIASES = {"export_verified": SupportStatus.IMPLEMENTED.value, "pass": SupportStatus.L0_COVERED.value,
                  "passed": SupportStatus.L0_COVERED.value, "covered": SupportStatus.L0_COVERED.value,
                  "fail": SupportStatus.FAILING.value, "failed": SupportStatus.FAILING.value,
                  "untested": SupportStatus.NEVER_TESTED.value, "n/a": SupportStatus.NOT_APPLICABLE.value,
                  "skip": SupportStatus.SKIPPED.value}
STATUS_COLOURS = {SupportStatus.L0_COVERED: "green", SupportStatus.CHECKPOINT_DIRECT: "green",
                  SupportStatus.IMPLEMENTED: "cyan", SupportStatus.FAILING: "red", SupportStatus.WAIVED: "magenta",
                  SupportStatus.NOT_APPLICABLE: "dim", SupportStatus.SKIPPED: "yellow",
                  SupportStatus.NEVER_TESTED: "dim"}
STATUS_HELP = " | ".join(s.value for s in SupportStatus) + (" (also pass = l0_covered, fail = failing, untested = "
                                                              "never_tested, export_verified = implemented)")


def parse_status(value: str) -> SupportStatus:
    """A --status someone gave: a SupportStatus value in any case, with '-' or '_' (``export-verified`` too), else
    a ConfigurationError naming it, a near match and the valid values."""
    norm = value.strip().lower().replace("-", "_").replace(" ", "_")
    norm = STATUS_ALIASES.get(norm, norm)
    valid = [s.value for s in SupportStatus]
    if norm not in valid:
        import difflib

        from edgellm.errors import ConfigurationError

        close = difflib.get_close_matches(norm, [*valid, *STATUS_ALIASES], n=3, cutoff=0.6)
        meant = dict.fromkeys(STATUS_ALIASES.get(c, c) for c in close)  # an alias and its status: said once
        hint = f" (did you mean {', '.join(map(repr, meant))}?)" if close else ""
        raise ConfigurationError(f"unknown --status {value!r}{hint}; valid statuses: {', '.join(valid)} "
                                 f"(also pass, fail, untested, export_verified; '-' or '_')")
    return SupportStatus(norm)


def parse_precision(value: str) -> Precision:
    """A --precision someone gave: a precision's name in any case, else a ConfigurationError naming it, a near match
    and the valid names. Parsed here once: what the query passes on is the ``Precision`` itself."""
    from edgellm.types import Precision

    name = check_name("precision", value.strip().lower(), [p.value for p in Precision])
    return Precision(name)


def colour(status: str) -> str:
    try:
        return STATUS_COLOURS[SupportStatus(status)]
    except ValueError:
        return "dim"


def log_id(sha256: str) -> str:
    """How the run pages cite a log, and what ``edgefarm show`` opens: ``log:<first 12 hex of its sha256>``."""
    return f"log:{sha256[:12]}"


def known_names(s: Any, what: str) -> set[str]:
    """The names a --model or --platform filter may take: the catalog's models or the known platforms (device
    types), and every one the database has rows of (a model only in the database is still a model)."""
    from edgefarm.results.queries import row_names

    if what == "model":
        from edgefarm.test_lists.catalog import Catalog

        names = set(Catalog.load().sources)
    else:
        from edgefarm.test_lists.platforms import known_platforms

        names = known_platforms()
    return names | row_names(s, "model" if what == "model" else "platform")


def check_filters(s: Any, model: str | None, platform: str | None) -> None:
    """Refuse a --model or --platform that names nothing this farm knows (exit 2, did you mean, the valid names)."""
    for what, value in (("model", model), ("platform", platform)):
        if value is not None:
            check_name(what, value, known_names(s, what))


def query_rows(db_url: str, *, model: str | None, precision: Precision | None, platform: str | None,
               status: SupportStatus | None, toolchain: str | None = None) -> list[dict[str, Any]]:
    from edgefarm.results.db import read_only_engine, reading, redact
    from edgefarm.results.migrate import require_current
    from edgefarm.results.queries import SUPPORT_REQUIRED, detail_key, latest_status, row_details, run_starts
    from edgefarm.results.support import supports_of

    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        with reading(engine) as s:
            check_filters(s, model, platform)
            rows = latest_status(s, model=model, precision=precision, platform=platform, toolchain=toolchain,
                                 required=SUPPORT_REQUIRED)
            runs = run_starts(s, {r.run_id for r in rows})
            support = supports_of(s, rows)  # as the pages decide it (pages/docs_layout.py)
            details = row_details(s, rows)
    finally:
        engine.dispose()
    rows_out = []
    for r, sup in zip(rows, support, strict=True):
        if status is not None and sup.status is not status:
            continue
        detail = details.get(detail_key(r))
        rows_out.append({
            "model": r.key.model, "precision": r.key.precision.value, "platform": r.key.platform,
            "job_toolchain": str(r.key.toolchain),  # a platform running two toolchains: one row each
            "variant": r.key.variant,
            "chosen_versions": r.chosen_versions,  # a run comparing toolchain versions: one row per version
            "status": sup.status.value, "reason": sup.reason,
            "error_kind": detail.error_kind if detail else None, "failing_since_run": sup.since_run,
            "toolchain": r.toolchain, "toolchain_version": r.toolchain_version, "route": r.route,
            "standin": r.standin, "run_id": r.run_id, "run_kind": runs[r.run_id].kind,
            "run_started_at": runs[r.run_id].started_at.isoformat(timespec="seconds"),
            "stages": {k.value: v.value for k, v in r.stages.items()},
            "metrics": [{"stage": st, "name": n, "value": v, "unit": u} for st, n, v, u in
                        (detail.metrics if detail else ())],
            "logs": [{"id": log_id(sha), "stage": st, "sha256": sha} for st, kind, sha in
                     (detail.artifacts if detail else ()) if kind == "log"],
        })
        rows_out[-1]["root_cause_log"] = root_cause_log(rows_out[-1])
    return rows_out


def root_cause_log(row: dict[str, Any]) -> str | None:
    """The log id (``log:<sha12>``, for ``edgefarm show``) of a failing row's first failed or errored stage in
    pipeline order (``stages`` is in that order), when that stage stored a log."""
    if row["status"] != SupportStatus.FAILING.value:
        return None
    failed = next((st for st, v in row["stages"].items() if v in ("fail", "error")), None)
    return next((g["id"] for g in row["logs"] if g["stage"] == failed), None)


def csv_row(r: dict[str, Any]) -> dict[str, Any]:
    """A query row as one CSV line: stages ``stage=status;...``, metrics ``stage/name=value unit;...``, logs
    ``stage=log:<sha12>;...``."""
    metrics = ";".join(f"{m['stage']}/{m['name']}={m['value']:.6g}{(' ' + m['unit']) if m['unit'] else ''}"
                       for m in r["metrics"])
    return {**r, "stages": ";".join(f"{k}={v}" for k, v in r["stages"].items()), "metrics": metrics,
            "logs": ";".join(f"{g['stage']}={g['id']}" for g in r["logs"])}


def query(
    model: Annotated[str | None, typer.Option("--model", help="only this model (a catalog or recorded name)")] = None,
    precision: Annotated[str | None, typer.Option("--precision")] = None,
    platform: Annotated[str | None, typer.Option("--platform", help="only this platform")] = None,
    toolchain: Annotated[str | None, typer.Option("--toolchain", help="only rows whose jobs ran with this "
                                                                      "toolchain")] = None,
    status: Annotated[str | None, typer.Option("--status", help=STATUS_HELP)] = None,
    fmt: Annotated[str, typer.Option("--format", help="table | json | csv")] = "table",
    show_regressions: Annotated[bool, typer.Option("--regressions", help="the metrics outside their baseline in "
                                                                         "each row's latest run instead")] = False,
    output: OutputOption = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
) -> None:
    """Which rows are supported? The latest support status of every (model, precision, platform, toolchain its jobs
    ran with), with its root-cause reason, from the results database."""
    with farm_errors("query"):
        from edgefarm.flows.settings import Settings
        from edgefarm.toolchains.base import parse as parse_toolchain

        fmt = check_format(fmt)
        check_file_option("--output", output)
        # each filter parsed once, here, before the database is opened: what goes on is typed
        wanted_precision = parse_precision(precision) if precision is not None else None
        wanted_status = parse_status(status) if status is not None else None
        if toolchain is not None:
            toolchain = parse_toolchain(toolchain)
        db_url = Settings.resolve(db=db, data_dir=data_dir, create=False).existing_db_url()
        if show_regressions:
            found = regression_rows(db_url, model=model, precision=wanted_precision, platform=platform,
                                    toolchain=toolchain)
            with to_output(output):
                _print_regressions(found, fmt, db_url)
            return
        rows = query_rows(db_url, model=model, precision=wanted_precision, platform=platform, status=wanted_status,
                          toolchain=toolchain)
    with to_output(output):
        _print_query(rows, fmt)


def _print_query(rows: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=QUERY_FIELDS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: spreadsheet_cell(v) for k, v in csv_row(r).items()})
        sys.stdout.write(buf.getvalue())
    else:
        _print_rows(rows)


def _print_rows(rows: list[dict[str, Any]]) -> None:
    from edgefarm.pages.docs_render import row_label, shown_toolchain

    t = Table(title=f"latest status ({len(rows)} rows)")
    compared = any(r["chosen_versions"] for r in rows)  # a column only when some run compared versions
    for col in ("model", "precision", "platform", *(["versions"] if compared else []), "status", "reason",
                "toolchain", "run", "failing stages"):
        t.add_column(col)
    for r in rows:
        bad = " ".join(f"{k}:{v}" for k, v in r["stages"].items() if v in ("fail", "error"))
        made_by = " ".join(x for x in (r["toolchain"], r["toolchain_version"],
                                       r["route"] and f"({r['route']} route)",
                                       "STAND-IN (never evidence)" if r["standin"] else None) if x)
        versions = [r["chosen_versions"] or "pinned"] if compared else []
        # as in the docs: a row of a toolchain other than the platform's preferred one names it
        label = row_label(r["model"], None, shown_toolchain(r["platform"], r["job_toolchain"]), r["variant"])
        t.add_row(*map(cell, (label, r["precision"], r["platform"], *versions)),
                  cell(r["status"], colour(r["status"])), *map(cell, (r["reason"] or "", made_by, r["run_id"], bad)))
    print_table(t)


REGRESSION_FIELDS = ("model", "precision", "platform", "job_toolchain", "stage", "test_id", "metric", "severity",
                     "value", "baseline", "spread", "change", "baseline_runs", "run_id", "previous_run_id")


def regression_rows(db_url: str, *, model: str | None, precision: Precision | None,
                    platform: str | None, toolchain: str | None = None) -> list[dict[str, Any]]:
    from edgefarm.results.db import read_only_engine, reading, redact
    from edgefarm.results.migrate import require_current
    from edgefarm.results.regressions import published_regressions

    engine = read_only_engine(db_url)
    try:
        require_current(engine, redact(db_url))
        with reading(engine) as s:
            check_filters(s, model, platform)
            flags = published_regressions(s, model=model, platform=platform, toolchain=toolchain)
    finally:
        engine.dispose()
    return [{k: (v.value if hasattr(v, "value") else v) for k, v in
             ((k, getattr(f, k)) for k in REGRESSION_FIELDS)}
            for f in flags if precision is None or f.precision is precision]


def nightly_run_counts(db_url: str) -> list[int]:
    """How many published nightly runs each row (model, precision, platform, job toolchain) has results in."""
    from edgefarm.results.db import read_only_engine
    from edgefarm.results.queries import nightly_run_counts as counts

    engine = read_only_engine(db_url)
    try:
        return counts(engine)
    finally:
        engine.dispose()


def empty_regressions_note(counts: Iterable[int]) -> str:
    """Why ``query --regressions`` found nothing: a metric is judged only against a baseline of earlier runs."""
    from edgefarm.results.regressions import MIN_BASELINE_RUNS

    counts = sorted(counts)
    have = ("no row has a published nightly run yet" if not counts else
            f"the rows have {counts[0]} published nightly run(s) each" if counts[0] == counts[-1] else
            f"the rows have {counts[0]} to {counts[-1]} published nightly runs each")
    short = sum(1 for n in counts if n <= MIN_BASELINE_RUNS)
    judged = ("nothing can be judged yet" if not counts else
              f"{short} of {len(counts)} row(s) cannot be judged yet" if short
              else "every row could be judged: none regressed")
    return (f"no regressions: a metric is compared with its row's baseline only once the row has at least "
            f"{MIN_BASELINE_RUNS} earlier published nightly runs where it passed (results.regressions."
            f"MIN_BASELINE_RUNS); {have}, so {judged}")


def _print_regressions(rows: list[dict[str, Any]], fmt: str, db_url: str) -> None:
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
    from edgefarm.pages.docs_render import row_label, shown_toolchain

    t = Table(title=f"regressions in the latest runs ({len(rows)})")
    for col in ("model", "precision", "platform", "metric", "severity", "value", "baseline (median)", "change",
                "runs"):
        t.add_column(col)
    for r in rows:
        severity = "red" if r["severity"] == "fail" else "yellow"
        label = row_label(r["model"], None, shown_toolchain(r["platform"], r["job_toolchain"]))
        t.add_row(*map(cell, (label, r["precision"], r["platform"], r["metric"])), cell(r["severity"], severity),
                  *map(cell, (f"{r['value']:.4g}", f"{r['baseline']:.4g}", f"{r['change']:.1%} worse",
                              f"{r['previous_run_id']} -> {r['run_id']}")))
    print_table(t)
    if not rows:
        out.print(cell(empty_regressions_note(nightly_run_counts(db_url))))


def print_matrix(db_url: str) -> None:
    """The nightly's end table: one line per model (and toolchain, where a platform runs several) x precision, each
    cell the row's support status (as the pages show it)."""
    from edgefarm.pages.docs_render import row_label, shown_toolchain

    rows = query_rows(db_url, model=None, precision=None, platform=None, status=None)
    platforms = sorted({r["platform"] for r in rows})
    t = Table(title="support matrix (latest evidence)")
    t.add_column("model")
    t.add_column("precision")
    for p in platforms:
        t.add_column(cell(p))

    def label(r: dict[str, Any]) -> str:
        return row_label(r["model"], r["chosen_versions"], shown_toolchain(r["platform"], r["job_toolchain"]),
                         r["variant"])

    cells = {(label(r), r["precision"], r["platform"]): r["status"] for r in rows}
    for model, precision in sorted({(label(r), r["precision"]) for r in rows}):
        vals = []
        for p in platforms:
            st = cells.get((model, precision, p), SupportStatus.NEVER_TESTED.value)
            vals.append(cell(st, colour(st)))
        t.add_row(cell(model), cell(precision), *vals)
    print_table(t)
