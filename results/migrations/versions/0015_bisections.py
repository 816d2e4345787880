"""bisections: each answer of ``edgefarm bisect``, so the pages can say since when a row fails

A bisection is of one row (model, precision, platform, its job toolchain: the ``--row`` form and
``--bisect-regressions``, with the good and bad run ids) or of one checkpoint (its digest: the ``--checkpoint``
form). It keeps the two ends as given and as resolved, the answer (``first_bad`` full sha and its subject,
``last_good``), whether it was found (and the reason when not) and every probe (JSON: revision, status, seconds).
Names are plain strings. Downgrade drops it.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "bisections",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("model", sa.String(length=200), nullable=True),
        sa.Column("precision", sa.String(length=64), nullable=False),
        sa.Column("platform", sa.String(length=100), nullable=False),
        sa.Column("toolchain", sa.String(length=100), nullable=True),
        sa.Column("checkpoint_sha256", sa.String(length=64), nullable=True),
        sa.Column("good_ref", sa.String(length=200), nullable=False),
        sa.Column("bad_ref", sa.String(length=200), nullable=False),
        sa.Column("good_run_id", BIG_ID, nullable=True),
        sa.Column("bad_run_id", BIG_ID, nullable=True),
        sa.Column("good_sha", sa.String(length=64), nullable=True),
        sa.Column("bad_sha", sa.String(length=64), nullable=True),
        sa.Column("found", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("first_bad", sa.String(length=64), nullable=True),
        sa.Column("first_bad_subject", sa.Text(), nullable=True),
        sa.Column("last_good", sa.String(length=64), nullable=True),
        sa.Column("probes", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["good_run_id"], ["runs.id"], name=op.f("fk_bisections_good_run_id_runs"),
                                ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["bad_run_id"], ["runs.id"], name=op.f("fk_bisections_bad_run_id_runs"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_bisections")),
    )
    op.create_index(op.f("ix_bisections_bad_run_id"), "bisections", ["bad_run_id"])
    op.create_index(op.f("ix_bisections_model_precision_platform"), "bisections", ["model", "precision", "platform"])


def downgrade() -> None:
    op.drop_index(op.f("ix_bisections_model_precision_platform"), table_name="bisections")
    op.drop_index(op.f("ix_bisections_bad_run_id"), table_name="bisections")
    op.drop_table("bisections")
