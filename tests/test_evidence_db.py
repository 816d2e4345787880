"""The results database as a careless user or an attacker meets it: read commands never create or migrate it,
refuse what they cannot read with exit 3 and one line, work on a read-only copy; every error reaching the CLI
has its kind; the database password never reaches Prefect."""

from __future__ import annotations

import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import text
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import for_parameters, from_parameter, make_engine, redact
from edgefarm.results.errors import classify
from edgefarm.results.migrate import current_revision, head_revision, upgrade
from edgellm.errors import ErrorKind

READ_COMMANDS = {
    "query": lambda db, out: ["query", "--db", db, "--format", "json"],
    "docs": lambda db, out: ["docs", "--db", db, "--out", str(out)],
    "gc": lambda db, out: ["gc", "--db", db, "--data-dir", str(out)],
}


def _invoke(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.output


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_read_commands_never_create_a_mistyped_database(command: str, tmp_path: Path) -> None:
    typo = tmp_path / "edgefram.db"
    code, output = _invoke(READ_COMMANDS[command](f"sqlite:///{typo}", tmp_path / "out"))
    assert code == 2, output
    assert "does not exist" in output and str(typo) in output and "Traceback" not in output
    assert not typo.exists()


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_read_commands_refuse_a_zero_byte_database(command: str, tmp_path: Path) -> None:
    empty = tmp_path / "edgefarm.db"
    empty.touch()
    out = tmp_path / "out"
    code, output = _invoke(READ_COMMANDS[command](f"sqlite:///{empty}", out))
    assert code == 3, output
    assert "no edgefarm schema" in output and "edgefarm db upgrade" in output
    assert len(output.strip().splitlines()) == 1, output
    assert empty.stat().st_size == 0  # not migrated
    assert not (out / "supported-models.md").exists()


def _at(tmp_path: Path, revision: str) -> str:
    url = f"sqlite:///{tmp_path / 'edgefarm.db'}"
    engine = make_engine(url)
    upgrade(engine, revision)
    engine.dispose()
    return url


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_read_commands_refuse_an_older_schema_without_migrating_it(command: str, tmp_path: Path) -> None:
    url = _at(tmp_path, "0004")
    code, output = _invoke(READ_COMMANDS[command](url, tmp_path / "out"))
    assert code == 3, output
    assert "revision '0004', older" in output and "edgefarm db upgrade" in output
    engine = make_engine(url)
    assert current_revision(engine) == "0004"
    engine.dispose()


def test_read_commands_refuse_a_newer_schema_in_one_line(tmp_path: Path) -> None:
    url = _at(tmp_path, "head")
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    for command, args in READ_COMMANDS.items():
        code, output = _invoke(args(url, tmp_path / "out"))
        assert code == 3, (command, output)
        assert "revision '0099', newer than this edgefarm" in output and "Traceback" not in output


def test_a_file_that_is_not_a_database_is_infrastructure(tmp_path: Path) -> None:
    junk = tmp_path / "edgefarm.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    code, output = _invoke(["query", "--db", f"sqlite:///{junk}"])
    assert code == 3, output
    assert "file is not a database" in output and "Traceback" not in output


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(writable source dir, the same dir bind-mounted read-only): root ignores file modes, not a ro mount."""
    src, ro = tmp_path / "src", tmp_path / "ro"
    src.mkdir()
    ro.mkdir()
    subprocess.run(["mount", "--bind", str(src), str(ro)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        yield src, ro
    finally:
        subprocess.run(["umount", str(ro)], check=True)


def test_a_read_only_database_serves_reads(read_only_dir: tuple[Path, Path], tmp_path: Path) -> None:
    from edgefarm.results.recorder import Recorder

    src, ro = read_only_dir
    url = f"sqlite:///{src / 'edgefarm.db'}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "cron", "v1")
    for stage in ("infer", "accuracy"):
        rec.record_result(run, model="m", precision="fp16", platform="x86-cpu", stage=stage, test_id="t",
                          status="pass", toolchain="edgellm-ort")
    rec.finish_run(run, "passed")
    engine.dispose()
    ro_url = f"sqlite:///{ro / 'edgefarm.db'}"
    with pytest.raises(OSError, match="Read-only"):
        (ro / "probe").write_text("x")
    code, output = _invoke(["query", "--db", ro_url, "--format", "json"])
    assert code == 0, output
    assert [(r["model"], r["status"]) for r in json.loads(output)] == [("m", "l0_covered")]
    code, output = _invoke(["docs", "--db", ro_url, "--out", str(tmp_path / "docs")])
    assert code == 0, output
    assert "| m |" in (tmp_path / "docs" / "supported-models.md").read_text()
    code, output = _invoke(["gc", "--db", ro_url, "--data-dir", str(tmp_path / "data")])
    assert code == 0, output


@pytest.mark.parametrize(("exc", "kind"), [
    (OSError(errno.ENOSPC, "No space left on device", "/data/x"), ErrorKind.INFRASTRUCTURE),
    (OSError(errno.EIO, "Input/output error"), ErrorKind.INFRASTRUCTURE),
    (OSError(errno.ENOENT, "No such file or directory", "/nope"), ErrorKind.CONFIGURATION),
    (MemoryError(), ErrorKind.INFRASTRUCTURE),
    (KeyError("x"), ErrorKind.BUG),
])
def test_foreign_errors_get_their_kind(exc: BaseException, kind: ErrorKind) -> None:
    assert classify(exc).kind is kind


def test_database_and_alembic_errors_get_their_kind(tmp_path: Path) -> None:
    from alembic.util import CommandError
    from sqlalchemy.exc import IntegrityError

    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY)"))
        conn.execute(text("INSERT INTO t VALUES (1)"))
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO t VALUES (1)"))
    except IntegrityError as exc:
        assert classify(exc).kind is ErrorKind.BUG
    else:
        pytest.fail("the duplicate key was accepted")
    engine.dispose()
    engine = make_engine("postgresql+psycopg://u:pw@127.0.0.1:1/db")  # nothing listens on port 1
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        assert classify(exc).kind is ErrorKind.INFRASTRUCTURE and "pw" not in str(classify(exc))
    else:
        pytest.fail("a database nobody serves answered")
    engine.dispose()
    assert classify(CommandError("Can't locate revision identified by '0099'")).kind is ErrorKind.INFRASTRUCTURE


def test_a_redacted_parameter_needs_the_url_this_process_handed_out_or_the_configured_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from edgefarm.flows.settings import Settings
    from edgellm.errors import ConfigurationError

    url = "postgresql+psycopg://farm:s3cret@db.example:5432/edgefarm"
    shown = redact(url)
    assert "s3cret" not in shown
    with pytest.raises(ConfigurationError, match=r"password hidden.*EDGEFARM_DB_URL"):
        from_parameter(shown)
    with pytest.raises(ConfigurationError):
        from_parameter(shown, url.replace("farm:", "other:"))
    assert from_parameter(shown, url) == url  # a worker: the URL its settings read from $EDGEFARM_DB_URL
    assert from_parameter(None) is None
    assert from_parameter("sqlite:///x.db") == "sqlite:///x.db"
    monkeypatch.setenv("EDGEFARM_DB_URL", url)
    assert Settings.resolve(db=shown, create=False).db_url == url  # the settings read the environment
    monkeypatch.delenv("EDGEFARM_DB_URL")
    # the CLI hands a flow it runs in this process the hidden form; only this process can turn it back
    handed = "postgresql+psycopg://cli:t0psecret@db.example:5432/edgefarm"
    assert for_parameters(handed) == redact(handed) and "t0psecret" not in redact(handed)
    assert from_parameter(redact(handed)) == handed
    assert Settings.resolve(db=redact(handed), create=False).db_url == handed
    assert not any("t0psecret" in value for value in os.environ.values())  # nothing leaks to child processes


@pytest.mark.usefixtures("prefect_harness")
def test_the_nightly_never_hands_prefect_the_database_password(postgres, farm_dirs: dict[str, Path],
                                                               tmp_path: Path) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    url = postgres.create_database()
    assert postgres.password in url
    # the cheapest run that opens a flow run (one export on the local CPU; a run with nothing to do opens none)
    matrix = tmp_path / "export.yml"
    defaults = {"stages": ["export"], "max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}
    matrix.write_text(yaml.safe_dump({"name": "export", "models": ["stories260K"], "precisions": ["fp32"],
                                      "platforms": ["x86-cpu"], "defaults": defaults}))
    code, output = _invoke(["nightly", "--json", "--matrix", str(matrix), "--db", url, "--inventory",
                            str(farm_dirs["inventory"]), "--data-dir", str(tmp_path / "data"),
                            "--docs-dir", str(tmp_path / "docs")])
    assert code == 0, output
    assert postgres.password not in output
    with get_client(sync_client=True) as client:
        runs = [r for r in client.read_flow_runs() if r.parameters.get("matrix") == str(matrix)]
        assert len(runs) == 1
        assert runs[0].parameters["db_url"] == redact(url)
        stored = json.dumps(client.read_flow_runs(flow_run_filter=FlowRunFilter(
            id=FlowRunFilterId(any_=[runs[0].id])))[0].model_dump(mode="json"))
        logs = json.dumps([log.message for log in client.read_logs()])
    assert postgres.password not in stored and postgres.password not in logs
    for page in (tmp_path / "docs").rglob("*"):
        if page.is_file() and page.suffix in (".md", ".html"):
            assert postgres.password not in page.read_text(errors="replace"), page
    engine = make_engine(url)
    with engine.connect() as conn:
        dump = json.dumps([list(map(str, r)) for table in ("runs", "results", "toolchain_versions")
                           for r in conn.execute(text(f"SELECT * FROM {table}"))])
        assert current_revision(engine) == head_revision()  # a brand-new database is created by a run
    engine.dispose()
    assert "stories260K" in dump and postgres.password not in dump
