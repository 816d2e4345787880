"""A config's context length (issue 40 item 13): nonsense (a float, 10**15) is refused by name when the checkpoint is
inspected; a real but huge one (2**20 positions on a 1 MB checkpoint) exports small, its RoPE tables bounded by the
export, and a build asking for more positions than the export holds is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from edgellm import ASSETS_DIR
from edgellm.cli import main
from edgellm.config import MAX_POSITION_EMBEDDINGS, ModelConfig
from edgellm.errors import ConfigurationError


def _with_positions(tmp_path: Path, value: object, raw: str | None = None) -> Path:
    ckpt = shutil.copytree(ASSETS_DIR / "stories260K", tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    config["max_position_embeddings"] = value
    text = json.dumps(config)
    if raw is not None:  # a literal JSON spelling (1e15) json.dumps would not write
        text = text.replace(json.dumps(value), raw)
    (ckpt / "config.json").write_text(text)
    return ckpt


@pytest.mark.parametrize(("value", "raw", "shown"), [
    (10**15, None, "1000000000000000"),
    (MAX_POSITION_EMBEDDINGS + 1, None, str(MAX_POSITION_EMBEDDINGS + 1)),
    (1e15, "1e15", "1000000000000000.0"),
])
def test_inspect_refuses_a_context_length_that_is_nonsense_by_name(tmp_path: Path, value: object, raw: str | None,
                                                                   shown: str,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = _with_positions(tmp_path, value, raw)
    assert main(["inspect", str(ckpt)]) == 2
    out, err = capsys.readouterr()
    said = " ".join((out + err).split())
    assert f"key 'max_position_embeddings' = {shown}: expected an integer" in said, said
    with pytest.raises(ConfigurationError, match="max_position_embeddings"):
        ModelConfig.load(ckpt)


def test_a_real_ten_million_position_config_is_still_taken(tmp_path: Path) -> None:
    assert ModelConfig.load(_with_positions(tmp_path, 10_000_000)).max_position_embeddings == 10_000_000


def test_a_huge_context_on_a_tiny_checkpoint_exports_small_and_builds_within_what_it_holds(tmp_path: Path) -> None:
    from edgellm.compiler.build import build_engine
    from edgellm.compiler.export import EXPORT_MAX_POSITIONS, export_checkpoint

    ckpt = _with_positions(tmp_path, 1 << 20)  # a 1 MB checkpoint; its tables followed the config: 32 MB
    manifest = export_checkpoint(ckpt, tmp_path / "onnx")
    assert manifest["rotary_positions"] == EXPORT_MAX_POSITIONS
    weights = sum(f.stat().st_size for f in (tmp_path / "onnx").iterdir())
    assert weights < 4 * 1024 * 1024, f"the export is {weights} bytes"
    with pytest.raises(ConfigurationError, match=rf"max_seq_len {EXPORT_MAX_POSITIONS + 1} exceeds the "
                                                 rf"{EXPORT_MAX_POSITIONS} positions the export's RoPE tables hold"):
        build_engine(tmp_path / "onnx", tmp_path / "engine", "ort", max_seq_len=EXPORT_MAX_POSITIONS + 1)
    assert not (tmp_path / "engine").exists()
    built = build_engine(tmp_path / "onnx", tmp_path / "engine", "ort", max_seq_len=512, max_input_len=128)
    assert built["build_params"]["max_seq_len"] == 512


def test_the_export_s_positions_are_bounded_by_its_own_limit(tmp_path: Path) -> None:
    from edgellm.compiler.export import rotary_positions

    assert rotary_positions(512) == 512
    assert rotary_positions(1 << 23, 4096) == 4096
    with pytest.raises(ConfigurationError, match="max_positions 0: expected an integer from 1 to"):
        rotary_positions(512, 0)
