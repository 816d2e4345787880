"""What every ``edgefarm`` command shares: the consoles, the common options, the mapping of error kinds to exit
codes, and Prefect's settings (set before Prefect is imported).

Exit codes: 0 all passed, 1 some failed, 2 bad input (every problem listed), 3 infrastructure failure, 5 nothing ran.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from edgellm.errors import EdgeLLMError, ErrorKind
from flows.cli.text import visible

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[str | None, typer.Option("--db", help="results database URL (default: $EDGEFARM_DB_URL, "
                                                           "else <data dir>/edgefarm.db)")]
DataDirOption = Annotated[Path | None, typer.Option("--data-dir", help="farm state (default: $EDGEFARM_DATA_DIR, "
                                                                       "else ./.data)", file_okay=False)]
InventoryOption = Annotated[Path | None, typer.Option(
    "--inventory", help="inventory directory (default: $EDGEFARM_INVENTORY, else devices/inventory)", file_okay=False)]


@contextmanager
def farm_errors(command: str) -> Iterator[None]:
    """Map the library's error kinds to exit codes, one readable block, no traceback."""
    from pydantic import ValidationError

    try:
        yield
    except EdgeLLMError as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        err.print(f"edgefarm {command}: error ({exc.kind.value}): {visible(lines[0])}", markup=False)
        for line in lines[1:]:
            err.print(f"  {visible(line)}", markup=False)
        raise typer.Exit(exc.kind.exit_code) from None
    except ValidationError as exc:  # a flow parameter of the wrong type
        err.print(f"edgefarm {command}: error (configuration): {exc}", markup=False)
        raise typer.Exit(ErrorKind.CONFIGURATION.exit_code) from None
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as exc:  # database, migration, disk, memory...: its kind decides the exit code
        from results.errors import classify

        known = classify(exc)
        err.print(f"edgefarm {command}: error ({known.kind.value}): {known}", markup=False)
        raise typer.Exit(known.kind.exit_code) from None


def _prefect(data_dir: Path) -> None:
    from flows.prefect_env import configure_prefect

    configure_prefect(data_dir)
