"""What every ``edgefarm`` command shares: the consoles, the common options, the mapping of error kinds to exit
codes, and Prefect's settings (set before Prefect is imported).

Exit codes: 0 all passed, 1 some failed, 2 bad input (every problem listed), 3 infrastructure failure, 5 nothing ran.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from typer.core import TyperOption

from edgefarm.cli.text import visible
from edgellm.errors import EdgeLLMError, ErrorKind
from edgellm.redact import redact


def _plain_flags() -> None:
    """Help screens list a flag as a flag: typer (0.2x) gives every option a type column (``<str>``) and, since it
    asks no option whether it is a flag, a boolean flag ``<bool>`` (``--help <bool>``, ``--dry-run <bool>``), which
    reads as if the flag took a value. A flag (``--x``, ``--x/--no-x``, not a counter) shows no type; one place, for
    every command of every group."""
    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: typer.Context) -> str | None:
        if self.is_flag and not self.count:
            return None
        return shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_plain_flags()

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[str | None, typer.Option("--db", help="results database URL (default: $EDGEFARM_DB_URL, "
                                                           "else <data dir>/edgefarm.db)")]
DataDirOption = Annotated[Path | None, typer.Option("--data-dir", help="farm state (default: $EDGEFARM_DATA_DIR, "
                                                                       "else ./.data)", file_okay=False)]
InventoryOption = Annotated[Path | None, typer.Option(
    "--inventory", help="inventory directory (default: $EDGEFARM_INVENTORY, else devices/inventory)", file_okay=False)]


def print_table(t: Table) -> None:
    """On a terminal, fitted to it; elsewhere (a pipe, a file, a CI log) at its natural width, one line per row,
    nothing cut (``not_applicab...``), so the output can be grepped."""
    if out.is_terminal:
        out.print(t)
        return
    from rich.measure import Measurement

    width = max(Measurement.get(out, out.options.update_width(100_000), t).maximum, 40)
    Console(file=out.file, width=width, highlight=False, soft_wrap=True).print(t)


def check_name(what: str, value: str, valid: Iterable[str]) -> str:
    """``value`` when it is one of ``valid``, else a ConfigurationError (exit 2) naming it, a near match (did you
    mean) and every valid name: a filter that matches nothing by a typo is refused, never an empty answer."""
    from edgellm.errors import ConfigurationError

    names = sorted(set(valid))
    if value in names:
        return value
    close = difflib.get_close_matches(value, names, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise ConfigurationError(f"unknown {what} {value!r}{hint}; valid {what}s: {', '.join(names) or '(none)'}")


INTERRUPTED = 130  # a shell's code for a command ended by SIGINT (128 + 2)


def kind_label(kind: ErrorKind) -> str:
    """An error kind as a person reads it: a typo or a bad value is "bad input" (exit 2), whatever it was about."""
    return "bad input" if kind is ErrorKind.CONFIGURATION else kind.value.replace("_", " ")


@contextmanager
def farm_errors(command: str) -> Iterator[None]:
    """Map the library's error kinds to exit codes, one readable block, no traceback."""
    from pydantic import ValidationError

    try:
        yield
    except EdgeLLMError as exc:
        lines = redact(exc).splitlines() or [type(exc).__name__]  # a URL's secret never shows, however it came
        err.print(f"edgefarm {command}: error ({kind_label(exc.kind)}): {visible(lines[0])}", markup=False)
        for line in lines[1:]:
            err.print(f"  {visible(line)}", markup=False)
        raise typer.Exit(exc.kind.exit_code) from None
    except ValidationError as exc:  # a flow parameter of the wrong type
        err.print(f"edgefarm {command}: error ({kind_label(ErrorKind.CONFIGURATION)}): {exc}", markup=False)
        raise typer.Exit(ErrorKind.CONFIGURATION.exit_code) from None
    except KeyboardInterrupt:  # said in the farm's words, not only Prefect's "Crash detected!"
        err.print(f"edgefarm {command}: interrupted (Ctrl-C). A run in progress ends unpublished: its partial results "
                  f"are never evidence (`edgefarm runs` lists it). Run the command again: stages whose inputs did not "
                  f"change are reused.", markup=False)
        raise typer.Exit(INTERRUPTED) from None
    except (typer.Exit, typer.Abort):
        raise
    except Exception as exc:  # database, migration, disk, memory...: its kind decides the exit code
        from edgefarm.results.errors import classify

        known = classify(exc)
        err.print(f"edgefarm {command}: error ({kind_label(known.kind)}): {redact(known)}", markup=False)
        raise typer.Exit(known.kind.exit_code) from None


def configure_prefect(data_dir: Path, *, create: bool = True) -> None:
    """Prefect's settings for a command that runs a flow (``flows.prefect_env``), before Prefect is imported."""
    from edgefarm.flows import prefect_env

    prefect_env.configure_prefect(data_dir, create=create)
