"""route and standin: every result records how its engine was made (``onnx`` or ``direct``, TensorRT Edge-LLM's
two routes; null for toolchains with one route, edgellm's) and whether it ran on test stand-ins of a toolchain's
tools (never evidence: such a row is never "pass" in queries and docs).

Existing rows: tensorrt-edgellm ones were all made on the ONNX route (quantize -> tensorrt-edgellm-export; no
device stage ran before this revision), so they get ``onnx``; edgellm's get null. No existing row ran on a stand-in.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROUTES = ("onnx", "direct")  # frozen copy at this revision


def upgrade() -> None:
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("route", sa.Enum(*ROUTES, name="route", native_enum=False,
                                                       create_constraint=True, length=32), nullable=True))
        batch_op.add_column(sa.Column("standin", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.execute("UPDATE results SET route = 'onnx' WHERE toolchain = 'tensorrt-edgellm'")


def downgrade() -> None:
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_column("standin")
        batch_op.drop_column("route")
