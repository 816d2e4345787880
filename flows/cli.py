"""The ``edgefarm`` command line: the farm's front door.

Exit codes: 0 all passed, 1 some failed, 2 bad input (every problem listed), 3 infrastructure failure.
Command groups live next to what they drive (devices/cli.py, test_lists/cli.py, results/cli.py) and are
mounted here; heavy imports (Prefect) happen inside the commands that need them.
"""

from __future__ import annotations

import sys

import typer

from devices.cli import app as devices_app
from flows import commands
from flows.toolchains_cli import app as toolchains_app
from results.cli import app as db_app
from test_lists.cli import app as lists_app

app = typer.Typer(
    name="edgefarm",
    help="Build farm proving which LLMs run at which precision on which edge platform.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
for command in (commands.nightly, commands.run, commands.query, commands.docs, commands.serve, commands.gc):
    app.command()(command)
app.add_typer(devices_app, name="devices")
app.add_typer(lists_app, name="lists")
app.add_typer(db_app, name="db")
app.add_typer(toolchains_app, name="toolchains")


def main() -> None:
    sys.exit(app(standalone_mode=True))


if __name__ == "__main__":
    main()
