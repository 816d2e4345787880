from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from tests.helpers.toolchain_env import link_real_toolchain

pytestmark = pytest.mark.usefixtures("prefect_harness")


def test_smoke(make_board, trt_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    board = make_board("orin")
    inv = tmp_path / "inv"
    board.write_inventory(inv)
    data = tmp_path / "data"
    link_real_toolchain(data, trt_env)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("EDGEFARM_DB_URL", raising=False)
    matrix = tmp_path / "m.yml"
    matrix.write_text(yaml.safe_dump({"name": "smoke", "models": ["tiny-qwen3-128"], "precisions": ["fp16"],
                                      "platforms": ["orin"],
                                      "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128,
                                                   "stages": ["export", "build", "infer", "accuracy", "bench"]}}))
    result = CliRunner().invoke(app, ["nightly", "--json", "--matrix", str(matrix), "--inventory", str(inv),
                                      "--data-dir", str(data), "--docs-dir", str(tmp_path / "docs")])
    print(result.output[-6000:])
    Path("/tmp/smoke/out.txt").write_text(result.output)
    print(json.dumps(board.calls()[-3:], indent=1)[:3000])
    assert False
