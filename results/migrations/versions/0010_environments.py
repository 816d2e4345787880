"""environments: every result names the environment it ran in; a resource error kind; engine manifests

Real boards: what a number depends on (L4T/JetPack, TensorRT, CUDA and driver versions, the toolchain build's
release and revision, power mode, clock lock, clocks and temperature around a benchmark) is recorded with each
result. ``environments`` holds each distinct environment once, keyed by the sha256 of its canonical JSON;
``results.environment`` names it (NULL for results recorded before this revision). ``results.bench_conditions``
says how a benchmark's board differed from its device type's declared benchmark conditions (power mode, locked
clocks); NULL when they matched or did not apply. Regressions compare only results of equal conditions.

Two closed vocabularies gain a member (their CHECK constraints are dropped and made again with the new list):
``error_kind`` gains ``resource`` (out of memory or disk, with the figures) on ``results`` and ``attempts``;
``artifact_kind`` gains ``engine_manifest`` (an engine that stays on its device) on ``artifact_refs`` and
``cache_entries``. Both backends go through batch mode (SQLite rebuilds each table with its rows; ``results.migrate``
turns its foreign keys off meanwhile).

Downgrade drops the two columns and the table, records ``resource`` errors as ``test_failure``, and removes the
cache entries and artifact refs of engine manifests (0009's code cannot use them: those engines are built again).

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen at this revision (closed vocabularies: a new member is a migration like this one).
ERROR_KINDS_0009 = ("infrastructure", "configuration", "test_failure", "bug")
ERROR_KINDS = (*ERROR_KINDS_0009, "resource")
ARTIFACT_KINDS_0009 = ("checkpoint", "onnx", "engine", "log", "report", "other")
ARTIFACT_KINDS = (*ARTIFACT_KINDS_0009, "engine_manifest")
CHECKS = {("results", "error_kind"): "error_kind", ("attempts", "error_kind"): "error_kind",
          ("artifact_refs", "kind"): "artifact_kind", ("cache_entries", "kind"): "artifact_kind"}


def _sql_list(values: Sequence[str]) -> str:
    return ", ".join(f"'{v}'" for v in values)


def _recheck(new: bool) -> None:
    inspector = sa.inspect(op.get_bind())
    for (table, column), vocabulary in CHECKS.items():
        name = f"ck_{table}_{vocabulary}"
        values = (ERROR_KINDS if new else ERROR_KINDS_0009) if vocabulary == "error_kind" else (
            ARTIFACT_KINDS if new else ARTIFACT_KINDS_0009)
        present = {c["name"] for c in inspector.get_check_constraints(table)}
        with op.batch_alter_table(table, schema=None) as batch_op:
            if name in present:
                batch_op.drop_constraint(op.f(name), type_="check")
            batch_op.create_check_constraint(op.f(name), sa.text(f"{column} IN ({_sql_list(values)})"))


def upgrade() -> None:
    op.create_table(
        "environments",
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("data", sa.JSON(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_environments")),
    )
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("environment", sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column("bench_conditions", sa.String(length=300), nullable=True))
        batch_op.create_foreign_key(op.f("fk_results_environment_environments"), "environments", ["environment"],
                                    ["digest"])
    _recheck(new=True)


def downgrade() -> None:
    conn = op.get_bind()
    conn.execute(sa.text("UPDATE results SET error_kind = 'test_failure' WHERE error_kind = 'resource'"))
    conn.execute(sa.text("UPDATE attempts SET error_kind = 'test_failure' WHERE error_kind = 'resource'"))
    conn.execute(sa.text("DELETE FROM artifact_refs WHERE kind = 'engine_manifest'"))
    conn.execute(sa.text("DELETE FROM cache_entries WHERE kind = 'engine_manifest'"))
    _recheck(new=False)
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_constraint(op.f("fk_results_environment_environments"), type_="foreignkey")
        batch_op.drop_column("bench_conditions")
        batch_op.drop_column("environment")
    op.drop_table("environments")
