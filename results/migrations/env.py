"""Alembic environment. Run through results.migrate (which passes the connection); works from any cwd."""

from __future__ import annotations

from typing import Any

from alembic import context

from edgefarm.results.db import make_engine
from edgefarm.results.migrate import foreign_key_check, sqlite_foreign_keys_off
from edgefarm.results.models import Base

config = context.config
target_metadata = Base.metadata


def _check_references(ctx: Any, step: Any, **_: Any) -> None:
    foreign_key_check(ctx.connection, step.up_revision_id)


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    sqlite = connection.dialect.name == "sqlite"
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=sqlite,  # SQLite ALTERs go through table copies
        compare_type=True,
        # SQLite migrates with foreign keys off (results.migrate): each step checks them before it commits
        on_version_apply=[_check_references] if sqlite else [],
    )
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    with engine.connect() as conn, sqlite_foreign_keys_off(conn):
        _run(conn)
        conn.commit()
    engine.dispose()
