"""open vocabularies: the precision, stage, toolchain, route and run-kind columns lose their CHECK constraints

Those five are the farm's extension points: each has one registry in code, which checks a name when it is written
(``results.models.VOCABULARIES``, through the columns' type). A CHECK constraint repeated that registry's list as a
frozen copy in a migration, and the copies drifted: 0005 created ``regressions.precision`` without ``mxfp8``, which
the code allows, so an mxfp8 regression row was refused on insert (and Alembic's ``compare_metadata`` does not
compare CHECK constraints, so the migration test could not see it). Without them, adding a precision or a
toolchain is a change of code only, never a migration, and a database written by a newer farm stays readable.

The closed vocabularies (result and run status, error kind, regression severity, artifact kind, packing) are state
machines, not extension points: they keep their CHECK constraints, a new member is a deliberate migration, and
``tests/test_results_vocabularies.py`` compares every CHECK list of a migrated database with its enum.

Both backends go through batch mode: PostgreSQL drops each constraint in place (ALTER TABLE ... DROP CONSTRAINT);
SQLite, which cannot drop a constraint, rebuilds each table (copy, drop, rename) with its rows, indexes, keys and
remaining CHECKs. ``results.migrate`` turns SQLite's foreign keys off while migrating, so a rebuilt parent table
(``runs``, ``results``) does not cascade-delete its children, and checks them before each migration commits.
Rows are kept as they are. A constraint already gone is skipped, so upgrading again after a downgrade works.

Downgrade is a documented no-op: the columns stay unconstrained. The 0007 code checks every name in Python before
writing, so it runs on them; re-creating 0007's frozen lists would restore the drift (``regressions.precision``
without ``mxfp8``) and fail on rows holding names those lists lack.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen at this revision: table -> the open vocabularies whose CHECK it has (named ck_<table>_<vocabulary>).
OPEN_CHECKS: dict[str, tuple[str, ...]] = {
    "runs": ("run_kind",),
    "results": ("precision", "stage", "toolchain", "route"),
    "row_latest": ("precision",),
    "metric_baselines": ("precision", "stage"),
    "attempts": ("precision", "stage", "toolchain"),
    "cache_entries": ("toolchain",),
    "regressions": ("precision", "stage"),
}


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    for table, vocabularies in OPEN_CHECKS.items():
        present = {c["name"] for c in inspector.get_check_constraints(table)}
        names = [f"ck_{table}_{v}" for v in vocabularies if f"ck_{table}_{v}" in present]
        if not names:
            continue
        with op.batch_alter_table(table, schema=None) as batch_op:
            for name in names:
                batch_op.drop_constraint(op.f(name), type_="check")


def downgrade() -> None:
    """No-op (see the module doc): the open-vocabulary columns stay without CHECK constraints."""
