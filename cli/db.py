"""``edgefarm db ...``: manage the results database. Exit 2 on a bad URL, 3 when the database is unreachable."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from edgellm.errors import EdgeLLMError, InfrastructureError

app = typer.Typer(name="db", help="Manage the results database.", no_args_is_help=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

DbOption = Annotated[
    str | None,
    typer.Option("--db", help="Database URL (default: $EDGEFARM_DB_URL, else <data dir>/edgefarm.db)."),
]


def _fail(command: str, exc: EdgeLLMError) -> typer.Exit:
    err.print(f"edgefarm db {command}: error ({exc.kind.value}): {exc}", markup=False)
    return typer.Exit(exc.kind.exit_code)


@app.command()
def upgrade(db: DbOption = None, revision: str = typer.Option("head", help="Target revision.")) -> None:
    """Create or migrate the schema to the latest revision."""
    from edgefarm.flows.settings import Settings
    from edgefarm.results.db import database_errors, default_url, make_engine, redact
    from edgefarm.results.migrate import upgrade as run_upgrade

    try:
        settings = Settings.resolve(db=db, create=False)
        url = settings.db_url
        if url == default_url(settings.data_dir):  # the embedded default: its directory is made
            settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(url)
        try:
            with database_errors(
                    unreachable=lambda why: InfrastructureError(f"cannot reach database {redact(url)!r}: {why}"),
                    refused=lambda why: InfrastructureError(f"database {redact(url)!r} failed: {why}")):
                at = run_upgrade(engine, revision)
        finally:
            engine.dispose()
    except EdgeLLMError as exc:
        raise _fail("upgrade", exc) from None
    out.print(f"database {redact(url)} is at revision {at}", markup=False)
