"""Migrations on both backends: upgrade from empty, models match migrations, `edgefarm db upgrade`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import inspect
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import current_revision, head_revision, schema_diff, upgrade

TABLES = {"runs", "results", "metrics", "metric_baselines", "artifact_refs", "device_health", "toolchain_versions",
          "lease_devices", "device_leases", "row_latest", "row_latest_kind", "row_tallies", "attempts", "cache_entries",
          "alembic_version", "regressions", "device_quarantine", "environments", "bringup_rungs", "run_workers",
          "bisections"}


def test_upgrade_from_empty_and_models_match(db_url: str) -> None:
    engine = make_engine(db_url)
    assert current_revision(engine) is None
    assert upgrade(engine) == head_revision()
    assert set(inspect(engine).get_table_names()) == TABLES
    assert schema_diff(engine) == []
    assert upgrade(engine) == head_revision()  # idempotent
    engine.dispose()


def test_schema_diff_sees_a_drifted_database(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    with engine.begin() as conn:
        conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN stray INTEGER")
    diff = schema_diff(engine)
    assert any("stray" in repr(d) for d in diff), diff
    engine.dispose()


def test_cli_db_upgrade(db_url: str) -> None:
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", db_url])
    assert result.exit_code == 0, result.output
    assert f"revision {head_revision()}" in result.output
    engine = make_engine(db_url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_cli_db_upgrade_defaults_to_sqlite_in_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EDGEFARM_DB_URL", raising=False)
    monkeypatch.setenv("EDGEFARM_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)  # migrations are found from the package, not the cwd
    result = CliRunner().invoke(app, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "data" / "edgefarm.db").is_file()


@pytest.mark.parametrize(
    ("url", "code", "named"),
    [
        ("nosuchdb://x/y", 2, "nosuchdb"),
        ("not a url", 2, "not a url"),
        ("sqlite:////no/such/dir/x.db", 2, "/no/such/dir"),
        ("postgresql+psycopg://u:secretpw@127.0.0.1:1/db", 3, "127.0.0.1:1"),
    ],
)
def test_cli_db_upgrade_broken_url(url: str, code: int, named: str) -> None:
    result = CliRunner().invoke(app, ["db", "upgrade", "--db", url])
    assert result.exit_code == code, result.output
    assert named in result.output
    assert "secretpw" not in result.output
    assert "Traceback" not in result.output


def test_unparseable_url_is_named_without_its_password() -> None:
    from edgefarm.results.db import redact

    assert redact("bad url://user:pw@host") == "bad url://user:***@host"


def test_0004_makes_existing_rows_edgellm_ort_with_the_version_they_recorded(db_url: str) -> None:
    from sqlalchemy import text

    engine = make_engine(db_url)
    assert upgrade(engine, "0003") == "0003"
    build_inputs = {"stage": "build", "edgellm": "0.1.0", "backend": "ort", "backend_version": "1.20.1"}
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO runs (id, kind, trigger, code_version, started_at, status) "
                          "VALUES (1, 'nightly', 'cron', 'v1', :t, 'passed')"), {"t": "2026-11-01 02:00:00"})
        conn.execute(text("INSERT INTO toolchain_versions (run_id, name, version) VALUES "
                          "(1, 'edgellm-farm', '0.1.0'), (1, 'onnxruntime', '1.20.1'), (1, 'torch', '2.11')"))
        conn.execute(text("INSERT INTO results (id, run_id, model, precision, platform, stage, test_id, status, "
                          "recorded_at) VALUES (1, 1, 'm', 'fp16', 'x86-cpu', 'infer', 't', 'pass', :t)"),
                     {"t": "2026-11-01 02:01:00"})
        # rows referring to results, which 0004 rebuilds on SQLite: migrations run with foreign keys off, so
        # its DROP does not cascade to them (it did: every metric and result artifact was deleted)
        conn.execute(text("INSERT INTO metrics (result_id, name, value, unit) VALUES (1, 'ttft_ms', 3.5, 'ms')"))
        conn.execute(text("INSERT INTO artifact_refs (run_id, result_id, sha256, kind, packing, size) "
                          "VALUES (1, 1, :s, 'engine', 'tar', 10)"), {"s": "ab" * 32})
        conn.execute(text("INSERT INTO attempts (run_id, model, precision, platform, stage, test_id, status, "
                          "recorded_at) VALUES (1, 'm', 'fp16', 'x86-cpu', 'infer', 't', 'pass', :t)"),
                     {"t": "2026-11-01 02:01:00"})
        for key, inputs in (("b" * 64, build_inputs), ("e" * 64, {"stage": "export", "edgellm": "0.1.0"}),
                            ("r" * 64, {"stage": "reference", "transformers": "4.56"})):
            conn.execute(text("INSERT INTO cache_entries (key, kind, sha256, inputs, created_at, last_used_at, hits) "
                              "VALUES (:k, 'engine', :s, :i, :t, :t, 0)"),
                         {"k": key, "s": "ab" * 32, "i": json.dumps(inputs), "t": "2026-11-01 02:01:00"})
    assert upgrade(engine) == head_revision()
    with engine.connect() as conn:
        for table in ("results", "attempts"):
            assert conn.execute(text(f"SELECT toolchain, toolchain_version FROM {table}")).one() == (
                "edgellm-ort", "0.1.0+onnxruntime-1.20.1")
        cache = dict(((k, (tc, v)) for k, tc, v in conn.execute(
            text("SELECT key, toolchain, toolchain_version FROM cache_entries"))))
    assert cache == {"b" * 64: ("edgellm-ort", "0.1.0+onnxruntime-1.20.1"), "e" * 64: ("edgellm-ort", "0.1.0"),
                     "r" * 64: (None, None)}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT result_id, name, value FROM metrics")).all() == [(1, "ttft_ms", 3.5)]
        assert conn.execute(text("SELECT result_id, kind FROM artifact_refs")).all() == [(1, "engine")]
    assert schema_diff(engine) == []
    engine.dispose()


def test_connections_opening_a_brand_new_sqlite_file_together_all_get_in(tmp_path: Path) -> None:
    """The first connections to a new SQLite file race to switch it to WAL and SQLite answers the loser "database is
    locked" at once, bypassing the busy timeout (CI saw the migration test above fail so, one run in five): every
    connection must get in. 8 at a time on 100 new files (each round lost about one time in ten before)."""
    import threading

    from sqlalchemy import text

    errors: list[BaseException] = []
    for n in range(100):
        url, barrier = f"sqlite:///{tmp_path / f'new{n}.db'}", threading.Barrier(8)

        def connect(url: str = url, barrier: threading.Barrier = barrier) -> None:
            engine = make_engine(url)
            try:
                barrier.wait()
                with engine.connect() as conn:
                    assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            except BaseException as exc:
                errors.append(exc)
            finally:
                engine.dispose()

        threads = [threading.Thread(target=connect) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
    assert errors == []


def test_workers_starting_together_on_a_new_database_migrate_it_once(db_url: str) -> None:
    """Every worker of a fresh deployment runs prepare_for_run at once; all of them must find the schema at head
    (before the migration lock, PostgreSQL refused the second CREATE TABLE alembic_version)."""
    import threading

    from edgefarm.results.migrate import prepare_for_run

    barrier, errors, done = threading.Barrier(4), [], []

    def worker() -> None:
        engine = make_engine(db_url)
        try:
            barrier.wait()
            done.append(prepare_for_run(engine))
        except Exception as exc:
            errors.append(exc)
        finally:
            engine.dispose()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and done == [head_revision()] * 4
    engine = make_engine(db_url)
    assert schema_diff(engine) == []
    engine.dispose()


def test_0015_bisections_round_trip_and_downgrade(db_url: str) -> None:
    """A bisection written through ``results.bisections`` reads back as the same typed row on both backends; a run
    deleted leaves it with no run id; downgrade to 0014 drops the table, upgrade restores a matching schema."""
    from alembic import command
    from sqlalchemy import delete
    from sqlalchemy.orm import Session

    from edgefarm.results.bisections import BisectionRecord, bisections_of_run, latest_bisections, record_bisection
    from edgefarm.results.migrate import alembic_config
    from edgefarm.results.models import Run
    from edgefarm.results.recorder import Recorder

    engine = make_engine(db_url)
    upgrade(engine)
    rec = Recorder(engine)
    good, bad = rec.start_run("nightly", "cron", "v1"), rec.start_run("nightly", "cron", "v2")
    probes = [{"revision": "a" * 40, "status": "good", "seconds": 1.5}, {"revision": "b" * 40, "status": "bad",
                                                                         "seconds": 2.0}]
    given = BisectionRecord(precision="fp32", platform="x86-cpu", good_ref=str(good), bad_ref=str(bad), found=True,
                            model="tiny", checkpoint_sha256="c" * 64, good_run_id=good, bad_run_id=bad,
                            good_sha="a" * 40, bad_sha="b" * 40, first_bad="b" * 40, first_bad_subject="One <b>",
                            last_good="a" * 40, probes=probes)
    bid = record_bisection(engine, given)
    back = bisections_of_run(engine, bad)[("tiny", "fp32", "x86-cpu")]
    assert back.id == bid and back.created_at is not None
    assert back == BisectionRecord(**{**given.__dict__, "id": bid, "created_at": back.created_at})
    assert back.line() == f"first bad: {'b' * 12} One <b>"
    with Session(engine) as s, s.begin():
        s.execute(delete(Run).where(Run.id == bad))
    kept = latest_bisections(engine, [("tiny", "fp32", "x86-cpu")])[("tiny", "fp32", "x86-cpu")]
    assert (kept.id, kept.good_run_id, kept.bad_run_id) == (bid, good, None)
    cfg = alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0014")
        conn.commit()
    assert current_revision(engine) == "0014" and "bisections" not in inspect(engine).get_table_names()
    assert upgrade(engine) == head_revision()
    assert schema_diff(engine) == []
    engine.dispose()


def test_0016_a_bisection_names_its_input_and_older_rows_read_as_revision(db_url: str) -> None:
    """A toolchain-version bisection reads back with its input and says its versions; a row written before 0016
    (no ``bisected``) reads as this repository's commits; downgrade to 0015 drops the column, upgrade restores it."""
    from alembic import command
    from sqlalchemy import update
    from sqlalchemy.orm import Session

    from edgefarm.results.bisections import BisectionRecord, bisections_of_checkpoint, record_bisection
    from edgefarm.results.migrate import alembic_config
    from edgefarm.results.models import Bisection
    from edgellm.errors import ConfigurationError

    engine = make_engine(db_url)
    upgrade(engine)
    given = BisectionRecord(precision="fp16", platform="thor", good_ref="0.10.0", bad_ref="0.12.0", found=True,
                            toolchain="tensorrt-edgellm", checkpoint_sha256="c" * 64, good_sha="0.10.0",
                            bad_sha="0.12.0", first_bad="0.11.0", last_good="0.10.0", bisected="toolchain")
    bid = record_bisection(engine, given)
    [back] = bisections_of_checkpoint(engine, "c" * 64)
    assert back == BisectionRecord(**{**given.__dict__, "id": bid, "created_at": back.created_at})
    assert back.line() == "first bad: tensorrt-edgellm 0.11.0 (last good 0.10.0)"
    with Session(engine) as s, s.begin():
        s.execute(update(Bisection).where(Bisection.id == bid).values(bisected=None, toolchain="edgellm-ort",
                                                                      first_bad="a" * 40, first_bad_subject="One"))
    [old] = bisections_of_checkpoint(engine, "c" * 64)
    assert old.bisected == "revision" and old.line() == f"first bad: {'a' * 12} One"
    with pytest.raises(ConfigurationError, match="bisected input 'layers'"):
        BisectionRecord(precision="fp16", platform="thor", good_ref="a", bad_ref="b", found=False, bisected="layers")
    cfg = alembic_config()
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0015")
        conn.commit()
    assert current_revision(engine) == "0015"
    assert "bisected" not in {c["name"] for c in inspect(engine).get_columns("bisections")}
    assert upgrade(engine) == head_revision()
    assert schema_diff(engine) == []
    engine.dispose()
