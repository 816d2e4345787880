"""run_workers: every process that took part in a run, with its code revision

A run's orchestrator and every worker a stage was dispatched to (a quantize sent to a quantization pool) are
recorded with the pool they serve, their host and data dir, their code revision (git commit and the sha256 of the
farm's source files, which must match the run's), their toolchain versions, whether they accepted the work (a
worker of another revision refuses it, with the reason) and a dispatched stage's outcome (JSON). Downgrade drops it.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "run_workers",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("run_id", BIG_ID, nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("pool", sa.String(length=200), nullable=True),
        sa.Column("host", sa.String(length=200), nullable=False),
        sa.Column("data_dir", sa.String(length=1000), nullable=False),
        sa.Column("revision", sa.String(length=100), nullable=False),
        sa.Column("source_digest", sa.String(length=64), nullable=False),
        sa.Column("toolchains", sa.JSON(), nullable=False),
        sa.Column("flow_run_id", sa.String(length=64), nullable=True),
        sa.Column("accepted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("outcome", sa.JSON(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_run_workers_run_id_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_workers")),
    )
    op.create_index(op.f("ix_run_workers_run_id"), "run_workers", ["run_id"])
    op.create_index(op.f("ix_run_workers_flow_run_id"), "run_workers", ["flow_run_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_run_workers_flow_run_id"), table_name="run_workers")
    op.drop_index(op.f("ix_run_workers_run_id"), table_name="run_workers")
    op.drop_table("run_workers")
