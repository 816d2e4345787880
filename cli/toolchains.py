"""``edgefarm toolchains``: install and list the toolchain environments the farm drives (each toolchain's driver
says whether it has environments of its own, installs them and reads their versions back), and mirror a version's
wheels into the artifact store for hosts without a package registry (``toolchains.mirror``).

Exit codes: 0 ok (list: every environment healthy), 1 some environment unhealthy, 2 bad input (unknown toolchain
or version, a toolchain without environments, a wheelhouse that is not a directory or lacks a wheel, a version not
mirrored where only the mirror may be used, a damaged mirror), 3 infrastructure (the package registry unreachable,
an install that failed on the machine).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from edgefarm.cli.common import DataDirOption, farm_errors, out
from edgefarm.cli.listing import FormatOption, OutputOption, check_file_option, check_format, emit, to_output
from edgefarm.cli.text import cell
from edgefarm.toolchains import base as toolchains
from edgefarm.toolchains.base import Environment, ToolchainDriver
from edgellm.errors import ConfigurationError, ErrorKind

if TYPE_CHECKING:
    from edgefarm.flows.settings import Settings

app = typer.Typer(
    name="toolchains",
    help="Toolchain environments: isolated environments per version under <data dir>/toolchains.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _settings(data_dir: Path | None, *, create: bool = False) -> Settings:
    from edgefarm.flows.settings import Settings

    return Settings.resolve(data_dir=data_dir, create=create)


def _data_dir(data_dir: Path | None) -> Path:
    return _settings(data_dir).data_dir


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
    """Install a toolchain version into its own environment; reuse a healthy one. Its wheels come from the artifact
    store's mirror of it when there is one, else the package registry ($EDGEFARM_TOOLCHAIN_INDEX: auto, mirror,
    registry)."""
    with farm_errors("toolchains install"):
        settings = _settings(data_dir)
        found, version = parse_spec(spec, settings.data_dir)
        Console(stderr=True).print(f"installing {found.name} {version} (a few minutes on first use)", markup=False)
        result = found.environment.install_version(version, settings.toolchain_wheels())
    Console().print(_table([result]))


@app.command("mirror")
def mirror_command(
    spec: Annotated[str, typer.Argument(help="NAME==VERSION of a toolchain whose version can be chosen")],
    wheelhouse: Annotated[Path | None, typer.Option(
        "--from", help="a local directory of wheels to take them from (no registry is asked); default: the "
                       "package registry")] = None,
    data_dir: DataDirOption = None,
) -> None:
    """Store a toolchain version's wheels (its installer's requirements and their dependencies, for this host's
    Python and platform) in the artifact store, for installs on hosts without a package registry."""
    from edgefarm.toolchains import mirror

    with farm_errors("toolchains mirror"):
        settings = _settings(data_dir, create=True)
        found, version = parse_spec(spec, settings.data_dir)
        requirements = found.environment.requirements(version)
        source = settings.toolchain_wheels()
        Console(stderr=True).print(f"mirroring {found.name} {version} ({' '.join(requirements)}) from "
                                   f"{wheelhouse or 'the package registry'} into {source.shown}", markup=False)
        store = source.open_store()
        try:
            made = mirror.mirror(store, found.name, version, requirements,
                                 wheelhouse=None if wheelhouse is None else wheelhouse.resolve())
        finally:
            store.close()
    total = sum(w.bytes for w in made.wheels)
    out = Console()
    out.print(f"mirrored {found.name} {version} for {made.python}-{made.platform} into {source.shown}: "
              f"{len(made.wheels)} wheel(s), {total / 1e6:.1f} MB, named {made.name}", markup=False)
    for wheel in made.wheels:
        out.print(f"  {wheel.name}  sha256:{wheel.sha256}", markup=False, soft_wrap=True)


@app.command("list")
def list_command(
    data_dir: DataDirOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="the same as --format json (deprecated)")] = False,
    fmt: FormatOption = "table",
    output: OutputOption = None,
) -> None:
    """Every installed toolchain environment with its version read back and its health."""
    with farm_errors("toolchains list"):
        fmt = "json" if as_json else check_format(fmt)
        check_file_option("--output", output)
        root = _data_dir(data_dir)
        envs = [e for name in toolchains.names() for e in toolchains.driver(name, root).environment.environments()]
        with to_output(output):
            emit([e.to_dict() for e in envs], ("toolchain", "version", "healthy", "path", "problems"), fmt,
                 lambda _rows: out.print(_table(envs) if envs else
                                         cell(f"no toolchain environments under {root / 'toolchains'}")))
    if any(not e.healthy for e in envs):
        raise typer.Exit(ErrorKind.TEST_FAILURE.exit_code)
