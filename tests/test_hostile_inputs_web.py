"""Hostile inputs, round two (issue 24, items 1, 2, 7, 8, 9, 10): secrets in database URLs, the served API,
hostile device answers, unbounded device output, and names that carry Rich markup, Markdown, HTML or spreadsheet
formulas. Property-based where it fits; every example is small so the file runs in seconds."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote_plus

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from flows.cli import app
from results.db import for_parameters, from_parameter, redact

SECRET = "S3cret-pw"
FEW = settings(max_examples=40, deadline=None)


def _invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "250", **(env or {})})
    return result.exit_code, result.stdout + result.stderr


# --- 1. a database password in any form of URL ------------------------------------------------------------------

PASSWORD_URLS = [
    f"postgresql+psycopg://u@db.example:5432/edgefarm?password={SECRET}",
    f"postgresql+psycopg://u@db.example:5432/edgefarm?sslmode=require&sslpassword={SECRET}",
    f"postgresql+psycopg://u@db.example/edgefarm?PGPASSWORD={SECRET}&application_name=farm",
    f"postgresql+psycopg://u:{SECRET}@db.example/edgefarm?password={SECRET}&password={SECRET}",
    f"postgresql+psycopg://u@db.example/edgefarm?pass%77ord={SECRET}",  # the key percent-encoded
    f"not a url://u@h/db?password={SECRET}&x=1",
    f"host=db.example user=u password={SECRET} dbname=edgefarm",  # libpq's keyword form
]


@pytest.mark.parametrize("url", PASSWORD_URLS)
def test_every_form_of_database_password_is_redacted_and_handed_back(url: str) -> None:
    shown = redact(url)
    assert SECRET not in shown and "***" in shown, shown
    handed = for_parameters(url)  # what a flow or task parameter carries (Prefect stores it)
    assert SECRET not in handed
    assert from_parameter(handed) == url  # this process gets the real URL back


@FEW
@given(key=st.sampled_from(["password", "sslpassword", "PGPASSWORD", "Password", "api_token", "client_secret"]),
       value=st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=6, max_size=20)
       .filter(lambda v: v.strip() == v and "***" not in v),
       other=st.sampled_from(["", "&sslmode=require", "&application_name=a%20b"]))
def test_a_secret_query_parameter_never_shows(key: str, value: str, other: str) -> None:
    url = f"postgresql+psycopg://farm@db.example:5432/edgefarm?{key}={quote_plus(value)}{other}"
    shown = redact(url)
    assert quote_plus(value) not in shown and value not in shown.split("?", 1)[1].split("&")[0]
    assert "sslmode=require" in shown if "sslmode" in other else True
    assert from_parameter(for_parameters(url)) == url


def test_query_on_an_unreachable_database_never_prints_its_password() -> None:
    code, output = _invoke("query", "--db", f"postgresql+psycopg://u@127.0.0.1:1/db?password={SECRET}")
    assert code == 3, output  # nothing listens on port 1: infrastructure
    assert SECRET not in output and "password=***" in output, output
    assert "Traceback" not in output


# --- 9. names printed through Rich ------------------------------------------------------------------------------

HOSTILE_NAMES = ["[/]", "[red]boom[/red] [link=http://evil.example]click[/link]", "x\\", "tail\\[/]",
                 "a|b\nc", "=cmd|' /C calc'!A0", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>",
                 "esc\x1b[2Jcleared", "[bold]", "[/red]"]
hostile_text = st.one_of(st.sampled_from(HOSTILE_NAMES),
                         st.text(st.sampled_from("[]/\\=|\n\x1b<>&#*_`'\"!@+-abc "), min_size=1, max_size=30))


def _rendered(*renderables: object, width: int = 400) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    console.print(*renderables)
    console.file.close()
    return console.export_text()


@FEW
@given(value=hostile_text)
def test_a_printed_value_is_shown_as_written_on_one_line(value: str) -> None:
    from flows.cli.text import cell, visible

    shown = visible(value)
    assert "\n" not in shown and "\x1b" not in shown
    assert _rendered(cell(value)) == shown + "\n"


@FEW
@given(job=hostile_text, status=hostile_text)
def test_progress_table_and_summary_print_hostile_job_names_as_written(job: str, status: str) -> None:
    from types import SimpleNamespace

    from flows.cli import commands
    from flows.cli.text import visible

    progress = commands.Progress([job], ["export"])
    progress.update(SimpleNamespace(job=job, stage="export", status=status, cached=True))
    table = _rendered(progress.table())
    assert visible(job) in table and visible(status) in table
    assert len([line for line in table.splitlines() if line.startswith("│")]) == 1  # one row, one line


def test_summary_prints_failed_job_names_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    from flows.cli import commands

    code = commands._print_summary({"run_id": 1, "plan": {}, "stages": {}, "failed": HOSTILE_NAMES})
    assert code == 1
    printed = capsys.readouterr().out
    assert "[/]" in printed and "[red]boom[/red] [link=http://evil.example]click[/link]" in printed
    assert "a|b\\nc" in printed and "\x1b" not in printed


def _hostile_db(path: Path, names: list[str]) -> str:
    from results.db import make_engine
    from results.migrate import upgrade
    from results.recorder import Recorder

    url = f"sqlite:///{path}"
    engine = make_engine(url)
    upgrade(engine)
    rec = Recorder(engine)
    run = rec.start_run("nightly", "schedule", "abc", toolchain={"edgellm-farm": "0.1.0"})
    for name in names:
        rec.record_result(run, model=name, precision="fp32", platform="x86-cpu", stage="export", test_id=name,
                          status="fail", device="local-cpu", toolchain="edgellm-ort", toolchain_version=name,
                          reason=f"reason {name}")
    rec.finish_run(run, "failed")
    engine.dispose()
    return url


def test_query_table_prints_hostile_model_names_as_written(tmp_path: Path) -> None:
    from flows.cli.text import visible

    url = _hostile_db(tmp_path / "x.db", HOSTILE_NAMES)
    code, output = _invoke("query", "--db", url)
    assert code == 0, output
    rows = [line for line in output.splitlines() if line.startswith("│")]
    assert len(rows) == len(HOSTILE_NAMES), output  # every row on one line
    for name in HOSTILE_NAMES:
        assert any(line.split("│")[1].strip() == visible(name) for line in rows), (name, output)
    assert "\x1b" not in output


def test_devices_list_prints_hostile_hosts_and_labels_as_written(tmp_path: Path) -> None:
    import yaml

    inventory = tmp_path / "inv"
    inventory.mkdir()
    (inventory / "a.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(tmp_path / "w"),
        "labels": ["[/]", "[red]boom[/red]", "[link=http://evil.example]x"]}))
    (inventory / "b.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "host": "[/]", "user": "u", "key_file": "/etc/hostname", "work_dir": "w",
        "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl"}))
    code, output = _invoke("devices", "list", "--inventory", str(inventory),
                           env={"EDGEFARM_DATA_DIR": str(tmp_path / "data"), "EDGEFARM_DB_URL": None})
    assert code == 0, output
    assert "[/], [red]boom[/red], [link=http://evil.example]x" in output and "[/]:22" in output, output
