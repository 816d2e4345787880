"""row toolchain: a row is (model, precision, platform, job toolchain), so one platform can run two toolchains side
by side (x86-cpu runs edgellm-ort and onnxruntime-genai) and show both

``results.job_toolchain`` is the toolchain the job ran with; ``results.toolchain`` stays what made the stage's
result, which differs for a quantize stage (tensorrt-edgellm quantizes for edgellm-ort jobs). An open-vocabulary
column like ``toolchain`` (no CHECK; see 0008). The row index ``ix_results_row_run`` gains it after the platform,
so "which rows pass" still seeks each row's latest run in the index.

Existing results, backfilled before the column becomes NOT NULL: a stage other than quantize was made by its job's
toolchain (``job_toolchain = toolchain``); a quantize result takes the toolchain of a non-quantize result of the
same job (same run, model, precision, platform and test id; the smallest name should there be several), else,
when its job recorded nothing else, its own toolchain.

``row_latest`` (derived from results: the latest published run per row) gets ``toolchain`` in its primary key. It is
dropped and rebuilt from the backfilled results of the published runs, as ``results.recorder.rebuild_row_latest``
does. SQLite rebuilds ``results`` in batch mode (``results.migrate`` turns foreign keys off, so its metrics and
artifact refs stay); PostgreSQL alters it in place. Rows are kept.

Downgrade drops the column (a quantize result's job toolchain is lost) and rebuilds ``row_latest`` per
(model, precision, platform) again.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen at this revision: the one stage whose result another toolchain than the job's makes.
QUANTIZE = "quantize"
ROW_INDEX = "ix_results_row_run"
NAME = sa.String(length=32)  # an open-vocabulary name (results.models.VocabularyName's column type)
RUN_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_toolchain", NAME, nullable=True))
    conn = op.get_bind()
    conn.execute(sa.text("UPDATE results SET job_toolchain = toolchain WHERE stage <> :q"), {"q": QUANTIZE})
    conn.execute(sa.text(
        "UPDATE results SET job_toolchain = COALESCE((SELECT MIN(o.toolchain) FROM results o "
        "WHERE o.run_id = results.run_id AND o.model = results.model AND o.precision = results.precision "
        "AND o.platform = results.platform AND o.test_id = results.test_id AND o.stage <> :q), toolchain) "
        "WHERE stage = :q"), {"q": QUANTIZE})
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.alter_column("job_toolchain", existing_type=NAME, nullable=False)
        batch_op.drop_index(ROW_INDEX)
        batch_op.create_index(ROW_INDEX, ["model", "precision", "platform", "job_toolchain", "run_id", "stage",
                                          "status"], unique=False)
    _rebuild_row_latest(with_toolchain=True)


def downgrade() -> None:
    _rebuild_row_latest(with_toolchain=False)
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_index(ROW_INDEX)
        batch_op.drop_column("job_toolchain")
        batch_op.create_index(ROW_INDEX, ["model", "precision", "platform", "run_id", "stage", "status"],
                              unique=False)


def _rebuild_row_latest(*, with_toolchain: bool) -> None:
    """Drop ``row_latest`` and make it again, keyed with or without the job toolchain, from the published runs'
    results (it holds nothing the results do not)."""
    with op.batch_alter_table("row_latest", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_row_latest_run_id"))
    op.drop_table("row_latest")
    key = ["model", "precision", "platform", *(["toolchain"] if with_toolchain else [])]
    op.create_table(
        "row_latest",
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("precision", NAME, nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=False),
        *([sa.Column("toolchain", NAME, nullable=False)] if with_toolchain else []),
        sa.Column("run_id", RUN_ID, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_row_latest_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint(*key, name=op.f("pk_row_latest")),
    )
    with op.batch_alter_table("row_latest", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_row_latest_run_id"), ["run_id"], unique=False)
    source = ["r.model", "r.precision", "r.platform", *(["r.job_toolchain"] if with_toolchain else [])]
    op.get_bind().execute(sa.text(
        f"INSERT INTO row_latest ({', '.join(key)}, run_id) SELECT {', '.join(source)}, MAX(r.run_id) "
        f"FROM results r JOIN runs ON runs.id = r.run_id WHERE runs.published_at IS NOT NULL "
        f"GROUP BY {', '.join(source)}"))
