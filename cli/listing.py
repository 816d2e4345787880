"""What every listing command shares (issue 41): ``--format table|json|csv`` and ``--output FILE``, one spelling,
one check. JSON is the rows as they are; CSV one line per row with nested values joined (``a=1;b=2``) and formula-like
text defused; a table through Rich, every value escaped."""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from edgefarm.cli import common
from edgellm.files import write_text_atomic

FORMATS = ("table", "json", "csv")
FormatOption = Annotated[str, typer.Option("--format", help="table | json | csv")]
OutputOption = Annotated[Path | None, typer.Option("--output", "-o", help="write the listing to FILE instead of "
                                                                         "stdout", dir_okay=False)]


def check_format(fmt: str, valid: Sequence[str] = FORMATS) -> str:
    """``fmt`` lower-cased when valid, else a ConfigurationError (exit 2) naming it and the valid ones."""
    from edgellm.errors import ConfigurationError

    name = fmt.strip().lower()
    if name not in valid:
        raise ConfigurationError(f"unknown --format {fmt!r}; valid: {', '.join(valid)}")
    return name


def check_file_option(option: str, path: Path | None) -> Path | None:
    """A file option (``--output``, ``--junit``) checked before anything runs: its directory exists and it is not a
    directory; a ConfigurationError (exit 2) naming it otherwise."""
    from edgellm.errors import ConfigurationError

    if path is None:
        return None
    if path.exists() and not path.is_file():
        raise ConfigurationError(f"{option} {path}: exists and is not a file")
    if not path.parent.is_dir():
        raise ConfigurationError(f"{option} {path}: its directory {path.parent} does not exist")
    return path


@contextmanager
def to_output(path: Path | None) -> Iterator[None]:
    """Everything printed inside (sys.stdout and the farm's ``out`` console) goes to ``path`` (None: stdout),
    written whole at the end (an interrupted listing leaves no half file)."""
    if check_file_option("--output", path) is None:
        yield
        return
    assert path is not None
    buf = io.StringIO()
    saved_stdout, saved_file = sys.stdout, common.out._file  # None: the console follows sys.stdout
    sys.stdout = buf
    common.out.file = buf
    try:
        yield
    finally:
        sys.stdout = saved_stdout
        common.out._file = saved_file
    write_text_atomic(path, buf.getvalue())


def _csv_value(value: Any) -> Any:
    from edgefarm.pages.escape import spreadsheet_cell

    if isinstance(value, Mapping):
        value = ";".join(f"{k}={v}" for k, v in value.items())
    elif isinstance(value, list | tuple):
        value = ";".join(str(v) for v in value)
    return spreadsheet_cell(value)


def emit(rows: Sequence[Mapping[str, Any]], fields: Sequence[str], fmt: str,
         table: Callable[[Sequence[Mapping[str, Any]]], None]) -> None:
    """``rows`` in ``fmt``: JSON (a list), CSV (``fields`` as its header) or ``table(rows)``."""
    if fmt == "json":
        sys.stdout.write(json.dumps(list(rows), indent=2, default=str) + "\n")
    elif fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(fields), extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: _csv_value(r.get(k)) for k in fields})
        sys.stdout.write(buf.getvalue())
    else:
        table(rows)
