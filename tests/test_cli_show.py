"""``edgefarm show``: the evidence a run page cites (``log:<sha12>``), printed escaped, tailed, extracted or
described; unknown and ambiguous ids refused with their candidates (exit 2); a corrupt blob never shown (exit 3); the
same against an S3 store (moto)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.location import open_store
from edgefarm.artifacts.store import ArtifactRef, ArtifactStore
from edgefarm.cli import app
from edgefarm.cli.show import parse_id
from edgefarm.results.db import make_engine
from edgefarm.results.migrate import upgrade
from edgefarm.results.recorder import Recorder

LOG = "step 1 ok\n\tindented\nred \x1b[31mALERT\x1b[0m\x07 done\r\n10%\r100%\nlast line\n"
TC = "edgellm-ort"


def _farm(data: Path, store: Any) -> dict[str, Any]:
    """A data dir whose database records a failing quantize stage with its log, an ONNX file and a directory."""
    data.mkdir(parents=True, exist_ok=True)
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    upgrade(engine)
    rec = Recorder(engine)
    log = store.put(LOG.encode(), ArtifactKind.LOG)
    onnx = store.put(b"\x08\x01binary onnx\x00\xff" * 100, ArtifactKind.ONNX)
    tree = data / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a.txt").write_text("hello")
    engine_dir = store.put(tree, ArtifactKind.ENGINE)
    run = rec.start_run("nightly", "schedule", "abc123", toolchain={"edgellm-farm": "0.1.0"})
    rec.record_result(run, model="tiny-llama", precision="int4_awq", platform="x86-cpu", stage="quantize",
                      test_id="q1", status="fail", toolchain=TC, toolchain_version="1", reason="calibration diverged",
                      error_kind="test_failure", artifacts=[log])
    rec.record_result(run, model="tiny-llama", precision="fp32", platform="x86-cpu", stage="export",
                      test_id="e1", status="pass", toolchain=TC, toolchain_version="1", artifacts=[onnx])
    rec.record_result(run, model="tiny-llama", precision="fp32", platform="x86-cpu", stage="build",
                      test_id="b1", status="pass", toolchain=TC, toolchain_version="1", artifacts=[engine_dir])
    rec.finish_run(run, "failed")
    engine.dispose()
    return {"log": log, "onnx": onnx, "dir": engine_dir, "run": run}


@pytest.fixture
def farm(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    data = tmp_path / "data"
    return data, _farm(data, ArtifactStore(data / "artifacts"))


def _show(data: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, ["show", *args, "--data-dir", str(data)], env=env)


def test_a_log_cited_by_a_run_page_prints_escaped(farm: tuple[Path, dict[str, Any]]) -> None:
    data, refs = farm
    sha = refs["log"].sha256
    result = _show(data, f"log:{sha[:12]}")  # exactly how the run pages cite it
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ["step 1 ok", "        indented", "red \\x1b[31mALERT\\x1b[0m\\x07 done",
                                          "10%\\r100%", "last line"]
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout  # nothing drives the terminal
    for other in (sha, f"sha256:{sha}", sha[:8], f"SHA256:{sha[:20].upper()}"):
        again = _show(data, other)
        assert again.exit_code == 0 and again.stdout == result.stdout, (other, again.output)
    tail = _show(data, f"log:{sha[:12]}", "--tail", "2")
    assert tail.exit_code == 0 and tail.stdout.splitlines() == ["10%\\r100%", "last line"]


def test_output_copies_a_file_and_unpacks_a_directory(farm: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    data, refs = farm
    got = tmp_path / "out.onnx"
    result = _show(data, f"onnx:{refs['onnx'].sha256[:12]}", "--output", str(got))
    assert result.exit_code == 0, result.output
    assert got.read_bytes() == b"\x08\x01binary onnx\x00\xff" * 100
    tree = tmp_path / "engine"
    result = _show(data, refs["dir"].sha256[:10], "-o", str(tree))
    assert result.exit_code == 0, result.output
    assert (tree / "sub" / "a.txt").read_text() == "hello"
    again = _show(data, refs["dir"].sha256[:10], "-o", str(tree))  # never over something that is there
    assert again.exit_code == 2 and "already exists" in again.output
    log = tmp_path / "q.log"
    assert _show(data, f"log:{refs['log'].sha256[:12]}", "--output", str(log)).exit_code == 0
    assert log.read_bytes() == LOG.encode()  # the raw bytes, unescaped, when written to a file


def test_a_binary_artifact_is_described_with_its_results(farm: tuple[Path, dict[str, Any]]) -> None:
    data, refs = farm
    sha = refs["onnx"].sha256
    result = _show(data, sha[:12])
    assert result.exit_code == 0, result.output
    assert "\x00" not in result.stdout and "binary onnx" not in result.stdout
    assert f"artifact sha256:{sha}" in result.stdout
    assert "kind: onnx, a file, 1.5 KiB (1500 bytes)" in result.stdout
    assert f"run {refs['run']}: tiny-llama fp32 @x86-cpu, stage export (test e1)" in result.stdout
    assert f"edgefarm show onnx:{sha[:12]} --output PATH" in result.stdout
    info = _show(data, f"log:{refs['log'].sha256[:12]}", "--info")
    assert info.exit_code == 0 and "kind: log" in info.stdout and "tiny-llama int4_awq" in info.stdout


def test_unknown_ambiguous_and_bad_ids_exit_2_naming_candidates(farm: tuple[Path, dict[str, Any]]) -> None:
    data, refs = farm
    unknown = _show(data, "log:000000000000")
    assert unknown.exit_code == 2 and "no artifact matches 'log:000000000000'" in unknown.output
    wrong_kind = _show(data, f"onnx:{refs['log'].sha256[:12]}")
    assert wrong_kind.exit_code == 2 and f"log:{refs['log'].sha256[:12]}" in wrong_kind.output
    for bad in ("log:2ff8", "xyz", "log:zz83abb115e", ""):
        r = _show(data, bad)
        assert r.exit_code == 2 and "bad artifact id" in r.output, (bad, r.output)
    typo = _show(data, f"lgo:{refs['log'].sha256[:12]}")
    assert typo.exit_code == 2 and "did you mean 'log'" in typo.output
    # two recorded artifacts sharing a prefix: refused, both named
    engine = make_engine(f"sqlite:///{data / 'edgefarm.db'}")
    rec = Recorder(engine)
    twins = [ArtifactRef("abcdef01" + c * 56, 10, ArtifactKind.LOG) for c in "12"]
    run = rec.start_run("nightly", "schedule", "abc123", toolchain={"edgellm-farm": "0.1.0"})
    for twin in twins:
        rec.record_artifact(run, twin)
    rec.finish_run(run, "passed")
    engine.dispose()
    ambiguous = _show(data, "abcdef01")
    assert ambiguous.exit_code == 2 and "ambiguous" in ambiguous.output
    assert all(t.sha256 in ambiguous.output for t in twins)
    one = _show(data, "abcdef011", "--info")  # one more digit: one of them (recorded, never stored)
    assert one.exit_code == 0 and f"artifact sha256:{twins[0].sha256}" in one.stdout and "stored: NO" in one.stdout
    gone = _show(data, "abcdef011")
    assert gone.exit_code == 2 and "is not in the artifact store" in gone.output


def test_a_corrupt_blob_is_never_shown(farm: tuple[Path, dict[str, Any]]) -> None:
    data, refs = farm
    sha = refs["log"].sha256
    blob = ArtifactStore(data / "artifacts").path(sha)
    blob.chmod(0o644)
    blob.write_bytes(b"forged evidence\n")
    result = _show(data, f"log:{sha[:12]}")
    assert result.exit_code == 3 and "corrupt" in result.output
    assert "forged evidence" not in result.stdout


def test_from_an_s3_store(tmp_path: Path, s3_env: dict[str, str], s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/farm"
    data = tmp_path / "data"
    store = open_store(url, data, environ=s3_env)
    try:
        refs = _farm(data, store)
    finally:
        store.close()
    env = {"EDGEFARM_ARTIFACTS": url}
    result = _show(data, f"log:{refs['log'].sha256[:12]}", "--tail", "1", env=env)
    assert result.exit_code == 0, result.output
    assert result.stdout == "last line\n"
    got = tmp_path / "engine"
    assert _show(data, refs["dir"].sha256, "--output", str(got), env=env).exit_code == 0
    assert (got / "sub" / "a.txt").read_text() == "hello"


def test_parse_id() -> None:
    assert parse_id("log:2FF83ABB115E") == ("log", "2ff83abb115e")
    assert parse_id(" sha256:2ff83abb ") == (None, "2ff83abb")
