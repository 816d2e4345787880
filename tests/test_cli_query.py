"""``edgefarm query`` and the nightly's end table: one status vocabulary (``results.support.SupportStatus``, decided
as the pages decide it), the root-cause reason, error kind, metrics and log ids per row, filters that refuse what
names nothing (did you mean), tables that are never cut when piped, why ``--regressions`` is empty, where the data
dir was looked for, and help screens without ``<bool>``."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.store import ArtifactStore
from edgefarm.cli import app
from edgefarm.cli.query import QUERY_FIELDS, print_matrix
from edgefarm.results.db import make_engine
from edgefarm.results.recorder import Recorder
from edgefarm.results.support import SupportStatus
from tests.helpers.docs_db import _row, build_docs_db

ORT = ("edgellm-ort", "0.1.0+onnxruntime-1.22.0")
LONG = "a-very-long-model-name-" + "x" * 90  # longer than an 80-column terminal


@pytest.fixture
def farm(tmp_path: Path) -> dict[str, Any]:
    """The docs' database (l0_covered, failing, not_applicable, implemented rows) plus a waived, a skipped and a
    long-named row, and a failing quantize stage with its error kind and log in the store."""
    data = tmp_path / "data"
    data.mkdir()
    url = build_docs_db(data / "edgefarm.db", data)
    engine = make_engine(url)
    rec = Recorder(engine)
    log = ArtifactStore(data / "artifacts").put(b"quantize: calibration diverged at layer 3\n", ArtifactKind.LOG)
    run = rec.start_run("nightly", "schedule", "abc124", toolchain={"edgellm-farm": "0.1.0"})
    _row(rec, run, "tiny-llama", "fp16", "x86-cpu", dict.fromkeys(("export", "build", "infer", "accuracy"),
                                                                  "waived"),
         reason="waived until 2099-01-01 (https://bugs.example/42)")
    _row(rec, run, "tiny-llama", "fp32", "orin", dict.fromkeys(("export", "build", "infer"), "skipped"),
         reason="no orin device in the inventory", toolchain=("tensorrt-edgellm", None))
    _row(rec, run, LONG, "fp32", "x86-cpu", dict.fromkeys(("export", "build", "infer", "accuracy"), "not_applicable"),
         reason="not meant to work")
    for stage, status, kind, reason in (("quantize", "fail", "test_failure", "calibration diverged"),
                                        ("export", "skipped", None, "upstream quantize failed"),
                                        ("build", "error", "infrastructure", "later breakage")):
        rec.record_result(run, model="tiny-llama", precision="int4_awq", platform="x86-cpu", stage=stage,
                          test_id=f"t-{stage}", status=status, toolchain=ORT[0], toolchain_version=ORT[1],
                          reason=reason, error_kind=kind, artifacts=[log] if stage == "quantize" else [],
                          metrics={"quantize_s": (12.5, "s")} if stage == "quantize" else None)
    rec.finish_run(run, "failed")
    engine.dispose()
    return {"url": url, "data": data, "log": log}


def _query(farm: dict[str, Any], *args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, ["query", "--db", farm["url"], *args], env=env)


def _json(farm: dict[str, Any], *args: str) -> list[dict[str, Any]]:
    result = _query(farm, "--format", "json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _key(r: dict[str, Any]) -> tuple[str, str, str]:
    return r["model"], r["precision"], r["platform"]


def test_json_carries_the_support_status_reason_error_kind_metrics_and_logs(farm: dict[str, Any]) -> None:
    rows = {_key(r): r for r in _json(farm)}
    assert {k: r["status"] for k, r in rows.items()} == {
        ("stories260K", "fp32", "x86-cpu"): "l0_covered", ("stories260K", "fp16", "x86-cpu"): "l0_covered",
        ("tiny-qwen3", "fp32", "x86-cpu"): "failing", ("stories260K", "fp8", "orin"): "not_applicable",
        ("tiny-qwen3", "int4_awq", "orin"): "implemented", ("tiny-llama", "fp16", "x86-cpu"): "waived",
        ("tiny-llama", "fp32", "orin"): "skipped", (LONG, "fp32", "x86-cpu"): "not_applicable",
        ("tiny-llama", "int4_awq", "x86-cpu"): "failing"}
    assert all(set(QUERY_FIELDS) == set(r) for r in rows.values())
    failing = rows[("tiny-llama", "int4_awq", "x86-cpu")]
    # the root cause: the first failed stage in pipeline order, never the later error or the skip it caused
    assert failing["reason"] == "calibration diverged" and failing["error_kind"] == "test_failure"
    assert failing["failing_since_run"] == failing["run_id"]
    sha = farm["log"].sha256
    assert failing["logs"] == [{"id": f"log:{sha[:12]}", "stage": "quantize", "sha256": sha}]
    assert failing["root_cause_log"] == f"log:{sha[:12]}"
    assert all(r["root_cause_log"] is None for k, r in rows.items() if k != ("tiny-llama", "int4_awq", "x86-cpu"))
    assert failing["metrics"] == [{"stage": "quantize", "name": "quantize_s", "value": 12.5, "unit": "s"}]
    assert failing["stages"] == {"quantize": "fail", "export": "skipped", "build": "error"}
    assert rows[("tiny-llama", "fp16", "x86-cpu")]["reason"] == "waived until 2099-01-01 (https://bugs.example/42)"
    assert rows[("tiny-llama", "fp32", "orin")]["reason"] == "no orin device in the inventory"
    assert rows[("stories260K", "fp8", "orin")]["reason"] == "fp8 needs SM89+; orin is SM87"
    covered = rows[("stories260K", "fp32", "x86-cpu")]
    assert covered["reason"] is None and covered["error_kind"] is None
    assert {"stage": "bench", "name": "decode_tokens_per_s", "value": 436.5, "unit": "tok/s"} in covered["metrics"]
    # the log id the JSON gives opens the log
    shown = CliRunner().invoke(app, ["show", failing["root_cause_log"], "--data-dir", str(farm["data"])])
    assert shown.exit_code == 0 and shown.stdout == "quantize: calibration diverged at layer 3\n", shown.output


def test_csv_and_table_show_the_same_words(farm: dict[str, Any]) -> None:
    result = _query(farm, "--format", "csv", "--model", "tiny-llama")
    assert result.exit_code == 0, result.output
    rows = {(r["precision"], r["platform"]): r for r in csv.DictReader(io.StringIO(result.stdout))}
    assert {k: r["status"] for k, r in rows.items()} == {("fp16", "x86-cpu"): "waived", ("fp32", "orin"): "skipped",
                                                        ("int4_awq", "x86-cpu"): "failing"}
    failing = rows[("int4_awq", "x86-cpu")]
    assert (failing["reason"], failing["error_kind"]) == ("calibration diverged", "test_failure")
    assert failing["metrics"] == "quantize/quantize_s=12.5 s"
    assert failing["logs"] == f"quantize=log:{farm['log'].sha256[:12]}"
    table = _query(farm)
    assert table.exit_code == 0, table.output
    for word in ("l0_covered", "failing", "not_applicable", "implemented", "waived", "skipped"):
        assert word in table.stdout
    for old in ("incomplete", " pass ", "export_verified"):
        assert old not in table.stdout


def test_the_nightly_end_table_uses_the_same_words(farm: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    print_matrix(farm["url"])
    printed = capsys.readouterr().out
    assert "implemented" in printed and "failing" in printed and "l0_covered" in printed
    assert "never_tested" in printed  # a model x precision with no row on a platform: said, not blank
    assert "incomplete" not in printed and " pass " not in printed


@pytest.mark.parametrize(("given", "expected"), [
    ("export_verified", "implemented"), ("export-verified", "implemented"), ("Implemented", "implemented"),
    ("l0-covered", "l0_covered"), ("not-applicable", "not_applicable"), ("failing", "failing"),
    ("pass", "l0_covered"), ("fail", "failing"),  # what people type (issue 41)
])
def test_status_filter_takes_every_spelling(farm: dict[str, Any], given: str, expected: str) -> None:
    rows = _json(farm, "--status", given)
    assert rows and {r["status"] for r in rows} == {expected}


def test_status_filter_refuses_the_old_words(farm: dict[str, Any]) -> None:
    for bad, hint in (("incomplete", None), ("passes", None), ("failng", "failing"), ("export-verifed", "implemented")):
        result = _query(farm, "--status", bad)
        assert result.exit_code == 2, result.output
        assert f"unknown --status {bad!r}" in result.output and all(s.value in result.output for s in SupportStatus)
        if hint:
            assert f"did you mean {hint!r}" in result.output


def test_filters_refuse_names_that_match_nothing(farm: dict[str, Any]) -> None:
    model = _query(farm, "--model", "tiny-lama")
    assert model.exit_code == 2 and "unknown model 'tiny-lama' (did you mean 'tiny-llama'" in model.output
    assert "stories260K" in model.output  # the valid names listed
    platform = _query(farm, "--platform", "x86cpu")
    assert platform.exit_code == 2 and "did you mean 'x86-cpu'" in platform.output and "orin" in platform.output
    precision = _query(farm, "--precision", "fp61")
    assert precision.exit_code == 2 and "did you mean 'fp16'" in precision.output
    toolchain = _query(farm, "--toolchain", "edgellm-or")
    assert toolchain.exit_code == 2 and "edgellm-ort" in toolchain.output
    regressions = _query(farm, "--regressions", "--model", "tiny-lama")
    assert regressions.exit_code == 2 and "did you mean 'tiny-llama'" in regressions.output
    # a model only the database knows (not in the catalog) is a model; a known platform with no rows is valid
    assert [r["model"] for r in _json(farm, "--model", LONG)] == [LONG]
    assert _json(farm, "--platform", "thor") == []


def test_piped_tables_are_never_cut(farm: dict[str, Any]) -> None:
    result = _query(farm, "--platform", "x86-cpu")  # CliRunner's stdout is not a terminal, as a pipe
    assert result.exit_code == 0, result.output
    assert LONG in result.stdout and "not_applicable" in result.stdout and "…" not in result.stdout
    line = next(ln for ln in result.stdout.splitlines() if LONG in ln)
    assert "not meant to work" in line  # one line per row, for grep


def test_empty_regressions_say_why(farm: dict[str, Any]) -> None:
    result = _query(farm, "--regressions")
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "at least 3 earlier published nightly runs" in text
    assert "the rows have 1 to 2 published nightly runs each" in text


def test_from_a_subdirectory_the_missing_data_dir_is_explained(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    sub = tmp_path / "checkout" / "docs"
    sub.mkdir(parents=True)
    monkeypatch.chdir(sub)
    for name in ("EDGEFARM_DATA_DIR", "EDGEFARM_DB_URL"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["query"])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"the farm's data dir '{sub / '.data'}' does not exist" in text
    assert f"./.data relative to the current directory ('{sub}')" in text
    assert "--data-dir" in text and "EDGEFARM_DATA_DIR" in text and "cd to the checkout" in text
    named = CliRunner().invoke(app, ["query", "--data-dir", str(tmp_path / "nowhere")])
    assert named.exit_code == 2 and "because it is what --data-dir names" in " ".join(named.output.split())
    docs = CliRunner().invoke(app, ["docs"])  # the same for the command that regenerates the pages
    assert docs.exit_code == 2 and "cd to the checkout" in " ".join(docs.output.split()), docs.output
    assert not (sub / ".data").exists()  # and it made nothing there


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, cmd in group.commands.items():
        found += _commands(cmd, (*path, name)) if hasattr(cmd, "commands") else [(*path, name)]
    return found


def test_help_screens_show_flags_as_flags() -> None:
    import typer

    commands = _commands(typer.main.get_command(app))
    assert len(commands) > 15
    for path in commands:
        result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, path
        assert "--help" in result.output
    query_help = CliRunner().invoke(app, ["query", "--help"], env={"COLUMNS": "200"}).output
    assert "<str>" in query_help  # options that take a value keep their type
