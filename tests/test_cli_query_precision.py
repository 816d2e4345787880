"""``edgefarm query --precision P --status S``: each filter is parsed once, at the command line's boundary, and what
goes on to the database's query and to the regressions is the typed value (a ``Precision``, a ``SupportStatus``),
never a string to parse again; a bad value is one clear error (exit 2) before the database is read."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from edgefarm import cli, results
from edgefarm.cli import app, query  # noqa: F401  (cli.query: patched below)
from edgefarm.results import queries  # noqa: F401  (results.queries)
from edgefarm.results.support import SupportStatus
from edgellm.types import Precision
from tests.helpers.docs_db import build_docs_db


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("query")
    return build_docs_db(root / "edgefarm.db", root / "data")


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Every call of the command's two parsers, and every precision filter the database's query got as a string
    (to parse again) rather than a ``Precision``."""
    calls: dict[str, list[Any]] = {"precision": [], "status": [], "filter parsed again": []}
    for name, key in (("parse_precision", "precision"), ("parse_status", "status")):
        real = getattr(cli.query, name)

        def spy(value: str, real: Any = real, key: str = key) -> Any:
            calls[key].append(value)
            return real(value)
        monkeypatch.setattr(cli.query, name, spy)
    real_parse_name = results.queries.parse_name

    def parse_name(vocabulary: str, value: Any) -> Any:
        if vocabulary == "precision" and not isinstance(value, Precision):
            calls["filter parsed again"].append(value)
        return real_parse_name(vocabulary, value)
    monkeypatch.setattr(results.queries, "parse_name", parse_name)
    return calls


def _passed_on(monkeypatch: pytest.MonkeyPatch, name: str) -> dict[str, Any]:
    """The keyword arguments ``cli.query.<name>`` is called with (it still runs)."""
    seen: dict[str, Any] = {}
    real = getattr(cli.query, name)

    def spy(db_url: str, **kw: Any) -> Any:
        seen.update(kw)
        return real(db_url, **kw)
    monkeypatch.setattr(cli.query, name, spy)
    return seen


def test_a_precision_and_a_status_are_parsed_once_and_passed_on_typed(
        db_url: str, parsed: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _passed_on(monkeypatch, "query_rows")
    result = CliRunner().invoke(app, ["query", "--db", db_url, "--format", "json", "--precision", " FP32 ",
                                      "--status", "pass"])
    assert result.exit_code == 0, result.output
    assert parsed == {"precision": [" FP32 "], "status": ["pass"], "filter parsed again": []}
    assert seen["precision"] is Precision.FP32 and seen["status"] is SupportStatus.L0_COVERED
    rows = json.loads(result.stdout)
    assert {(r["model"], r["precision"], r["platform"], r["status"]) for r in rows} == {
        ("stories260K", "fp32", "x86-cpu", "l0_covered")}


def test_the_regressions_get_the_parsed_precision(db_url: str, parsed: dict[str, list[Any]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _passed_on(monkeypatch, "regression_rows")
    result = CliRunner().invoke(app, ["query", "--db", db_url, "--format", "json", "--regressions",
                                      "--precision", "fp16"])
    assert result.exit_code == 0, result.output
    assert parsed == {"precision": ["fp16"], "status": [], "filter parsed again": []}
    assert seen["precision"] is Precision.FP16


@pytest.mark.parametrize(("option", "value", "said", "near"), [
    ("--precision", "fp33", "unknown precision 'fp33'", "did you mean 'fp32'"),
    ("--status", "passs", "unknown --status 'passs'", "(did you mean 'l0_covered'?)"),  # pass: l0_covered, once
])
def test_a_bad_value_is_one_clear_error_before_the_database_is_read(
        db_url: str, parsed: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch, option: str, value: str,
        said: str, near: str) -> None:
    def never(*args: Any, **kw: Any) -> Any:
        raise AssertionError("the database was read for a bad filter")
    monkeypatch.setattr(cli.query, "query_rows", never)
    result = CliRunner().invoke(app, ["query", "--db", db_url, option, value])
    assert result.exit_code == 2, result.output
    assert result.output.count(said) == 1 and near in result.output, result.output
    assert result.output.count("error") == 1, result.output
