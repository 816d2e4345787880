"""Hostile inputs, round two (issue 24, items 1, 2, 7, 8, 9, 10): secrets in database URLs, the served API,
hostile device answers, unbounded device output, and names that carry Rich markup, Markdown, HTML or spreadsheet
formulas. Property-based where it fits; every example is small so the file runs in seconds."""

from __future__ import annotations

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
