"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 06:24:43.443262
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "device_health",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("device_id", sa.String(length=200), nullable=False),
        sa.Column("checked_at", sa.DateTime(), nullable=False),
        sa.Column("reachable", sa.Boolean(), nullable=False),
        sa.Column("disk_free_bytes", sa.BigInteger(), nullable=True),
        sa.Column("python_version", sa.String(length=32), nullable=True),
        sa.Column("edgellm_version", sa.String(length=64), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_health")),
    )
    with op.batch_alter_table("device_health", schema=None) as batch_op:
        batch_op.create_index("ix_device_health_device_time", ["device_id", "checked_at"], unique=False)

    op.create_table(
        "lease_devices",
        sa.Column("device_id", sa.String(length=200), nullable=False),
        sa.Column("max_jobs", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", name=op.f("pk_lease_devices")),
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column(
            "kind",
            sa.Enum(
                "nightly", "l0", "l1", "adhoc", name="run_kind", native_enum=False, create_constraint=True, length=32
            ),
            nullable=False,
        ),
        sa.Column("trigger", sa.String(length=200), nullable=False),
        sa.Column("code_version", sa.String(length=100), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column(
            "status",
            sa.Enum(
                "running",
                "passed",
                "failed",
                "error",
                "cancelled",
                name="run_status",
                native_enum=False,
                create_constraint=True,
                length=32,
            ),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_table(
        "device_leases",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("device_id", sa.String(length=200), nullable=False),
        sa.Column("holder", sa.String(length=300), nullable=False),
        sa.Column("acquired_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.Column("ttl_s", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["lease_devices.device_id"],
            name=op.f("fk_device_leases_device_id_lease_devices"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_device_leases")),
    )
    with op.batch_alter_table("device_leases", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_device_leases_device_id"), ["device_id"], unique=False)

    op.create_table(
        "metric_baselines",
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
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.Column("set_at", sa.DateTime(), nullable=False),
        sa.Column("source_run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.ForeignKeyConstraint(
            ["source_run_id"], ["runs.id"], name=op.f("fk_metric_baselines_source_run_id_runs"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint(
            "model", "precision", "platform", "stage", "test_id", "name", name=op.f("pk_metric_baselines")
        ),
    )
    op.create_table(
        "results",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("model_revision", sa.String(length=64), nullable=True),
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
        sa.Column("device", sa.String(length=200), nullable=True),
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
        sa.Column("reason", sa.Text(), nullable=True),
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
        sa.Column("duration_s", sa.Float(), nullable=True),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_results_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_results")),
        sa.UniqueConstraint(
            "run_id",
            "model",
            "precision",
            "platform",
            "stage",
            "test_id",
            name=op.f("uq_results_run_id_model_precision_platform_stage_test_id"),
        ),
    )
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.create_index(
            "ix_results_row_run", ["model", "precision", "platform", "run_id", "stage", "status"], unique=False
        )

    op.create_table(
        "row_latest",
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
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_row_latest_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("model", "precision", "platform", name=op.f("pk_row_latest")),
    )
    with op.batch_alter_table("row_latest", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_row_latest_run_id"), ["run_id"], unique=False)

    op.create_table(
        "toolchain_versions",
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("version", sa.String(length=200), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_toolchain_versions_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_id", "name", name=op.f("pk_toolchain_versions")),
    )
    op.create_table(
        "artifact_refs",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("run_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("result_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=False),
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
        sa.Column(
            "packing",
            sa.Enum("file", "tar", name="packing", native_enum=False, create_constraint=True, length=32),
            nullable=False,
        ),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("path_hint", sa.String(length=500), nullable=True),
        sa.ForeignKeyConstraint(
            ["result_id"], ["results.id"], name=op.f("fk_artifact_refs_result_id_results"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_artifact_refs_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifact_refs")),
        sa.UniqueConstraint(
            "run_id", "result_id", "sha256", "kind", name=op.f("uq_artifact_refs_run_id_result_id_sha256_kind")
        ),
    )
    with op.batch_alter_table("artifact_refs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_artifact_refs_result_id"), ["result_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_artifact_refs_run_id"), ["run_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_artifact_refs_sha256"), ["sha256"], unique=False)

    op.create_table(
        "metrics",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("result_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("unit", sa.String(length=32), nullable=False),
        sa.ForeignKeyConstraint(
            ["result_id"], ["results.id"], name=op.f("fk_metrics_result_id_results"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_metrics")),
        sa.UniqueConstraint("result_id", "name", name=op.f("uq_metrics_result_id_name")),
    )


def downgrade() -> None:
    op.drop_table("metrics")
    with op.batch_alter_table("artifact_refs", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_artifact_refs_sha256"))
        batch_op.drop_index(batch_op.f("ix_artifact_refs_run_id"))
        batch_op.drop_index(batch_op.f("ix_artifact_refs_result_id"))

    op.drop_table("artifact_refs")
    op.drop_table("toolchain_versions")
    with op.batch_alter_table("row_latest", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_row_latest_run_id"))

    op.drop_table("row_latest")
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_index("ix_results_row_run")

    op.drop_table("results")
    op.drop_table("metric_baselines")
    with op.batch_alter_table("device_leases", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_device_leases_device_id"))

    op.drop_table("device_leases")
    op.drop_table("runs")
    op.drop_table("lease_devices")
    with op.batch_alter_table("device_health", schema=None) as batch_op:
        batch_op.drop_index("ix_device_health_device_time")

    op.drop_table("device_health")
