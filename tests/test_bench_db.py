"""benchmarks/bench_db.py --quick end to end on the test PostgreSQL cluster: its JSON has every section, and what it
timed is the real ``passing_rows`` (same answer on the same data as the query itself, and as the generator's
oracle)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_db
from benchmarks.db_data import Shape, expected_passing
from edgefarm.results.db import make_engine
from edgefarm.results.queries import latest_status, passing_rows
from tests.fixtures.postgres import PostgresServer


def test_quick_mode_on_postgresql(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.create_database()
    out = tmp_path / "db.json"
    try:
        rc = bench_db.main(["--quick", "--postgres", url, "--backends", "postgresql", "--out", str(out)])
        report = json.loads(out.read_text())
        assert rc == (0 if report["met"] else 1)
        assert set(report) >= {"command", "machine", "shape", "targets", "met", "results"}
        assert set(report["machine"]) >= {"cpus", "loadavg_before", "loadavg_after"}
        assert [t["name"].split(" ")[0] for t in report["targets"]] == ["passing_rows", "docs_latest_status", "lease"]
        for t in report["targets"]:
            assert set(t) == {"name", "target", "measured", "met"}
            assert t["met"] == (t["measured"] <= t["target"])
        (pg,) = report["results"]
        assert pg["backend"] == "postgresql" and pg["version"]
        assert set(pg["queries"]) == {"passing_rows", "passing_rows_platform", "docs_latest_status"}
        for q in pg["queries"].values():
            assert len(q["all_ms"]) == bench_db.QUICK["repeat"] and q["median_ms"] > 0
        for query in ("passing_rows", "docs_latest_status"):  # the kept summaries, never the results
            assert "row_" in pg["plans"][query]["text"] and " on results" not in pg["plans"][query]["text"]
        assert pg["plans"]["docs_latest_status"]["execution"].startswith("Execution Time")
        assert pg["lease_contended"]["workers"] == bench_db.QUICK["workers"]
        assert pg["lease_contended"]["acquire_plus_release"]["n"] > 0
        assert pg["lease_own_devices"]["devices"] == "one per worker"
        assert pg["lease_own_devices"]["refused"] == 0  # nobody shares its device
        assert pg["lease_contended"]["server_cpu_ms_per_attempt"] is not None
        assert pg["lease_round_trips"] == {"acquire": 2, "release": 2}
        assert pg["docs_matrix_rows_once_s"] > 0 and pg["docs_matrix_rows"]["median_ms"] > 0
        assert 0 < pg["docs_matrix_rows_count"] <= pg["rows"]  # the rows whose latest nightly ran (of all rows)

        shape = Shape.for_results(bench_db.QUICK["rows"], bench_db.QUICK["runs"], bench_db.QUICK["results"])
        assert (pg["rows"], pg["runs"], pg["row_latest"]) == (shape.rows, shape.runs, shape.rows)
        assert pg["results"] == 8000
        engine = make_engine(url)  # the data the benchmark left: the query's own answer is what it timed
        got = [(k.model, str(k.precision), k.platform, str(k.toolchain), k.variant) for k in passing_rows(engine)]
        assert got == expected_passing(shape)
        assert pg["passing_rows"] == len(got) > 0
        assert pg["passing_rows_digest"] == bench_db.digest(got)
        assert len(latest_status(engine)) == pg["latest_status_rows"] == shape.rows
        engine.dispose()
    finally:
        postgres.drop_database(url.rsplit("/", 1)[1])


def test_leases_only_on_postgresql(postgres: PostgresServer, tmp_path: Path) -> None:
    """The leases without the data: no load, no query; the lease target and its round trips still reported."""
    url = postgres.create_database()
    out = tmp_path / "leases.json"
    try:
        bench_db.main(["--leases-only", "--postgres", url, "--backends", "postgresql", "--workers", "4",
                       "--cycles", "10", "--lease-n", "20", "--out", str(out)])
        report = json.loads(out.read_text())
        (pg,) = report["results"]
        assert "queries" not in pg and "plans" not in pg and "results" not in pg
        assert [t["name"].split(" ")[0] for t in report["targets"]] == ["lease"]
        assert pg["lease_round_trips"] == {"acquire": 2, "release": 2}
        assert pg["lease_contended"]["acquire_plus_release"]["n"] > 0
    finally:
        postgres.drop_database(url.rsplit("/", 1)[1])


def test_bad_flags_are_named() -> None:
    with pytest.raises(SystemExit):
        bench_db.parse(["--backends", "oracle"])
    with pytest.raises(ValueError, match="--runs 1"):
        Shape.for_results(rows=10, runs=1, results=100)
