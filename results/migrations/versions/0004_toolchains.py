"""toolchains: every result, attempt and build-cache entry names the toolchain (and its version) that made it

Existing rows were all made by edgellm with ONNX Runtime: they become ``edgellm-ort`` with the version their run
recorded (results, attempts: the run's ``toolchain_versions``; export and build cache entries: the versions in
their key inputs). Reference cache entries (transformers on the host) name no toolchain.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("results", "attempts", "cache_entries")
# Frozen copy of the names at this revision (a migration never imports code that may change later).
TOOLCHAINS = ("edgellm-ort", "edgellm-torch-cuda", "tensorrt-edgellm")


def _version(edgellm: Any, onnxruntime: Any) -> str | None:
    """edgellm-ort's version string (toolchains/edgellm/driver.py's ``version``: ``<edgellm>+onnxruntime-<ort>``)."""
    if not edgellm or not onnxruntime:
        return None
    return f"{edgellm}+onnxruntime-{onnxruntime}"


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("toolchain", sa.Enum(*TOOLCHAINS, name="toolchain", native_enum=False,
                                                               create_constraint=True, length=32), nullable=True))
            batch_op.add_column(sa.Column("toolchain_version", sa.String(length=200), nullable=True))
    conn = op.get_bind()
    for table in ("results", "attempts"):
        conn.execute(sa.text(f"UPDATE {table} SET toolchain = 'edgellm-ort'"))
    versions: dict[int, dict[str, str]] = {}
    for run_id, name, version in conn.execute(sa.text(
            "SELECT run_id, name, version FROM toolchain_versions WHERE name IN ('edgellm-farm', 'onnxruntime')")):
        versions.setdefault(run_id, {})[name] = version
    for run_id, names in versions.items():
        value = _version(names.get("edgellm-farm"), names.get("onnxruntime"))
        if value is not None:
            for table in ("results", "attempts"):
                conn.execute(sa.text(f"UPDATE {table} SET toolchain_version = :v WHERE run_id = :r"),
                             {"v": value, "r": run_id})
    for key, inputs in conn.execute(sa.text("SELECT key, inputs FROM cache_entries")).all():
        data = json.loads(inputs) if isinstance(inputs, str) else (inputs or {})
        if data.get("stage") not in ("export", "build"):
            continue  # the transformers reference: no toolchain made it
        conn.execute(sa.text("UPDATE cache_entries SET toolchain = 'edgellm-ort' WHERE key = :k"), {"k": key})
        if data["stage"] == "build":
            value = _version(data.get("edgellm"), data.get("backend_version"))
        else:  # exports ran on the orchestrator, whose ONNX Runtime version was not part of the key
            value = data.get("edgellm")
        if value is not None:
            conn.execute(sa.text("UPDATE cache_entries SET toolchain_version = :v WHERE key = :k"),
                         {"v": value, "k": key})
    for table in ("results", "attempts"):  # cache entries of the reference stage have none
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.alter_column("toolchain", existing_type=sa.String(length=32), nullable=False)


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_column("toolchain_version")
            batch_op.drop_column("toolchain")
