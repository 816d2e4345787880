"""``edgefarm devices``: list the inventory and check every device's health.

Exit codes: 0 all healthy, 1 some device unhealthy, 2 broken inventory (every problem listed).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from devices.health import HealthReport, check_inventory
from devices.inventory import INVENTORY_ENV, Inventory, load_inventory
from edgellm.errors import ConfigurationError

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

EXIT_UNHEALTHY, EXIT_BAD_INPUT = 1, 2


def _load(directory: Path | None) -> Inventory:
    try:
        return load_inventory(directory)
    except ConfigurationError as err:
        errors = Console(stderr=True, soft_wrap=True, highlight=False)
        lines = str(err).splitlines()
        errors.print(f"error: {lines[0]}", markup=False)
        for line in lines[1:]:
            errors.print(f"  {line}", markup=False)
        raise typer.Exit(EXIT_BAD_INPUT) from None


@app.command("list")
def list_devices(inventory: InventoryDir = None) -> None:
    """Every device: id, type (platform), transport, address, labels, max parallel jobs."""
    devices = _load(inventory)
    table = Table(title=f"{len(devices)} device(s) in {devices.directory}")
    for column in ("id", "type", "transport", "host:port", "labels", "max jobs"):
        table.add_column(column, no_wrap=column in ("id", "host:port"))
    for d in devices:
        table.add_row(d.id, str(d.platform), str(d.transport), d.address, ", ".join(d.labels), str(d.max_jobs))
    Console().print(table)


def _health_table(reports: list[HealthReport]) -> Table:
    table = Table(title="device health")
    for column in ("id", "type", "address", "status", "python", "edgellm", "free GiB", "problems"):
        table.add_column(column, no_wrap=column in ("id", "address", "status"))
    for r in reports:
        status = "[green]healthy[/]" if r.healthy else ("[red]unhealthy[/]" if r.reachable else "[red]unreachable[/]")
        free = f"{r.disk_free_gb:.1f}" if r.disk_free_gb is not None else "-"
        table.add_row(
            r.device_id,
            r.platform,
            r.address,
            status,
            r.python_version or "-",
            r.edgellm_version or "-",
            free,
            "; ".join(r.problems),
        )
    return table


@app.command("check")
def check(
    inventory: InventoryDir = None,
    min_free_gb: Annotated[float, typer.Option(help="least free space in a device's work dir")] = 1.0,
    timeout: Annotated[float, typer.Option(help="seconds per probe command")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the reports as JSON instead of a table")] = False,
) -> None:
    """Probe every device (in parallel): reachable, disk free, Python and edgellm versions."""
    devices = _load(inventory)
    reports = check_inventory(devices, min_free_gb=min_free_gb, timeout=timeout)
    if as_json:
        typer.echo(json.dumps([r.to_dict() for r in reports], indent=2))
    else:
        Console().print(_health_table(reports))
    if not all(r.healthy for r in reports):
        raise typer.Exit(EXIT_UNHEALTHY)
