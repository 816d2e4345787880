"""evidence: run liveness (heartbeat, host, pid) and publication, flagged regressions, quarantined devices

A run's ``heartbeat_at`` is refreshed while its orchestrator lives; a ``running`` run whose heartbeat is stale
(or whose process is gone on the same host) is reaped as ``error``. Existing running runs keep a null heartbeat
and are judged by their start time. A run's results count as evidence (``row_latest``, docs, queries) only once
it is published: when it finishes normally, never when it is reaped.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen copies of the names at this revision (a migration never imports code that may change later).
PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "int8_sq", "int8_wo", "int4_awq", "int4_gptq", "int4_wo", "nvfp4")
STAGES = ("quantize", "export", "build", "infer", "accuracy", "bench")
SEVERITIES = ("fail", "warn")


def _enum(values: Sequence[str], name: str) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, create_constraint=True, length=32)


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heartbeat_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("host", sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("published_at", sa.DateTime(), nullable=True))
    # Runs that already ended were published as they went (the old rule); running ones were not.
    op.execute("UPDATE runs SET published_at = finished_at WHERE status <> 'running'")
    op.create_table(
        "regressions",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("precision", _enum(PRECISIONS, "precision"), nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=False),
        sa.Column("stage", _enum(STAGES, "stage"), nullable=False),
        sa.Column("test_id", sa.String(length=200), nullable=False),
        sa.Column("metric", sa.String(length=100), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("baseline", sa.Float(), nullable=False),
        sa.Column("spread", sa.Float(), nullable=False),
        sa.Column("baseline_runs", sa.Integer(), nullable=False),
        sa.Column("previous_run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("change", sa.Float(), nullable=False),
        sa.Column("severity", _enum(SEVERITIES, "regression_severity"), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_regressions_run_id_runs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["previous_run_id"], ["runs.id"], name=op.f("fk_regressions_previous_run_id_runs"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regressions")),
        sa.UniqueConstraint("run_id", "model", "precision", "platform", "stage", "test_id", "metric",
                            name=op.f("uq_regressions_run_id_model_precision_platform_stage_test_id_metric")),
    )
    op.create_table(
        "device_quarantine",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("device_id", sa.String(length=200), nullable=False),
        sa.Column("since", sa.DateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("error_rate", sa.Float(), nullable=False),
        sa.Column("released_at", sa.DateTime(), nullable=True),
        sa.Column("released_by", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.ForeignKeyConstraint(["released_by"], ["device_health.id"],
                                name=op.f("fk_device_quarantine_released_by_device_health"), ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_quarantine")),
    )
    op.create_index("ix_device_quarantine_device_released", "device_quarantine", ["device_id", "released_at"])


def downgrade() -> None:
    op.drop_index("ix_device_quarantine_device_released", table_name="device_quarantine")
    op.drop_table("device_quarantine")
    op.drop_table("regressions")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("published_at")
        batch_op.drop_column("pid")
        batch_op.drop_column("host")
        batch_op.drop_column("heartbeat_at")
