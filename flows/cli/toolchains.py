"""``edgefarm toolchains``: install and list the toolchain environments the farm drives (each toolchain's driver
says whether it has environments of its own, installs them and reads their versions back).

Exit codes: 0 ok (list: every environment healthy), 1 some environment unhealthy, 2 bad input (unknown toolchain
or version, a toolchain without environments), 3 infrastructure (the package registry unreachable, an install that
failed on the machine).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgellm.errors import ConfigurationError, ErrorKind
from flows.cli.commands import DataDirOption, farm_errors
from flows.cli.text import cell
from toolchains import base as toolchains
from toolchains.base import Environment, ToolchainDriver

app = typer.Typer(
    name="toolchains",
    help="Toolchain environments: isolated environments per version under <data dir>/toolchains.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _data_dir(data_dir: Path | None) -> Path:
    from flows.settings import Settings

    return Settings.resolve(data_dir=data_dir, create=False).data_dir


def _shown(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit - 20]!r}... ({len(text)} characters)"


def parse_spec(spec: str, data_dir: Path | None = None) -> tuple[ToolchainDriver, str]:
    """``NAME==VERSION`` -> (the driver, the version it checked); only toolchains whose version can be chosen,
    named exactly as registered (no case folding, no spaces), at a version their driver accepts."""
    name, sep, version = spec.partition("==")
    installable = toolchains.pinned_versions()
    if name not in installable:
        examples = ", ".join(f"{n}=={v}" for n, v in installable.items())
        raise ConfigurationError(f"unknown toolchain {_shown(name)} in {_shown(spec)}; installable: "
                                 f"{', '.join(installable) or '(none)'} (e.g. {examples})")
    if not sep or not version:
        raise ConfigurationError(f"give a pinned version: {name}=={installable[name]} (got {_shown(spec)})")
    found = toolchains.driver(name, data_dir)
    problem = found.version_problem(version)
    if problem is not None:
        raise ConfigurationError(problem)
    return found, version


def _table(envs: list[Environment]) -> Table:
    table = Table(title="toolchain environments")
    for column in ("toolchain", "version", "status", "path", "problems"):
        table.add_column(column, no_wrap=column in ("toolchain", "version", "status"))
    for e in envs:
        status = cell("healthy", "green") if e.healthy else cell("unhealthy", "red")
        table.add_row(cell(e.toolchain), cell(e.version or "-"), status, cell(e.path), cell("; ".join(e.problems)))
    return table


@app.command("install")
def install_command(
    spec: Annotated[str, typer.Argument(help="NAME==VERSION of a toolchain whose version can be chosen")],
    data_dir: DataDirOption = None,
) -> None:
    """Install a toolchain version into its own environment; reuse a healthy one."""
    with farm_errors("toolchains install"):
        found, version = parse_spec(spec, _data_dir(data_dir))
        Console(stderr=True).print(f"installing {found.name} {version} (a few minutes on first use)", markup=False)
        result = found.install_version(version)
    Console().print(_table([result]))


@app.command("list")
def list_command(
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of a table")] = False,
) -> None:
    """Every installed toolchain environment with its version read back and its health."""
    with farm_errors("toolchains list"):
        root = _data_dir(data_dir)
        envs = [e for name in toolchains.names() for e in toolchains.driver(name, root).environments()]
    if as_json:
        Console().print_json(json.dumps([e.to_dict() for e in envs]))
    else:
        Console().print(_table(envs) if envs else cell(f"no toolchain environments under {root / 'toolchains'}"))
    if any(not e.healthy for e in envs):
        raise typer.Exit(ErrorKind.TEST_FAILURE.exit_code)
