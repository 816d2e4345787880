"""``edgefarm toolchains``: install and list the vendor toolchain environments the farm drives.

Exit codes: 0 ok (list: every environment healthy), 1 some environment unhealthy, 2 bad input (unknown toolchain
or version), 3 infrastructure (the package registry unreachable, an install that failed on the machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgellm.errors import ConfigurationError
from flows.cli.commands import DataDirOption, farm_errors
from toolchains.tensorrt_edgellm import TOOLCHAIN
from toolchains.tensorrt_edgellm.env import EnvHealth, check_version, install, list_envs, toolchains_root

app = typer.Typer(
    name="toolchains",
    help="Vendor toolchains (tensorrt-edgellm): isolated environments per version under <data dir>/toolchains.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
INSTALLABLE = (TOOLCHAIN,)


def _root(data_dir: Path | None) -> Path:
    from flows.settings import Settings

    return toolchains_root(Settings.resolve(data_dir=data_dir, create=False).data_dir).resolve()


def parse_spec(spec: str) -> tuple[str, str]:
    """``tensorrt-edgellm==0.11.0`` -> (name, version)."""
    name, sep, version = spec.partition("==")
    if name not in INSTALLABLE:
        raise ConfigurationError(f"unknown toolchain {name!r} in {spec!r}; installable: {', '.join(INSTALLABLE)}")
    if not sep or not version:
        raise ConfigurationError(f"give a pinned version: {name}==X.Y.Z (got {spec!r})")
    return name, check_version(version)


def _table(envs: list[EnvHealth]) -> Table:
    table = Table(title="toolchain environments")
    for column in ("toolchain", "version", "status", "path", "problems"):
        table.add_column(column, no_wrap=column in ("toolchain", "version", "status"))
    for e in envs:
        status = "[green]healthy[/]" if e.healthy else "[red]unhealthy[/]"
        table.add_row(TOOLCHAIN, e.version or "-", status, str(e.path), "; ".join(e.problems))
    return table


@app.command("install")
def install_command(
    spec: Annotated[str, typer.Argument(help="NAME==VERSION, e.g. tensorrt-edgellm==0.11.0")],
    data_dir: DataDirOption = None,
) -> None:
    """Install a toolchain version into its own environment (CPU torch, no torchvision); reuse a healthy one."""
    with farm_errors("toolchains install"):
        _, version = parse_spec(spec)
        root = _root(data_dir)
        Console(stderr=True).print(f"installing {TOOLCHAIN} {version} into {root} (a few minutes on first use)")
        result = install(root, version, log=None)
    Console().print(_table([result]))


@app.command("list")
def list_command(
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Every installed toolchain environment with its version read back and its health."""
    with farm_errors("toolchains list"):
        root = _root(data_dir)
    envs = list_envs(root)
    if as_json:
        Console().print_json(json.dumps([e.to_dict() for e in envs]))
    else:
        Console().print(_table(envs) if envs else f"no toolchain environments under {root}")
    if any(not e.healthy for e in envs):
        raise typer.Exit(1)
