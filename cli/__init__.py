"""The ``edgefarm`` command line: the farm's front door, every command group in this package.

Exit codes: 0 all passed, 1 some failed, 2 bad input (every problem listed), 3 infrastructure failure.
One module per group (devices, lists, db, toolchains; commands: nightly, run, query, show, docs, serve, gc;
bring-up; compare; runs), mounted here, with ``--version`` and shell completion; the packages they drive hold no
CLI code. Heavy imports (Prefect) happen inside the commands that need them.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

import edgefarm.cli.site_dir  # noqa: F401  (edgefarm --site-dir: applied before any registry is built)
from edgefarm.cli import commands, query, show
from edgefarm.cli.bisect import bisect
from edgefarm.cli.bringup import bring_up
from edgefarm.cli.compare import compare
from edgefarm.cli.db import app as db_app
from edgefarm.cli.devices import app as devices_app
from edgefarm.cli.lists import app as lists_app
from edgefarm.cli.runs import runs
from edgefarm.cli.toolchains import app as toolchains_app

app = typer.Typer(
    name="edgefarm",
    help="Build farm proving which LLMs run at which precision on which edge platform.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    pretty_exceptions_enable=False,
)


def version_text() -> str:
    """``edgefarm <farm version> (edgellm <library version>, Python x.y.z)``."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def of(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return f"edgefarm {of('edgellm-farm')} (Python {platform.python_version()})"


def _version(value: bool) -> None:
    if value:
        typer.echo(version_text())
        raise typer.Exit(0)


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", help="print the version and exit", is_eager=True,
                                                callback=_version)] = False,
          site_dir: Annotated[str | None, typer.Option(
              "--site-dir", help="a lab's own device_types/, lists/, matrices/, inventory/, catalog/ over the "
                                 "packaged ones (default: $EDGEFARM_SITE_DIR); give it first")] = None) -> None:
    """Build farm proving which LLMs run at which precision on which edge platform."""
    if site_dir is not None:
        from edgefarm.devices.site import checked
        from edgefarm.registries import current

        if checked(site_dir) != current().site_dir:
            raise typer.BadParameter(f"{site_dir!r} was not applied: give --site-dir first, before the command "
                                     f"(or set $EDGEFARM_SITE_DIR)", param_hint="--site-dir")


for command in (commands.nightly, commands.run, query.query, show.show, commands.docs, commands.serve, commands.gc):
    app.command()(command)
app.command(name="bring-up")(bring_up)
app.command(name="compare")(compare)
app.command(name="runs")(runs)
app.command(name="bisect")(bisect)


app.add_typer(devices_app, name="devices")
app.add_typer(lists_app, name="lists")
app.add_typer(db_app, name="db")
app.add_typer(toolchains_app, name="toolchains")


def main() -> None:
    sys.exit(app(standalone_mode=True))
