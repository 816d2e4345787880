"""``edgefarm bring-up CHECKPOINT [--platforms P,...] [--layers N] [--report DIR] [--name NAME]``: a checkpoint up
the add-model ladder (``flows.bringup``), one line per rung, the report's path last.

Exit 0 when every rung passed, 1 when one failed (the report says which and why), 2 for bad input (before any rung),
3 for an infrastructure failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from edgefarm.cli.common import DataDirOption, DbOption, InventoryOption, configure_prefect, farm_errors, out
from edgefarm.cli.running import JsonOption, announce_flow_run, temporary_server
from edgefarm.cli.text import cell

STATUS_STYLE = {"pass": "green", "fail": "red", "error": "red", "not_applicable": "yellow", "skipped": "dim"}


def bring_up(
    checkpoint: Annotated[str, typer.Argument(help="checkpoint directory, or a catalog model's name")],
    platforms: Annotated[str | None, typer.Option(
        "--platforms", help="comma-separated platforms (default: those of the inventory's devices); one without a "
                            "device is checked as far as the export")] = None,
    layers: Annotated[int, typer.Option("--layers", help="decoder layers kept by the few-layer test")] = 1,
    report: Annotated[Path | None, typer.Option("--report", help="report directory (default: <data dir>/bringup/"
                                                                 "<model>)", file_okay=False)] = None,
    name: Annotated[str | None, typer.Option("--name", help="the model's name in results (default: the catalog's, "
                                                            "else bringup-<directory name>)")] = None,
    db: DbOption = None,
    data_dir: DataDirOption = None,
    inventory: InventoryOption = None,
    json_out: JsonOption = False,
) -> None:
    """Bring a checkpoint up the add-model ladder: inventory, closest family, toolchain registries, weight
    reconciliation, provider reference, few-layer test, then export -> build -> infer -> accuracy -> bench."""
    with farm_errors("bring-up"):
        from edgefarm.flows.settings import Settings

        settings = Settings.resolve(db=db, data_dir=data_dir, inventory=inventory)
        configure_prefect(settings.data_dir)  # before flows.bringup imports Prefect: its console says warnings only
        wanted = [p.strip() for p in platforms.split(",") if p.strip()] if platforms is not None else None
        from edgefarm.flows.bringup import bring_up as flow
        from edgefarm.flows.bringup import resolve
        from edgefarm.flows.run_state import flow_summary

        req = resolve(checkpoint, wanted, layers, str(report) if report else None, name, settings)  # bad input: 2
        from edgefarm.results.db import for_parameters

        with temporary_server(settings.data_dir):
            result = flow_summary(announce_flow_run(flow)(
                checkpoint=str(req.checkpoint) if req.source.kind == "path" else req.source.name,
                platforms=list(req.platforms), layers=layers, report_dir=str(req.report_dir), name=name,
                db_url=for_parameters(settings.db_url), data_dir=str(settings.data_dir),
                inventory=str(settings.inventory_dir), trigger="cli", return_state=True))
    if json_out:
        out.print_json(json.dumps(result, default=str))
    else:
        _print(result)
    raise typer.Exit(result["exit_code"])


def _print(result: dict[str, object]) -> None:
    table = Table(title=Text(f"bring-up of {result['model']}"), show_lines=False)
    for col in ("#", "rung", "status", "s", "reason"):
        table.add_column(col)
    rungs = result["rungs"]
    assert isinstance(rungs, list)
    for i, rung in enumerate(rungs, start=1):
        table.add_row(str(i), cell(rung["title"]), cell(rung["status"], STATUS_STYLE.get(rung["status"], "")),
                      f"{rung['duration_s']:.1f}", cell(rung["reason"] or ""))
    out.print(table)
    verdict = Text("passed", "green") if result["exit_code"] == 0 else Text("failed", "red")
    out.print(Text.assemble("result: ", verdict, "; report: ", cell(f"{result['report_dir']}/report.md"),
                            "; run ", cell(result["run_id"])))
