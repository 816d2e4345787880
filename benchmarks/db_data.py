"""The synthetic results database of benchmarks/bench_db.py: its shape, its rows and a fast loader.

A *row* is (model, precision, platform, job toolchain, variant), as results/queries.py defines it. Run ``r`` (1..runs)
covers row ``i`` when ``(i + r) % stride == 0``, one result per stage (so each row is in ``runs / stride`` runs and
the database holds about ``rows * runs * stages / stride`` results). Every run is published but the last one (still
running: never evidence). A result's status is a hash of (row, run, stage), not a sequential random stream, so the
verdicts of the rows' latest runs (:func:`expected_passing`) can be computed without generating the other results:
that is the oracle the benchmark and its test check ``passing_rows`` against.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

from edgefarm.results.recorder import rebuild_row_latest
from edgefarm.stages import Stage
from edgellm.types import Precision

PRECISIONS = [p.value for p in list(Precision)[:10]]
PLATFORMS = ["x86-cpu", "x86-h200", "orin", "thor"]
TOOLCHAINS = ["edgellm-ort", "onnxruntime-genai"]
VARIANTS = ["", "kv=fp16", "kv=fp8", "lm=fp16", "kv=fp16;lm=fp16"]
STAGES = [s.value for s in (Stage.EXPORT, Stage.BUILD, Stage.INFER, Stage.ACCURACY, Stage.BENCH)]
PER_MODEL = len(PRECISIONS) * len(PLATFORMS) * len(TOOLCHAINS) * len(VARIANTS)
COLS = ["run_id", "model", "precision", "platform", "job_toolchain", "variant", "stage", "test_id", "status",
        "recorded_at", "toolchain", "toolchain_version", "standin"]
# cumulative per-mille thresholds of a result's status (hash % 1000 below the bound)
_STATUS = [(930, "pass"), (950, "fail"), (960, "error"), (980, "skipped"), (990, "waived"), (1000, "not_applicable")]
STANDIN_EVERY = 97  # row i with i % 97 == 0 ran on stand-ins in every run (never evidence)


@dataclass(frozen=True)
class Shape:
    rows: int
    runs: int
    stride: int  # run r covers row i when (i + r) % stride == 0

    @classmethod
    def for_results(cls, rows: int, runs: int, results: int) -> Shape:
        for name, value in (("rows", rows), ("runs", runs), ("results", results)):
            if value < 1:
                raise ValueError(f"bad --{name} {value}: need >= 1")
        if runs < 2:
            raise ValueError(f"bad --runs {runs}: need >= 2 (the last run is unpublished)")
        return cls(rows, runs, max(1, round(rows * runs * len(STAGES) / results)))

    def keys(self) -> list[tuple[str, str, str, str, str]]:
        """Row i's (model, precision, platform, job toolchain, variant), model varying slowest."""
        models = [f"model-{m:04d}" for m in range(-(-self.rows // PER_MODEL))]
        return list(itertools.islice(itertools.product(models, PRECISIONS, PLATFORMS, TOOLCHAINS, VARIANTS),
                                     self.rows))

    def covers(self, i: int, r: int) -> bool:
        return (i + r) % self.stride == 0

    def latest_run(self, i: int) -> int | None:
        """The highest published run (1..runs-1) that covers row i."""
        r = self.runs - 1
        r -= (i + r) % self.stride
        return r if r >= 1 else None


def status(i: int, r: int, s: int) -> str:
    h = ((i * 1_000_003 + r * 7_919 + s * 104_729) * 2_654_435_761 >> 7) % 1000
    return next(name for bound, name in _STATUS if h < bound)


def expected_passing(shape: Shape) -> list[tuple[str, str, str, str, str]]:
    """The rows whose latest published run passes with the default required stages (infer, accuracy), judged from
    the generator alone (results/queries.py's rules, restated here as the oracle)."""
    out = []
    req = [STAGES.index(Stage.INFER.value), STAGES.index(Stage.ACCURACY.value)]
    for i, key in enumerate(shape.keys()):
        r = shape.latest_run(i)
        if r is None or i % STANDIN_EVERY == 0:
            continue
        sts = [status(i, r, s) for s in range(len(STAGES))]
        if any(st in ("fail", "error") for st in sts) or all(st == "not_applicable" for st in sts):
            continue
        if all(sts[s] == "pass" for s in req):  # one test id per stage: its one status must be a pass
            out.append(key)
    return sorted(out)


def _result_rows(shape: Shape, now: datetime) -> Iterator[tuple[object, ...]]:
    keys = shape.keys()
    for r in range(1, shape.runs + 1):
        for i in range((-r) % shape.stride, shape.rows, shape.stride):
            m, p, pl, tc, var = keys[i]
            test_id = f"{m}-{p}-{tc}-{var or 'default'}"
            standin = i % STANDIN_EVERY == 0
            for s, stage in enumerate(STAGES):
                yield (r, m, p, pl, tc, var, stage, test_id, status(i, r, s), now, tc, "1.0", standin)


def load(engine: Engine, shape: Shape) -> dict[str, float | int]:
    """Runs and results (PostgreSQL: COPY; SQLite: executemany), then row_latest as the recorder rebuilds it after a
    bulk load, then ANALYZE. Returns counts and the seconds each step took."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    now = datetime.now(UTC).replace(tzinfo=None)
    t0 = time.perf_counter()
    with engine.begin() as conn:
        conn.execute(
            text("INSERT INTO runs (id, kind, trigger, code_version, started_at, status, published_at) "
                 "VALUES (:id, :kind, 'bench', 'bench', :t, :status, :pub)"),
            [{"id": r, "kind": "nightly" if r % 4 == 0 else "l0",
              "t": (start + timedelta(hours=r)).replace(tzinfo=None),
              "status": "running" if r == shape.runs else "passed",
              "pub": None if r == shape.runs else (start + timedelta(hours=r + 1)).replace(tzinfo=None)}
             for r in range(1, shape.runs + 1)],
        )
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        if engine.dialect.name == "postgresql":
            with cur.copy(f"COPY results ({', '.join(COLS)}) FROM STDIN") as copy:  # type: ignore[attr-defined]
                for row in _result_rows(shape, now):
                    copy.write_row(row)
        else:
            cur.execute("BEGIN")
            cur.executemany(f"INSERT INTO results ({', '.join(COLS)}) VALUES ({', '.join('?' * len(COLS))})",
                            _result_rows(shape, now))
        raw.commit()
    finally:
        raw.close()
    t1 = time.perf_counter()
    latest = rebuild_row_latest(engine)
    t2 = time.perf_counter()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.exec_driver_sql("VACUUM ANALYZE" if engine.dialect.name == "postgresql" else "ANALYZE")
        results = int(conn.exec_driver_sql("SELECT count(*) FROM results").scalar_one())
    t3 = time.perf_counter()
    return {"rows": shape.rows, "runs": shape.runs, "stride": shape.stride, "results": results,
            "row_latest": latest, "load_results_s": round(t1 - t0, 1), "rebuild_row_latest_s": round(t2 - t1, 1),
            "vacuum_analyze_s": round(t3 - t2, 1), "load_total_s": round(t3 - t0, 1)}


def check_consistent(engine: Engine, shape: Shape) -> None:
    """row_latest holds exactly each row's latest published run (the recorder's invariant); raises if not."""
    keys = shape.keys()
    want = {keys[i]: r for i in range(shape.rows) if (r := shape.latest_run(i)) is not None}
    with engine.connect() as conn:
        got = {(m, p, pl, tc, var): run for m, p, pl, tc, var, run in conn.exec_driver_sql(
            "SELECT model, precision, platform, toolchain, variant, run_id FROM row_latest")}
    if got != want:
        bad = sorted(set(got.items()) ^ set(want.items()))[:5]
        raise AssertionError(f"row_latest disagrees with the loaded runs ({len(got)} vs {len(want)} rows): {bad}")
