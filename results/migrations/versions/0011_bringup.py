"""bring-up: the rungs of an add-model ladder, and a run's report

``edgefarm bring-up`` climbs a checkpoint up the add-model ladder (inventory, closest family, toolchain registries,
weight reconciliation, provider reference, few-layer test, the pipeline on each platform). ``bringup_rungs`` records
each rung it reached, in order, with its status (the results' vocabulary), reason and evidence (JSON);
``runs.report`` names the report directory a run wrote (the run page links it). Downgrade drops both.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "bringup_rungs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("checkpoint_sha256", sa.String(length=64), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_bringup_rungs_run_id_runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bringup_rungs")),
        sa.UniqueConstraint("run_id", "position", name=op.f("uq_bringup_rungs_run_id_position")),
    )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("report", sa.String(length=1000), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("report")
    op.drop_table("bringup_rungs")
