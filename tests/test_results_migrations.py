"""Migrations on both backends: upgrade from empty, models match migrations, `edgefarm db upgrade`."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect
from typer.testing import CliRunner

from flows.cli import app
from results.db import make_engine
from results.migrate import current_revision, head_revision, schema_diff, upgrade

TABLES = {"runs", "results", "metrics", "metric_baselines", "artifact_refs", "device_health", "toolchain_versions",
          "lease_devices", "device_leases", "row_latest", "attempts", "cache_entries", "alembic_version"}


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
    from results.db import redact

    assert redact("bad url://user:pw@host") == "bad url://user:***@host"
