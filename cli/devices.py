"""``edgefarm devices``: list the inventory and check every device's health.

Exit codes: 0 all healthy, 1 some device unhealthy, 2 broken inventory or database URL (every problem listed),
3 the results database unreachable (``--db``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgefarm.cli.listing import FormatOption, OutputOption, check_file_option, check_format, emit, to_output
from edgefarm.cli.text import cell, visible
from edgefarm.devices.health import HealthReport
from edgefarm.devices.inventory import INVENTORY_ENV, Inventory, load_inventory
from edgefarm.flows.settings import Settings
from edgefarm.registries import current
from edgefarm.toolchains.health import check_inventory
from edgellm.errors import ConfigurationError, EdgeLLMError, ErrorKind, InfrastructureError

app = typer.Typer(
    name="devices",
    help="Devices of the farm: the inventory and their health.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

InventoryDir = Annotated[
    Path | None,
    typer.Option(
        "--inventory",
        help=f"inventory directory (one YAML file per device); default ${INVENTORY_ENV} or devices/inventory/",
        file_okay=False,
    ),
]

EXIT_UNHEALTHY = ErrorKind.TEST_FAILURE.exit_code  # some device failed its health check


def _fail(err: EdgeLLMError) -> typer.Exit:
    errors = Console(stderr=True, soft_wrap=True, highlight=False)
    lines = str(err).splitlines()
    errors.print(f"error: {visible(lines[0])}", markup=False)
    for line in lines[1:]:
        errors.print(f"  {visible(line)}", markup=False)
    return typer.Exit(err.kind.exit_code)


def _load(inventory: Path | None, db: str | None = None) -> tuple[Inventory, Settings]:
    try:
        settings = Settings.resolve(db=db, inventory=inventory, create=False)
        return load_inventory(settings.inventory_dir, data_dir=settings.data_dir,
                              registries=settings.registries()), settings
    except ConfigurationError as err:
        raise _fail(err) from None


def store_reports(db_url: str, reports: list[HealthReport]) -> list[int]:
    """Record each report in the results database (``device_health``); the schema must be at head."""
    from edgefarm.results import quarantine
    from edgefarm.results.db import database_errors, has_table, redact
    from edgefarm.results.recorder import Recorder

    recorder = Recorder(db_url)
    errors = database_errors(
        unreachable=lambda why: InfrastructureError(f"cannot write to database {redact(db_url)!r}: {why}"),
        refused=lambda why: ConfigurationError(f"database {redact(db_url)!r} refused the health record: {why}"))
    try:
        with errors:
            if not has_table(recorder.engine, "device_health"):
                raise ConfigurationError(
                    f"database {redact(db_url)!r} has no device_health table; run: edgefarm db upgrade --db URL"
                )
            ids = []
            for r in reports:
                ids.append(recorder.record_health(
                    r.device_id,
                    reachable=r.reachable,
                    disk_free_bytes=r.disk_free_bytes,
                    python_version=r.python_version,
                    edgellm_version=r.edgellm_version,
                    checked_at=r.checked_at,
                    details={k: v for k, v in r.to_dict().items() if k not in _STORED_AS_COLUMNS},
                ))
                if r.healthy:  # a passing health check ends a quarantine (results/quarantine.py)
                    quarantine.release(recorder.engine, [r.device_id], ids[-1])
            return ids
    finally:
        recorder.engine.dispose()


_STORED_AS_COLUMNS = {"device_id", "reachable", "disk_free_bytes", "python_version", "edgellm_version", "checked_at"}


def quarantined(db_url: str, *, given: bool) -> dict[str, str] | None:
    """Device id -> why it is quarantined, from the results database (None when there is none to read and the
    URL was not ``given`` by the user)."""
    from edgefarm.results import quarantine
    from edgefarm.results.db import read_only_engine
    from edgefarm.results.migrate import require_current

    try:
        engine = read_only_engine(db_url)
        try:
            require_current(engine)
            return {d: f"since {q.since:%Y-%m-%d %H:%M} UTC: {q.reason}"
                    for d, q in quarantine.active(engine).items()}
        finally:
            engine.dispose()
    except EdgeLLMError:
        if given:
            raise
        return None  # the default database is absent or unreadable: listing the inventory still works


@app.command("list")
def list_devices(
    inventory: InventoryDir = None,
    db: Annotated[str | None, typer.Option("--db", help="results database that holds quarantines (default: "
                                                         "$EDGEFARM_DB_URL, else <data dir>/edgefarm.db)")] = None,
    fmt: FormatOption = "table",
    output: OutputOption = None,
) -> None:
    """Every device: id, type (platform), transport, address, labels, max parallel jobs, and whether (and why)
    it is quarantined."""
    try:
        fmt = check_format(fmt)
        check_file_option("--output", output)
    except EdgeLLMError as err:
        raise _fail(err) from None
    devices, settings = _load(inventory, db)
    try:
        held = quarantined(settings.db_url, given=db is not None)
    except EdgeLLMError as err:
        raise _fail(err) from None
    rows = [{"id": d.id, "type": str(d.platform), "transport": str(d.transport), "address": d.address,
             "labels": list(d.labels), "max_jobs": d.max_jobs,
             "quarantine": "unknown (no results database)" if held is None else held.get(d.id, "no")}
            for d in devices]

    def table_of(listed: object) -> None:
        table = Table(title=cell(f"{len(devices)} device(s) in {devices.directory}"))
        for column in ("id", "type", "transport", "host:port", "labels", "max jobs", "quarantine"):
            table.add_column(column, no_wrap=column in ("id", "host:port"))
        for r in rows:
            table.add_row(*map(cell, (r["id"], r["type"], r["transport"], r["address"], ", ".join(r["labels"]),
                                      r["max_jobs"], r["quarantine"])))
        Console(file=sys.stdout, soft_wrap=True).print(table)

    with to_output(output):
        emit(rows, ("id", "type", "transport", "address", "labels", "max_jobs", "quarantine"), fmt, table_of)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f}"


def _health_table(reports: list[HealthReport]) -> Table:
    """One row per device; every value a device reported is plain text (a hostile device prints no markup)."""
    table = Table(title="device health")
    for column in ("id", "type", "address", "status", "python", "platform", "power", "toolchains", "cache GiB",
                   "free GiB", "problems / notes"):
        table.add_column(column, no_wrap=column in ("id", "address", "status"))
    for r in reports:
        status = cell("healthy", "green") if r.healthy else cell("unhealthy" if r.reachable else "unreachable", "red")
        platform = ", ".join(p for p in (r.l4t and f"L4T {r.l4t}", r.jetpack and f"JetPack {r.jetpack}",
                                         r.cuda and f"CUDA {r.cuda}", r.gpu_driver and f"driver {r.gpu_driver}") if p)
        power = ", ".join(p for p in (r.power_mode, {True: "clocks locked", False: "clocks unlocked"}.get(
            r.clocks_locked), r.temp_max_c is not None and f"{r.temp_max_c:.0f} C") if p)
        chains = "; ".join(f"{t.name}{f' [{t.build}]' if t.build else ''} {t.version or '?'} "
                           f"{'ok' if t.ok else 'BROKEN'}" for t in r.toolchains)
        cache = (f"{_gib(r.cache_bytes)} of {_gib(r.cache_max_bytes)} ({r.cache_entries} entries, "
                 f"{r.cache_in_use} in use)" if r.cache_bytes is not None else "-")
        free = f"{r.disk_free_gb:.1f}" if r.disk_free_gb is not None else "-"
        said = "; ".join([*r.problems, *(f"note: {n}" for n in r.notes)])
        table.add_row(cell(r.device_id), cell(r.platform), cell(r.address), status,
                      *map(cell, (r.python_version or "-", platform or "-", power or "-", chains or "-", cache, free,
                                  said)))
    return table


@app.command("check")
def check(
    inventory: InventoryDir = None,
    min_free_gb: Annotated[float, typer.Option(help="least free space in a device's work dir")] = 1.0,
    timeout: Annotated[float, typer.Option(help="seconds per probe command")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the reports as JSON instead of a table")] = False,
    db: Annotated[str | None, typer.Option("--db", help="also record the reports in this results database")] = None,
) -> None:
    """Probe every device (in parallel) with the farm's agent: reachable, Python, L4T/JetPack, CUDA and driver,
    power mode and clocks, each toolchain's files and version (each build), the cache's use against its bound,
    free disk. A problem makes a device unhealthy; a passing check (with --db) releases its quarantine."""
    devices, _ = _load(inventory)
    if db is not None:
        from edgefarm.results.db import parse_url

        try:
            parse_url(db)  # a bad URL fails before any device is touched
        except ConfigurationError as err:
            raise _fail(err) from None
    reports = check_inventory(devices, current().device_types, min_free_gb=min_free_gb, timeout=timeout)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        Console().print(_health_table(reports))
    if db is not None:
        try:
            store_reports(db, reports)
        except EdgeLLMError as err:
            raise _fail(err) from None
    if not all(r.healthy for r in reports):
        raise typer.Exit(EXIT_UNHEALTHY)


@app.command("types")
def device_types(
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Every device type: SM, memory (and what is usable after the OS's share), bandwidth, toolchains, and the file
    it came from (packaged, or the site directory: $EDGEFARM_SITE_DIR / --site-dir)."""
    from edgefarm.devices.types import DEVICE_TYPES_DIR

    registries = current()
    site = registries.site_dir
    files = registries.files("device_types", DEVICE_TYPES_DIR)
    rows = [{"name": t.name, "sm": t.sm, "memory_gb": t.memory_gb, "usable_memory_gb": t.usable_memory_gb,
             "memory_bandwidth_gbps": t.memory_bandwidth_gbps, "toolchains": list(t.toolchains),
             "origin": registries.origin(files[t.name]), "file": str(files[t.name])}
            for t in registries.device_types.values()]
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    table = Table(title=cell(f"{len(rows)} device type(s)" + (f"; site directory {site}" if site else "")))
    for column in ("name", "SM", "memory GB", "usable GB", "bandwidth GB/s", "toolchains", "from"):
        table.add_column(column, no_wrap=column == "name")
    for r in rows:
        table.add_row(*map(cell, (r["name"], r["sm"] or "CPU", f"{r['memory_gb']:g}", f"{r['usable_memory_gb']:g}",
                                  "-" if r["memory_bandwidth_gbps"] is None else f"{r['memory_bandwidth_gbps']:g}",
                                  ", ".join(r["toolchains"]), f"{r['origin']}: {r['file']}")))
    Console(soft_wrap=True).print(table)
