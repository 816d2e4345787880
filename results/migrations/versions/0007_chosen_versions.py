"""chosen_versions: the toolchain versions a matrix chose for a result's job (``toolchain_versions:``, to compare
versions side by side), as ``name==version`` joined by ", "; null where none was chosen (each toolchain ran its
pinned version). Two versions of one (model, precision, platform) in one run are two rows of the same row key,
told apart by this column (and by their test ids).

Existing rows: no matrix could choose versions before this revision, so they stay null.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chosen_versions", sa.String(length=300), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_column("chosen_versions")
