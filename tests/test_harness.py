"""The test harness itself: what one test does to the process must not leak into the next test's output."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgefarm.cli import app


def test_a_warning_after_a_prefect_command_reaches_the_next_stderr_cleanly(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A command run through CliRunner imports Prefect while stderr is the runner's (closed afterwards); Prefect's
    console handler must not stay bound to it (tests/fixtures/prefect.py sets its logging up first)."""
    result = CliRunner().invoke(app, ["nightly", "--dry-run", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    capsys.readouterr()
    logging.getLogger("edgellm.accuracy").warning("a library warning after the command")
    err = capsys.readouterr().err
    assert "Logging error" not in err
