"""Hostile inputs to ``edgefarm bring-up`` (issue 40 item 14): links planted in the report directory are removed,
never written through; an oversized tokenizer.json, a directory name that is no model name and ``--layers`` past
the checkpoint's are exit 2 before any run is recorded; a rung that raises never leaves its run ``running``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.models import Run
from edgellm import ASSETS_DIR
from edgellm.config import MAX_TOKENIZER_BYTES
from edgellm.errors import ConfigurationError
from tests.helpers.foreign import make_granite

pytestmark = pytest.mark.usefixtures("prefect_harness")


@pytest.fixture
def farm(tmp_path: Path) -> dict[str, Path]:
    """A data dir, an x86-cpu inventory and a results database path, all fresh."""
    data, inventory = tmp_path / "data", tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "local-cpu.yaml").write_text(yaml.safe_dump({
        "type": "x86-cpu", "transport": "local", "work_dir": str(data / "devices" / "local-cpu"),
        "labels": ["cpu"], "max_jobs": 1}))
    return {"data": data, "inventory": inventory, "db": tmp_path / "r.db"}


def _bring_up(farm: dict[str, Path], *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bring-up", "--platforms", "x86-cpu", "--data-dir", str(farm["data"]),
                                      "--inventory", str(farm["inventory"]), "--db", f"sqlite:///{farm['db']}",
                                      *args], env={"HF_HUB_OFFLINE": "1", "EDGEFARM_DB_URL": None})
    return result.exit_code, result.output


def _runs(db: Path) -> list[str]:
    engine = create_engine(f"sqlite:///{db}")
    try:
        with Session(engine) as s:
            return [r.status.value for r in s.scalars(select(Run))]
    finally:
        engine.dispose()


def test_links_planted_in_the_report_directory_are_removed_never_written_through(farm: dict[str, Path],
                                                                                tmp_path: Path) -> None:
    ckpt = make_granite(tmp_path / "granite")  # stops at rung 2: inventory.json and closest.json are written
    victim, victim_dir = tmp_path / "victim.txt", tmp_path / "victim-dir"
    victim.write_text("precious\n")
    victim_dir.mkdir()
    (victim_dir / "keep").write_text("kept\n")
    report = tmp_path / "report"
    report.mkdir()
    for name in ("inventory.json", "closest.json", "report.json", "report.md"):
        (report / name).symlink_to(victim)
    (report / "layers").symlink_to(victim_dir, target_is_directory=True)
    code, text = _bring_up(farm, "--report", str(report), str(ckpt))
    assert code == 1, text  # stopped at the closest family, as without the links
    assert victim.read_text() == "precious\n" and (victim_dir / "keep").read_text() == "kept\n"
    assert list(victim_dir.iterdir()) == [victim_dir / "keep"]
    for name in ("inventory.json", "closest.json", "report.json", "report.md"):
        assert not (report / name).is_symlink() and (report / name).is_file(), name
    assert not (report / "layers").exists()
    assert json.loads((report / "report.json").read_text())["stopped_at"]["name"] == "closest_family"


def test_a_directory_where_the_report_writes_a_file_is_refused_before_any_run(farm: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    ckpt = shutil.copytree(ASSETS_DIR / "stories260K", tmp_path / "ckpt")
    report = tmp_path / "report"
    (report / "inventory.json").mkdir(parents=True)
    code, text = _bring_up(farm, "--report", str(report), str(ckpt))
    assert code == 2, text
    assert "inventory.json is a directory" in text and "Traceback" not in text
    assert not farm["db"].exists()


@pytest.mark.parametrize("dirname", ["-x", "--x", "a--b", "trailing-"])
def test_a_directory_name_that_is_no_model_name_is_exit_2_at_once(farm: dict[str, Path], tmp_path: Path,
                                                                  dirname: str) -> None:
    ckpt = shutil.copytree(ASSETS_DIR / "stories260K", tmp_path / dirname)
    code, text = _bring_up(farm, "--report", str(tmp_path / "report"), "--", str(ckpt))
    assert code == 2, text
    assert f"checkpoint directory {dirname!r}" in " ".join(text.split()) and "give --name" in text
    assert not farm["db"].exists() and not (tmp_path / "report").exists()


def test_an_oversized_tokenizer_is_exit_2_naming_its_size_and_the_limit(farm: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    ckpt = shutil.copytree(ASSETS_DIR / "stories260K", tmp_path / "big")
    size = MAX_TOKENIZER_BYTES + 1
    with (ckpt / "tokenizer.json").open("r+b") as f:
        f.truncate(size)  # sparse: no disk used
    code, text = _bring_up(farm, "--report", str(tmp_path / "report"), str(ckpt))
    flat = " ".join(text.split())
    assert code == 2, text
    assert f"{size} bytes" in flat and f"{MAX_TOKENIZER_BYTES}-byte limit" in flat
    assert not farm["db"].exists()


def test_the_library_refuses_an_oversized_tokenizer_before_reading_or_copying_it(tmp_path: Path) -> None:
    from edgellm.compiler.export import export_checkpoint
    from edgellm.runtime.tokenizer import TextCodec

    ckpt = shutil.copytree(ASSETS_DIR / "stories260K", tmp_path / "big")
    with (ckpt / "tokenizer.json").open("r+b") as f:
        f.truncate(MAX_TOKENIZER_BYTES + 1)
    with pytest.raises(ConfigurationError, match="byte limit"):
        TextCodec(ckpt / "tokenizer.json")
    with pytest.raises(ConfigurationError, match="byte limit"):
        export_checkpoint(ckpt, tmp_path / "onnx")
    assert not (tmp_path / "onnx").exists()


def test_layers_past_the_checkpoint_s_are_exit_2_before_any_run(farm: dict[str, Path], tmp_path: Path) -> None:
    have = json.loads((ASSETS_DIR / "stories260K" / "config.json").read_text())["num_hidden_layers"]
    code, text = _bring_up(farm, "--layers", "1000", "--report", str(tmp_path / "report"), "stories260K")
    assert code == 2, text
    assert f"--layers 1000: the checkpoint has {have} decoder layers; valid: 1..{have}" in " ".join(text.split())
    assert not farm["db"].exists()


def test_a_rung_that_raises_never_leaves_its_run_running(farm: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from edgefarm.tasks import bringup as rungs

    def refuses(*_: object) -> rungs.Rung:
        raise ConfigurationError("a value only a rung can judge")

    monkeypatch.setattr(rungs, "inventory", refuses)
    code, text = _bring_up(farm, "--report", str(tmp_path / "report"), "stories260K")
    assert code == 2 and "a value only a rung can judge" in text, text
    assert _runs(farm["db"]) == ["failed"]


def test_a_nonsense_context_length_stops_at_the_inventory_naming_it_never_a_crash(farm: dict[str, Path],
                                                                                 tmp_path: Path) -> None:
    """Issue 40 item 13: ``max_position_embeddings`` 10**15 crashed rung 6 (exit 4, a traceback, no report)."""
    ckpt = shutil.copytree(ASSETS_DIR / "stories260K", tmp_path / "long")
    config = json.loads((ckpt / "config.json").read_text())
    config["max_position_embeddings"] = 10**15
    (ckpt / "config.json").write_text(json.dumps(config))
    report = tmp_path / "report"
    code, text = _bring_up(farm, "--report", str(report), str(ckpt))
    assert code == 1 and "Traceback" not in text, text
    stopped = json.loads((report / "report.json").read_text())["stopped_at"]
    assert stopped["name"] == "inventory", stopped
    assert "key 'max_position_embeddings' = 1000000000000000: expected an integer from 1 to" in stopped["reason"]
    assert _runs(farm["db"]) == ["failed"]
