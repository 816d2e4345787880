"""row_latest_kind: each row's latest published run of each run kind, kept when a run is published

The nightly's pages show each row's latest nightly run: found by aggregating every published nightly result at every
read (the docs' whole read took 56-59 s at 10M results on PostgreSQL, most of it those passes). The recorder now
keeps the pointer per run kind beside ``row_latest`` (``results.recorder``). Upgrade creates the table and fills it
from the published runs' results, as ``results.recorder.rebuild_row_latest`` does; downgrade drops it.

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "row_latest_kind",
        sa.Column("model", sa.String(length=200), primary_key=True),
        sa.Column("precision", sa.String(length=32), primary_key=True),
        sa.Column("platform", sa.String(length=64), primary_key=True),
        sa.Column("toolchain", sa.String(length=32), primary_key=True),
        sa.Column("variant", sa.String(length=300), primary_key=True),
        sa.Column("kind", sa.String(length=32), primary_key=True),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    )
    op.create_index("ix_row_latest_kind_run_id", "row_latest_kind", ["run_id"])
    op.execute(
        "INSERT INTO row_latest_kind (model, precision, platform, toolchain, variant, kind, run_id) "
        "SELECT r.model, r.precision, r.platform, r.job_toolchain, r.variant, runs.kind, MAX(r.run_id) "
        "FROM results r JOIN runs ON runs.id = r.run_id WHERE runs.published_at IS NOT NULL "
        "GROUP BY r.model, r.precision, r.platform, r.job_toolchain, r.variant, runs.kind")


def downgrade() -> None:
    op.drop_index("ix_row_latest_kind_run_id", table_name="row_latest_kind")
    op.drop_table("row_latest_kind")
