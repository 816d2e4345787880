"""A JetPack-like board (tests/fixtures/board.py: an sshd host with a stdlib-only python3 and the STAND-IN TensorRT
Edge-LLM tools) where things go wrong the way they do on a real one, driven by the real CLI and Prefect: a missing
``llm_build``, an out-of-memory kill, a full device cache, a build of another release, a board off its benchmark
conditions. The farm's exported ONNX (NVIDIA's real exporter) reaches the board; its answers are the stand-ins' (never
evidence). One data dir (results database, artifact store, export cache) for the module; one board per test.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from edgefarm.cli import app
from edgefarm.devices import agent_client
from edgefarm.devices.transport import open_transport
from edgefarm.results import quarantine
from edgefarm.results.db import make_engine
from edgefarm.results.models import Result
from tests.fixtures.board import JetsonBoard
from tests.helpers.toolchain_env import link_real_toolchain

# NVIDIA's exporter runs are shared with the session's other modules (test_board_direct.py and
# test_board_failures.py export the same tiny-qwen3-128 fp16): tests/fixtures/toolchain_runs.py
pytestmark = pytest.mark.usefixtures("prefect_harness", "shared_toolchain_runs")
MODEL = "tiny-qwen3-128"  # head size 64: a size the TensorRT Edge-LLM attention kernels take
LIMITS = {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128}
TEST_ID = f"{MODEL}-fp16-mxsl256-mxbs2-mxil128"


@pytest.fixture(scope="module")
def farm_dir(tmp_path_factory: pytest.TempPathFactory, trt_env: Path) -> Path:
    root = tmp_path_factory.mktemp("board-failures")
    link_real_toolchain(root / "data", trt_env)
    return root


def _inventory(root: Path, board: JetsonBoard, **overrides: Any) -> Path:
    directory = root / f"inv-{board.id}"
    directory.mkdir(exist_ok=True)
    entry = {**board.inventory_entry(), **overrides}
    (directory / f"{board.id}.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    return directory


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args), env={"HF_HUB_OFFLINE": "1", "EDGEFARM_DB_URL": None,
                                                    "COLUMNS": "400"})


def _run(root: Path, inventory: Path, stages: tuple[str, ...] = ("export", "build", "infer")) -> dict[str, Any]:
    """A nightly of the one row on the board; its JSON summary."""
    matrix = root / "matrix.yml"
    matrix.write_text(yaml.safe_dump({"name": "board", "models": [MODEL], "precisions": ["fp16"],
                                      "platforms": ["orin"], "defaults": {**LIMITS, "stages": list(stages)}}))
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


def _held(root: Path) -> dict[str, str]:
    engine = make_engine(f"sqlite:///{root / 'data' / 'edgefarm.db'}")
    try:
        return {d: q.reason for d, q in quarantine.active(engine).items()}
    finally:
        engine.dispose()


def test_a_missing_llm_build_quarantines_the_board_with_that_reason(
        make_board: Callable[..., JetsonBoard], farm_dir: Path) -> None:
    board = make_board("orin")
    board.remove_tool("llm_build")
    inventory = _inventory(farm_dir, board)
    summary = _run(farm_dir, inventory)
    build = _results(farm_dir, summary["run_id"])["build"]
    assert (build.status.value, build.error_kind.value) == ("error", "infrastructure")  # never "bug"
    assert "llm_build" in build.reason and "does not exist" in build.reason, build.reason
    reason = _held(farm_dir)[board.id]
    assert "tool llm_build" in reason and "not installed as the inventory says" in reason
    checked = _invoke("devices", "check", "--inventory", str(inventory))
    assert checked.exit_code == 1 and "unhealthy" in checked.stdout and "llm_build" in checked.stdout
    assert [c for c in board.calls() if c["tool"] == "llm_build"] == []  # refused before any tool ran

    board.reset()  # the lab fixes the board: a passing check with --db releases the quarantine
    db = f"sqlite:///{farm_dir / 'data' / 'edgefarm.db'}"
    fixed = _invoke("devices", "check", "--inventory", str(inventory), "--db", db)
    assert fixed.exit_code == 0, fixed.stdout
    assert board.id not in _held(farm_dir)


def test_an_out_of_memory_kill_is_a_resource_error_with_the_memory_figures(
        make_board: Callable[..., JetsonBoard], farm_dir: Path) -> None:
    board = make_board("orin")
    board.oom_next_build()
    summary = _run(farm_dir, _inventory(farm_dir, board))
    build = _results(farm_dir, summary["run_id"])["build"]
    assert (build.status.value, build.error_kind.value) == ("error", "resource"), build.reason
    assert "out of memory" in build.reason
    assert "device memory" in build.reason and "MiB available" in build.reason
    assert "OOM killer killed llm_build" in build.reason, build.reason
    assert board.id not in _held(farm_dir)  # the job's finding, not the board's fault


def _entry(board: JetsonBoard, nbytes: int) -> str:
    """A cache entry (a sparse file named by a sha256), used now: entries made one after another are used in that
    order (the agent's last use is the latest of mtime and ctime, and ctime cannot be set back)."""
    name = os.urandom(32).hex()
    cache = board.work_dir / "cache"
    if not cache.is_dir():
        cache.mkdir(parents=True)
        subprocess.run(["chown", f"{board.user}:{board.user}", str(cache)], check=True)
    path = cache / name
    with path.open("wb") as f:
        f.truncate(nbytes)
    subprocess.run(["chown", f"{board.user}:{board.user}", str(path)], check=True)
    time.sleep(0.02)
    return name


def test_the_device_cache_stays_under_its_bound(make_board: Callable[..., JetsonBoard], farm_dir: Path) -> None:
    board = make_board("orin")
    mib = 2**20
    old = [_entry(board, 30 * mib) for _ in range(4)]  # 120 MiB, least recently used first
    bound_gb = 64 / 1024  # 64 MiB: the old entries overfill it
    inventory = _inventory(farm_dir, board, cache_max_gb=bound_gb)
    summary = _run(farm_dir, inventory)
    rows = _results(farm_dir, summary["run_id"])
    assert rows["infer"].status.value == "pass", rows["infer"].reason
    device = board.device(cache_max_gb=bound_gb)
    with open_transport(device) as link:
        usage = agent_client.run(device, link, "cache", "usage", "--cache", "cache")
    assert usage["total_bytes"] <= bound_gb * 2**30, usage
    left = {e["sha256"] for e in usage["entries"]}
    assert old[0] not in left and old[1] not in left  # least recently used first
    assert old[-1] in left  # only as many as needed
    checked = _invoke("devices", "check", "--inventory", str(inventory), "--json")
    report = json.loads(checked.stdout)[0]
    assert report["cache_bytes"] <= report["cache_max_bytes"] == int(bound_gb * 2**30)


def test_a_build_of_another_release_is_refused(make_board: Callable[..., JetsonBoard], farm_dir: Path) -> None:
    board = make_board("orin")
    listed = board.toolchain_block()  # 0.11.0
    board.set_tools_version("0.12.0")  # rebuilt at another release; the inventory still says 0.11.0
    summary = _run(farm_dir, _inventory(farm_dir, board, toolchains={"tensorrt-edgellm": listed}))
    build = _results(farm_dir, summary["run_id"])["build"]
    assert (build.status.value, build.error_kind.value) == ("error", "infrastructure")
    reason = _held(farm_dir)[board.id]
    assert "is release 0.12.0" in reason and "lists it as 0.11.0" in reason, reason

    other = make_board("orin", tools_version="0.10.0")  # only a 0.10.0 build: the 0.11.0 export is not run on it
    block = {**other.toolchain_block(), "version": "0.10.0"}
    summary = _run(farm_dir, _inventory(farm_dir, other, toolchains={"tensorrt-edgellm": block}))
    # skipped at plan time: nothing runs, so no run is opened (issue 41) and the summary says why
    assert summary["run_id"] is None and summary["nothing_ran"] and summary["plan"] == {"skipped": 1}, summary
    (why,) = summary["why_nothing_ran"]
    assert "orin: skipped:" in why and "no orin device has a tensorrt-edgellm 0.11.0 build" in why
    assert f"{other.id}: 0.10.0" in why and "mismatch is refused" in why
    assert [c for c in other.calls() if c["tool"] == "llm_build"] == []


def test_a_board_off_its_benchmark_conditions_is_recorded_as_such(
        make_board: Callable[..., JetsonBoard], farm_dir: Path) -> None:
    board = make_board("orin")
    board.set_power_mode("MODE_15W")  # as on a real board, this also unlocks the clocks
    inventory = _inventory(farm_dir, board)
    summary = _run(farm_dir, inventory, stages=("export", "build", "bench"))
    bench = _results(farm_dir, summary["run_id"])["bench"]
    assert bench.status.value == "pass", bench.reason
    assert bench.bench_conditions == ("power mode MODE_15W (type orin benchmarks at MAXN); clocks not locked "
                                      "(jetson_clocks)")
    assert "benchmarked outside its device type's conditions" in bench.reason
    checked = _invoke("devices", "check", "--inventory", str(inventory), "--json")
    report = json.loads(checked.stdout)[0]
    assert checked.exit_code == 0 and report["healthy"] and report["power_mode"] == "MODE_15W"
    assert any("benchmarks here are recorded as off-conditions" in n for n in report["notes"])


def test_a_cached_engine_is_reused_on_its_board_and_a_full_disk_fails_inference(
        make_board: Callable[..., JetsonBoard], farm_dir: Path) -> None:
    board = make_board("orin")
    inventory = _inventory(farm_dir, board)
    first = _results(farm_dir, _run(farm_dir, inventory)["run_id"])
    assert first["infer"].status.value == "pass", first["infer"].reason
    builds = len([c for c in board.calls() if c["tool"] == "llm_build"])
    board.disk_full()  # llm_inference still exits 0, its output file left empty (writes unchecked, as the real one)
    second = _results(farm_dir, _run(farm_dir, inventory)["run_id"])
    assert second["build"].status.value == "pass" and "cache hit" in second["build"].reason  # still on the board
    assert len([c for c in board.calls() if c["tool"] == "llm_build"]) == builds  # not built again
    infer = second["infer"]
    assert (infer.status.value, infer.error_kind.value) == ("fail", "test_failure"), infer.reason
    assert "exited 0 but its output file is not JSON" in infer.reason


def test_the_fetch_engines_policy_brings_the_engine_bytes_back(make_board: Callable[..., JetsonBoard],
                                                                tmp_path: Path, trt_env: Path) -> None:
    """By default no engine byte crosses back (tests/test_board_pipeline.py); EDGEFARM_FETCH_ENGINES=1 asks for them:
    the sealed engine is fetched whole and stored, its manifest names the stored copy."""
    from edgefarm.artifacts.kinds import ArtifactKind
    from edgefarm.artifacts.store import ArtifactStore
    from edgefarm.results.models import ArtifactRecord

    link_real_toolchain(tmp_path / "data", trt_env)
    board = make_board("orin")
    inventory = _inventory(tmp_path, board)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGEFARM_FETCH_ENGINES", "1")
        summary = _run(tmp_path, inventory, stages=("export", "build"))
    build = _results(tmp_path, summary["run_id"])["build"]
    assert build.status.value == "pass", build.reason
    assert summary["transfers"][board.id]["got_names"].get("llm.engine") == 1
    engine = make_engine(f"sqlite:///{tmp_path / 'data' / 'edgefarm.db'}")
    try:
        with Session(engine) as s:
            kinds = {a.kind: a.sha256 for a in s.scalars(select(ArtifactRecord)
                                                         .where(ArtifactRecord.result_id == build.id))}
    finally:
        engine.dispose()
    store = ArtifactStore(tmp_path / "data" / "artifacts")
    manifest = json.loads(store.path(kinds[ArtifactKind.ENGINE_MANIFEST]).read_bytes())
    assert manifest["stored"] == kinds[ArtifactKind.ENGINE] and store.has(kinds[ArtifactKind.ENGINE])
