"""A rerun reuses exports and engines only when nothing they depend on changed: a changed precision, build
parameter or checkpoint byte misses the cache. Real nightly runs on the local device under the Prefect harness."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app

pytestmark = pytest.mark.usefixtures("prefect_harness")
ASSETS = Path(__file__).resolve().parents[1] / "edgellm" / "assets"


def _nightly(farm_dirs: dict[str, Path], tmp_path: Path, db: str, name: str, model: str, precision: str,
             max_seq_len: int = 256) -> dict[str, int]:
    matrix = tmp_path / f"{name}.yml"
    matrix.write_text(yaml.safe_dump({
        "name": name, "models": [model], "precisions": [precision], "platforms": ["x86-cpu"],
        "defaults": {"max_seq_len": max_seq_len, "max_batch_size": 2, "max_input_len": 128,
                     "stages": ["export", "build"]}}))
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--db", db, "--inventory",
                                      str(farm_dirs["inventory"]), "--data-dir", str(farm_dirs["data"]),
                                      "--docs-dir", str(tmp_path / "docs" / name)])
    assert result.exit_code == 0, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.stdout[result.stdout.index('{\n  "run_id"'):])
    assert summary["failed"] == [] and summary["stages"] == {"pass": 2}, summary
    return dict(summary["cache_hits"])


def test_a_changed_input_misses_the_cache(farm_dirs: dict[str, Path], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    ckpt = models / "Qwen2.5-0.5B-Instruct"  # a catalog model read from $EDGEFARM_MODELS_DIR
    shutil.copytree(ASSETS / "stories260K", ckpt)
    monkeypatch.setenv("EDGEFARM_MODELS_DIR", str(models))
    model = "Qwen/Qwen2.5-0.5B-Instruct"
    db = f"sqlite:///{tmp_path / 'cache.db'}"

    def run(name: str, precision: str = "fp32", max_seq_len: int = 256) -> dict[str, int]:
        return _nightly(farm_dirs, tmp_path, db, name, model, precision, max_seq_len)

    assert run("first") == {}
    assert run("same") == {"export": 1, "build": 1}  # nothing changed: both reused
    assert run("precision", precision="fp16") == {}  # another precision: another export and engine
    assert "build" not in run("build-params", max_seq_len=128)  # another engine limit: another engine

    weights = next(ckpt.glob("*.safetensors"))
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight
    weights.write_bytes(bytes(data))
    assert run("checkpoint-byte") == {}  # another checkpoint: nothing reused
    assert run("checkpoint-byte-again") == {"export": 1, "build": 1}
