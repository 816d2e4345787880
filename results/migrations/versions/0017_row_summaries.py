"""row_tallies and row_latest.verdict: what the pages read, kept when a run is published

"Which rows pass" and the pages' query judged each row from its results in its latest run at every read (854 ms and
1.9 s at 10M results on PostgreSQL). A row's results in that run are now counted and packed once, when the run is
published, into ``row_tallies`` (one per row and chosen toolchain versions), and its verdict with the default
required stages kept in ``row_latest.verdict`` (``results.summaries``). Upgrade creates both and fills them from the
published results with ``results.summaries.refresh`` (derived data: the same function keeps them afterwards; it
reads only columns that exist since revision 0014). Downgrade drops them.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.orm import Session

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    from edgefarm.results import summaries

    op.add_column("row_latest", sa.Column("verdict", sa.String(length=16), nullable=True))
    op.create_table(
        "row_tallies",
        sa.Column("model", sa.String(length=200), primary_key=True),
        sa.Column("precision", sa.String(length=32), primary_key=True),
        sa.Column("platform", sa.String(length=64), primary_key=True),
        sa.Column("toolchain", sa.String(length=32), primary_key=True),
        sa.Column("variant", sa.String(length=300), primary_key=True),
        sa.Column("chosen_versions", sa.String(length=300), primary_key=True),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("packed", sa.Text(), nullable=False),
    )
    op.create_index("ix_row_tallies_run_id", "row_tallies", ["run_id"])
    summaries.refresh(Session(bind=op.get_bind()))


def downgrade() -> None:
    op.drop_index("ix_row_tallies_run_id", table_name="row_tallies")
    op.drop_table("row_tallies")
    with op.batch_alter_table("row_latest") as batch:
        batch.drop_column("verdict")
