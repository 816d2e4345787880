"""Issue 26, end to end on the local device under the real Prefect harness: ``edgefarm run --priority`` (a test
list) publishes its own page at the end of ``run_test_list`` (``docs/lists/<list>.md`` and ``.html``), shows a
waived row with its bug as a link, and leaves the nightly's pages alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app

pytestmark = pytest.mark.usefixtures("prefect_harness")
BUG = "https://github.com/NVIDIA/TensorRT-Edge-LLM/issues/1"


def test_a_list_run_publishes_its_own_page_with_its_waivers_bug(farm_dirs: dict[str, Path], tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    lists = tmp_path / "lists"
    lists.mkdir()
    defaults = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128, "stages": ["export", "build", "infer"]}
    (lists / "l0_paged.yml").write_text(yaml.safe_dump({
        "name": "l0_paged", "stage": "l0", "description": "a list's own page", "platforms": {"terms": ["x86-cpu"]},
        "defaults": defaults, "tests": [{"model": "stories260K", "precision": "fp32"},
                                        {"model": "stories260K", "precision": "fp16", "stages": ["export"]}]}))
    (lists / "waivers.yml").write_text(yaml.safe_dump({"waivers": [
        {"pattern": "stories260K-fp32-*", "platforms": ["x86-cpu"], "bug": BUG, "expires": "2099-01-01",
         "reason": "known issue"}]}))
    docs = tmp_path / "docs"
    monkeypatch.setenv("EDGEFARM_DOCS_DIR", str(docs))  # `edgefarm run` has no --docs-dir
    db = f"sqlite:///{tmp_path / 'list.db'}"
    result = CliRunner().invoke(app, ["run", "--priority", str(lists / "l0_paged.yml"), "--db", db, "--inventory",
                                      str(farm_dirs["inventory"]), "--data-dir", str(farm_dirs["data"])])
    # one row waived, one run (a list whose every row is waived opens no run and publishes no page: exit 5,
    # tests/test_prefect_truth.py)
    assert result.exit_code == 0, result.output
    html = (docs / "lists" / "l0_paged.html").read_text()
    md = (docs / "lists" / "l0_paged.md").read_text()
    assert "data-status='waived'" in html and f"<a class='bug' href='{BUG}'>bug</a>" in html
    assert f"[bug]({BUG})" in md and md.startswith("# Test list l0_paged")
    run_page = next((docs / "runs").glob("run-*.html"))
    assert "waived" in run_page.read_text()
    assert not (docs / "supported-models.md").exists()  # a list run never writes the nightly's pages


def test_a_list_whose_every_row_is_waived_runs_nothing_and_says_why(farm_dirs: dict[str, Path], tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    lists = tmp_path / "lists"
    lists.mkdir()
    (lists / "l0_waived.yml").write_text(yaml.safe_dump({
        "name": "l0_waived", "stage": "l0", "description": "all waived", "platforms": {"terms": ["x86-cpu"]},
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128, "stages": ["export"]},
        "tests": [{"model": "stories260K", "precision": "fp32"}]}))
    (lists / "waivers.yml").write_text(yaml.safe_dump({"waivers": [
        {"pattern": "stories260K-fp32-*", "platforms": ["x86-cpu"], "bug": BUG, "expires": "2099-01-01",
         "reason": "known issue"}]}))
    docs = tmp_path / "docs"
    monkeypatch.setenv("EDGEFARM_DOCS_DIR", str(docs))
    db = tmp_path / "list.db"
    result = CliRunner().invoke(app, ["run", "--priority", str(lists / "l0_waived.yml"), "--db", f"sqlite:///{db}",
                                      "--inventory", str(farm_dirs["inventory"]), "--data-dir", str(farm_dirs["data"])])
    assert result.exit_code == 5, result.output  # everything waived: nothing ran (pytest's 5, issue 26)
    assert "nothing ran (exit 5):" in result.output and "waived until 2099-01-01" in result.output
    assert not (docs / "lists" / "l0_waived.html").exists()  # no run, so no page (issue 41: no run id taken)
