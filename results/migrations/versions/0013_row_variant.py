"""row variant: a row is (model, precision, platform, job toolchain, variant)

``results.variant`` is the row's variant as ``vocabulary.variant.variant_key`` writes it: the KV-cache and LM-head
precisions, speculative decoding (an EAGLE3 draft and its base), a LoRA adapter, a reduced vocabulary, an FP8
embedding, the components of a multimodal checkpoint. A plain string with no CHECK (a new feature needs no
migration); '' is the default variant. Two rows that differ only in a variant never share a cell again.

Existing results are backfilled from what they recorded before: their test ids carry the KV-cache token
(``<prec>kv``) and the LM-head token (``lm<prec>``) of ``test_lists.ids`` (frozen here), the only variants that
existed; every other result gets ''. The row index ``ix_results_row_run`` gains the column after the job
toolchain, and ``row_latest`` gets it in its primary key (dropped and rebuilt from the published runs' results, as
``results.recorder.rebuild_row_latest`` does). SQLite rebuilds ``results`` in batch mode; PostgreSQL alters it in
place. Rows are kept. Downgrade drops the column and rebuilds ``row_latest`` per (model, precision, platform,
toolchain) again.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROW_INDEX = "ix_results_row_run"
NAME = sa.String(length=32)
VARIANT = sa.String(length=300)
RUN_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
# Frozen at this revision: the precisions test ids named a KV cache and an LM head with.
_KV = re.compile(r"-(fp32|fp16|bf16|fp8|int8)kv(?:-|\Z)")
_LM = re.compile(r"-lm(fp32|fp16|bf16|fp8|int8_wo|int4_wo)-")


def _key(test_id: str) -> str:
    parts = []
    if kv := _KV.search(test_id):
        parts.append(f"kv={kv.group(1)}")
    if lm := _LM.search(test_id):
        parts.append(f"lm={lm.group(1)}")
    return ";".join(parts)


def upgrade() -> None:
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.add_column(sa.Column("variant", VARIANT, nullable=False, server_default=""))
    conn = op.get_bind()
    ids = [t for (t,) in conn.execute(sa.text("SELECT DISTINCT test_id FROM results"))]
    for test_id in ids:
        if key := _key(test_id):
            conn.execute(sa.text("UPDATE results SET variant = :v WHERE test_id = :t"), {"v": key, "t": test_id})
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_index(ROW_INDEX)
        batch_op.create_index(ROW_INDEX, ["model", "precision", "platform", "job_toolchain", "variant", "run_id",
                                          "stage", "status"], unique=False)
    _rebuild_row_latest(with_variant=True)


def downgrade() -> None:
    _rebuild_row_latest(with_variant=False)
    with op.batch_alter_table("results", schema=None) as batch_op:
        batch_op.drop_index(ROW_INDEX)
        batch_op.drop_column("variant")
        batch_op.create_index(ROW_INDEX, ["model", "precision", "platform", "job_toolchain", "run_id", "stage",
                                          "status"], unique=False)


def _rebuild_row_latest(*, with_variant: bool) -> None:
    with op.batch_alter_table("row_latest", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_row_latest_run_id"))
    op.drop_table("row_latest")
    key = ["model", "precision", "platform", "toolchain", *(["variant"] if with_variant else [])]
    op.create_table(
        "row_latest",
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("precision", NAME, nullable=False),
        sa.Column("platform", sa.String(length=64), nullable=False),
        sa.Column("toolchain", NAME, nullable=False),
        *([sa.Column("variant", VARIANT, nullable=False, server_default="")] if with_variant else []),
        sa.Column("run_id", RUN_ID, nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_row_latest_run_id_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint(*key, name=op.f("pk_row_latest")),
    )
    with op.batch_alter_table("row_latest", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_row_latest_run_id"), ["run_id"], unique=False)
    source = ["r.model", "r.precision", "r.platform", "r.job_toolchain", *(["r.variant"] if with_variant else [])]
    op.get_bind().execute(sa.text(
        f"INSERT INTO row_latest ({', '.join(key)}, run_id) SELECT {', '.join(source)}, MAX(r.run_id) "
        f"FROM results r JOIN runs ON runs.id = r.run_id WHERE runs.published_at IS NOT NULL "
        f"GROUP BY {', '.join(source)}"))
