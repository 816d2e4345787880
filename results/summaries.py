"""What the pages read, kept when a run is published: each row's tallies in its latest run (``row_tallies``) and
its verdict there (``row_latest.verdict``, judged with the default required stages).

"Which rows pass" and the pages' query read these, one row each, instead of the rows' results (10M at 20,000 rows
x 500 runs: benchmarks/bench_db.py). They are derived data, kept by the one function :func:`refresh`, which the
recorder calls wherever a row's latest-run results can change: a run published, a result written into a run that
is already published (a late write), the latest-run table rebuilt; results.regressions when it turns a published
result into a failure. Anything else that changes results must call it too (tests/test_row_summaries.py checks the
kept summaries against the results after each of those).
"""

from __future__ import annotations

from collections import defaultdict

from sqlalchemy import String, and_, bindparam, delete, exists, select, type_coerce, update
from sqlalchemy.orm import Session

from edgefarm.results.models import RowLatest, RowTally, Run
from edgefarm.results.queries import DEFAULT_REQUIRED, packed_results_stmt, unpack

_KEY = ("model", "precision", "platform", "toolchain", "variant")


def refresh(s: Session, run_id: int | None = None) -> None:
    """Recompute the tallies and verdicts of the rows whose latest run is ``run_id`` (None: of every row)."""
    mine = [] if run_id is None else [RowLatest.run_id == run_id]
    if run_id is None:
        s.execute(delete(RowTally))
    else:  # a row that moved to this run drops the tallies of its older run
        same_row = and_(*(getattr(RowLatest, k) == getattr(RowTally, k) for k in _KEY))
        s.execute(delete(RowTally).where(exists().where(same_row, *mine)))
    stmt = packed_results_stmt(*mine)
    cols = [*_KEY, "run_id", "chosen_versions", "packed"]
    s.execute(RowTally.__table__.insert().from_select(cols, stmt))
    packs: dict[tuple[str, ...], list[str]] = defaultdict(list)
    tallies = select(*(type_coerce(getattr(RowTally, k), String) for k in _KEY), RowTally.packed)  # names raw
    if run_id is not None:
        tallies = tallies.where(RowTally.run_id == run_id)
    conn = s.connection()
    for *key, packed in conn.execute(tallies):
        packs[tuple(key)].append(packed)
    if run_id is None:
        conn.execute(update(RowLatest).values(verdict=None))
    verdicts = [{**{f"k_{k}": v for k, v in zip(_KEY, key, strict=True)},
                 "verdict": unpack(packed_list).verdict(DEFAULT_REQUIRED).value}
                for key, packed_list in packs.items()]  # a row is judged over all its chosen versions (see queries)
    if verdicts:  # one executemany, names bound raw (a newer farm's names too)
        t = RowLatest.__table__
        same = (type_coerce(t.c[k], String) == bindparam(f"k_{k}", type_=String) for k in _KEY)
        conn.execute(update(t).where(*same).values(verdict=bindparam("verdict")), verdicts)


def refresh_if_published(s: Session, run_id: int) -> None:
    """:func:`refresh` for a run whose results were just changed, when it is already published."""
    run = s.get(Run, run_id)  # the recorder's session has it already: no query there
    if run is not None and run.published_at is not None:
        s.flush()
        refresh(s, run_id)

