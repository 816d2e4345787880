"""lease slots: a lease may hold several of a device's slots (all of them = exclusive)

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("device_leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("slots", sa.Integer(), server_default="1", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("device_leases", schema=None) as batch_op:
        batch_op.drop_column("slots")
