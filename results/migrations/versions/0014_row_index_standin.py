"""row index covers stand-ins: ``ix_results_row_run`` gains ``standin`` as its last column

"Which rows pass" (``results.queries.passing_rows``) refuses a row with any result that ran on stand-ins, so it
reads ``standin`` of every result of each row's latest run; the row index had (model, precision, platform, job
toolchain, variant, run id, stage, status) but not ``standin``, so each row's probe also read the table's pages
(PostgreSQL: an Index Scan instead of an Index Only Scan; benchmarks/bench_db.py, 20,000 rows). With ``standin``
as the index's last column the query reads the index alone on both backends. Rows are kept; downgrade restores the
index without it.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROW_INDEX = "ix_results_row_run"
COLUMNS = ["model", "precision", "platform", "job_toolchain", "variant", "run_id", "stage", "status"]


def upgrade() -> None:
    op.drop_index(ROW_INDEX, table_name="results")
    op.create_index(ROW_INDEX, "results", [*COLUMNS, "standin"], unique=False)


def downgrade() -> None:
    op.drop_index(ROW_INDEX, table_name="results")
    op.create_index(ROW_INDEX, "results", COLUMNS, unique=False)
