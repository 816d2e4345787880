"""A board's engine cache is trusted only through the farm's own digest (issue 40 item 3), end to end: a nightly
whose engine, left in the local device's cache, had one weight byte flipped and its engine_manifest.json and cache
seal rewritten to match builds it again (no build cache hit) and passes on the new engine; the run after reuses
that one. Real nightly runs on the local device under the Prefect harness."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app

pytestmark = pytest.mark.usefixtures("prefect_harness")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def farm_dirs(tmp_path: Path) -> dict[str, Path]:
    """A data dir of this test's own: the session's local device cache holds other tests' engines (and may already
    hold this one's), and the test must know which entry its nightly made."""
    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"),
        "labels": ["cpu", "local"], "max_jobs": 2, "python": sys.executable, "env": {"PYTHONPATH": str(REPO)}}))
    return {"data": data, "inventory": inventory}


def _nightly(farm_dirs: dict[str, Path], tmp_path: Path, name: str) -> dict[str, object]:
    matrix = tmp_path / f"{name}.yml"
    matrix.write_text(yaml.safe_dump({
        "name": name, "models": ["stories260K"], "precisions": ["fp32"], "platforms": ["x86-cpu"],
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                     "stages": ["export", "build", "infer"]}}))
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--db",
                                      f"sqlite:///{tmp_path / 'r.db'}", "--inventory", str(farm_dirs["inventory"]),
                                      "--data-dir", str(farm_dirs["data"]), "--docs-dir", str(tmp_path / "docs")])
    assert result.exit_code == 0, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    assert summary["failed"] == [] and summary["stages"] == {"pass": 3}, summary
    return dict(summary)


def _engine_entries(farm_dirs: dict[str, Path]) -> list[Path]:
    cache = farm_dirs["data"] / "devices" / "local-cpu" / "cache"
    return sorted(p for p in cache.iterdir() if p.is_dir() and (p / "engine_manifest.json").is_file())


def _seal_lines(entry: Path) -> str:
    return "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  ./{p.relative_to(entry).as_posix()}\n"
                   for p in sorted(entry.rglob("*"), key=lambda p: "./" + p.relative_to(entry).as_posix())
                   if p.is_file())


def _tree_digest(entry: Path) -> str:
    """The farm's digest of an engine entry (the agent's: sha256 of its files' sha256sum lines)."""
    return hashlib.sha256(_seal_lines(entry).encode()).hexdigest()


def _tamper(entry: Path) -> None:
    """One byte of the engine's largest file flipped, and the board's own evidence made to match it."""
    target = max((p for p in entry.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.chmod(0o644)
    target.write_bytes(bytes(data))
    manifest = entry / "engine_manifest.json"
    found = json.loads(manifest.read_text())
    rel = target.relative_to(entry).as_posix()
    found["files"][rel]["sha256"] = hashlib.sha256(bytes(data)).hexdigest()
    manifest.chmod(0o644)
    manifest.write_text(json.dumps(found))
    seal = entry.parent / f"{entry.name}.sha256sums"
    seal.chmod(0o644)
    seal.write_text(_seal_lines(entry))


def test_a_tampered_cached_engine_is_built_again_never_reused(farm_dirs: dict[str, Path], tmp_path: Path) -> None:
    assert _nightly(farm_dirs, tmp_path, "first")["cache_hits"] == {}
    (entry,) = _engine_entries(farm_dirs)
    assert _tree_digest(entry) == entry.name  # the digest the farm recorded is the entry's name
    _tamper(entry)
    assert _tree_digest(entry) != entry.name
    again = _nightly(farm_dirs, tmp_path, "tampered")
    assert again["cache_hits"] == {"export": 1}, again  # the engine was not reused: built again
    for held in _engine_entries(farm_dirs):  # the tampered entry is gone: every engine left is whole again
        assert _tree_digest(held) == held.name, held
    assert _nightly(farm_dirs, tmp_path, "healed")["cache_hits"] == {"export": 1, "build": 1}
