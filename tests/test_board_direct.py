"""The checkpoint-direct route on a JetPack-like board (tests/fixtures/board.py) whose inventory names the direct
builder (``direct_builder``: the STAND-IN ``tensorrt-edgellm-build``), driven by the real CLI and Prefect: the engine
is built from the checkpoint (not the export) and run with it (``--checkpointDir``), every device result records the
route ``direct``, and a rerun finds the engine in the build cache under a key that names the checkpoint. Its answers
are the stand-ins' (never evidence).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.results.db import make_engine
from edgefarm.results.models import CacheEntry, Result
from tests.fixtures.board import JetsonBoard
from tests.helpers.toolchain_env import link_real_toolchain

# NVIDIA's exporter runs are shared with the session's other modules (test_board_direct.py and
# test_board_failures.py export the same tiny-qwen3-128 fp16): tests/fixtures/toolchain_runs.py
pytestmark = pytest.mark.usefixtures("prefect_harness", "shared_toolchain_runs")
MODEL = "tiny-qwen3-128"  # head size 64: a size the TensorRT Edge-LLM attention kernels take
LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}
STAGES = ("export", "build", "infer", "bench")


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"HF_HUB_OFFLINE": "1", "EDGEFARM_DB_URL": None,
                                                    "COLUMNS": "400"})


def _nightly(root: Path, inventory: Path) -> dict[str, Any]:
    matrix = root / "matrix.yml"
    matrix.write_text(yaml.safe_dump({"name": "board-direct", "models": [MODEL], "precisions": ["fp16"],
                                      "platforms": ["orin"], "defaults": {**LIMITS, "stages": list(STAGES)}}))
    result = _invoke("nightly", "--json", "--matrix", str(matrix), "--inventory", str(inventory), "--data-dir",
                     str(root / "data"), "--docs-dir", str(root / "docs"))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    text = result.stdout
    return json.JSONDecoder().raw_decode(text[text.index('{\n  "run_id"'):])[0]


def _results(root: Path, run_id: int) -> dict[str, Result]:
    engine = make_engine(f"sqlite:///{root / 'data' / 'edgefarm.db'}")
    try:
        with Session(engine) as s:
            return {str(r.stage): r for r in s.scalars(select(Result).where(Result.run_id == run_id))}
    finally:
        engine.dispose()


def _build_keys(root: Path) -> list[dict[str, Any]]:
    engine = make_engine(f"sqlite:///{root / 'data' / 'edgefarm.db'}")
    try:
        with Session(engine) as s:
            return [e.inputs for e in s.scalars(select(CacheEntry)) if (e.inputs or {}).get("stage") == "build"]
    finally:
        engine.dispose()


def test_a_direct_board_builds_from_the_checkpoint_and_runs_with_it(
        make_board: Callable[..., JetsonBoard], tmp_path_factory: pytest.TempPathFactory, trt_env: Path) -> None:
    root = tmp_path_factory.mktemp("board-direct")
    link_real_toolchain(root / "data", trt_env)
    board = make_board("orin", direct=True)
    inventory = root / "inventory"
    board.write_inventory(inventory)

    summary = _nightly(root, inventory)
    results = _results(root, summary["run_id"])
    for stage in ("build", "infer", "bench"):
        found = results[stage]
        assert (found.status.value, found.route, found.standin) == ("pass", "direct", True), (stage, found.reason)
    assert (results["export"].route, results["export"].status.value) == (None, "pass")
    assert "route direct" in results["build"].reason and "precision fp16" in results["build"].reason

    calls = board.calls()
    assert [c["tool"] for c in calls if c["tool"] == "llm_build"] == []  # the export never reached the board
    (built,) = [c for c in calls if c["tool"] == "tensorrt-edgellm-build"]
    argv = built["argv"]
    model_dir = argv[argv.index("--model-dir") + 1]
    assert model_dir.startswith("cache/") and built["rc"] == 0
    staged = board.work_dir / model_dir
    assert (staged / "config.json").is_file() and list(staged.glob("*.safetensors"))  # the checkpoint itself
    assert not (staged / "model.onnx").exists()
    runtime = [c for c in calls if c["tool"] in ("llm_inference", "llm_bench")]
    assert {c["tool"] for c in runtime} == {"llm_inference", "llm_bench"}
    for call in runtime:  # every run of the engine is given the checkpoint it reads its weights from
        assert call["argv"][-2:] == ["--checkpointDir", model_dir] and call["rc"] == 0, call

    (key,) = _build_keys(root)
    assert key["route"] == "direct" and len(key["checkpoint_sha256"]) == 64

    again = _nightly(root, inventory)  # the engine is a cache hit; its runs still stage the checkpoint
    rerun = _results(root, again["run_id"])
    assert (rerun["build"].status.value, rerun["build"].route) == ("pass", "direct")
    assert str(rerun["build"].reason).endswith("cache hit")
    assert rerun["infer"].status.value == "pass" and rerun["infer"].route == "direct"
    assert len([c for c in board.calls() if c["tool"] == "tensorrt-edgellm-build"]) == 1
