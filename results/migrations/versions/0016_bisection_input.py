"""bisections.bisected: which input a bisection bisected

``edgefarm bisect`` bisects each input that changed between two runs of a row: this repository's commits
(``revision``), the checkpoint's commits (``checkpoint``: a checkpoint directory that is a git repository) or a
toolchain's versions (``toolchain``: the toolchain named in the row's ``toolchain`` column). The name is a plain
string (``results.bisections.INPUTS``); rows written before it are NULL, read as ``revision`` (all there was).
Downgrade drops the column.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("bisections", sa.Column("bisected", sa.String(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bisections") as batch:
        batch.drop_column("bisected")
