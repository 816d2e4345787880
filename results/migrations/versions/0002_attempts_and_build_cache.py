"""attempts and build cache

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 06:38:28.858644
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "cache_entries",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column(
            "kind",
            sa.Enum(
                "checkpoint",
                "onnx",
                "engine",
                "log",
                "report",
                "other",
                name="artifact_kind",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("inputs", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("last_used_at", sa.DateTime(), nullable=False),
        sa.Column("hits", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_cache_entries")),
    )
    op.create_table(
        "attempts",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column(
            "precision",
            sa.Enum(
                "fp32",
                "fp16",
                "bf16",
                "fp8",
                "int8_sq",
                "int8_wo",
                "int4_awq",
                "int4_gptq",
                "int4_wo",
                "nvfp4",
                "mxfp8",
                name="precision",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column("platform", sa.String(length=64), nullable=False),
        sa.Column(
            "stage",
            sa.Enum(
                "quantize",
                "export",
                "build",
                "infer",
                "accuracy",
                "bench",
                name="stage",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column("test_id", sa.String(length=200), nullable=False),
        sa.Column("device", sa.String(length=200), nullable=True),
        sa.Column(
            "status",
            sa.Enum(
                "pass",
                "fail",
                "error",
                "waived",
                "skipped",
                "not_applicable",
                name="result_status",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=False,
        ),
        sa.Column(
            "error_kind",
            sa.Enum(
                "infrastructure",
                "configuration",
                "test_failure",
                "bug",
                name="error_kind",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=True,
        ),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_attempts_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_attempts")),
    )
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.create_index(
            "ix_attempts_run_row", ["run_id", "model", "precision", "platform", "stage"], unique=False
        )


def downgrade() -> None:

    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_attempts_run_row")

    op.drop_table("attempts")
    op.drop_table("cache_entries")
