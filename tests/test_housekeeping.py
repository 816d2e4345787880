"""Housekeeping never touches work in progress: a running put's temp file and a running stage's fetch dir survive
``gc`` (even ``--older-than-days 0``); what killed runs left behind is removed."""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from edgefarm.artifacts.inuse import held_dir, in_use, remove_stale
from edgefarm.artifacts.store import ArtifactStore
from edgefarm.cli import app
from edgefarm.tasks.device_exec import FETCH_PREFIX, _fetch_dir, fetch_scope
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.tasks.host import FarmHostWork, sweep_dead_work

MB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def test_gc_spares_a_put_in_progress(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    src = tmp_path / "big.bin"
    with src.open("wb") as f:
        f.truncate(300 * MB)
    # the finished blob is referenced, so only the in-progress temp file is at stake: a gc landing right after the
    # put completes would otherwise (rightly) collect an unreferenced blob and race the final assertion
    sha = hashlib.sha256(bytes(300 * MB)).hexdigest()
    errors: list[BaseException] = []
    refs = []

    def put() -> None:
        try:
            refs.append(store.put(src))
        except BaseException as err:
            errors.append(err)

    worker = threading.Thread(target=put)
    worker.start()
    collections = 0
    while worker.is_alive():
        store.gc({sha}, older_than_s=0)  # `gc --older-than-days 0` in a loop while the put runs
        collections += 1
    worker.join()
    assert errors == [] and len(refs) == 1 and refs[0].sha256 == sha, errors
    assert collections > 1 and store.has(refs[0].sha256)
    assert list(store.tmp.iterdir()) == []


def test_gc_removes_what_a_dead_put_left(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    store.tmp.mkdir(parents=True)
    held, dead = store.tmp / "put-held", store.tmp / "put-dead"
    held.write_bytes(b"x")
    dead.write_bytes(b"y")
    for path in (held, dead):
        os.utime(path, (0, 0))
    with in_use(held):
        store.gc(set(), older_than_s=0)
        assert held.exists() and not dead.exists()
    store.gc(set(), older_than_s=0)
    assert not held.exists()


@pytest.fixture
def farm(tmp_path: Path) -> Iterator[Farm]:
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    (inventory / "box.yaml").write_text(f"type: x86-cpu\ntransport: local\nwork_dir: {tmp_path / 'device'}\n")
    ctx = FarmContext(run_id=1, db_url=f"sqlite:///{tmp_path / 'farm.db'}", data_dir=str(tmp_path / "data"),
                      inventory_dir=str(inventory))
    yield Farm.get(ctx)
    Farm.close(ctx)


def test_fetch_dirs_are_removed_after_the_stage_and_spared_while_it_runs(farm: Farm) -> None:
    scratch = farm.ctx.host_work_dir / "scratch"
    with fetch_scope():
        fetched = _fetch_dir(farm)
        (fetched / "engine").mkdir()
        os.utime(fetched, (0, 0))
        assert remove_stale(scratch, f"{FETCH_PREFIX}*", 0) == []  # in use: gc leaves it
        assert (fetched / "engine").is_dir()
    assert not fetched.exists()  # removed when the stage ended
    with pytest.raises(RuntimeError), fetch_scope():
        failed = _fetch_dir(farm)
        raise RuntimeError("stage crashed")
    assert not failed.exists()


def test_edgefarm_gc_removes_stale_fetch_dirs(tmp_path: Path) -> None:
    data, db = tmp_path / "data", tmp_path / "data" / "edgefarm.db"
    data.mkdir()
    assert CliRunner().invoke(app, ["db", "upgrade", "--db", f"sqlite:///{db}"]).exit_code == 0
    scratch = FarmContext(run_id=0, db_url="", data_dir=str(data), inventory_dir="").host_work_dir / "scratch"
    left = scratch / f"{FETCH_PREFIX}killedrun"
    (left / "engine").mkdir(parents=True)
    (left / "engine" / "model.onnx").write_bytes(b"gigabytes in production")
    running = scratch / f"{FETCH_PREFIX}running"
    running.mkdir()
    os.utime(left, (0, 0))
    with in_use(running):  # its stage holds it
        result = CliRunner().invoke(
            app, ["gc", "--older-than-days", "1", "--data-dir", str(data), "--db", f"sqlite:///{db}"]
        )
    assert result.exit_code == 0, result.output
    assert "1 scratch dir(s) of dead runs removed" in result.output
    assert not left.exists() and running.exists()


def _held_by_a_killed_run(data: Path) -> Path:
    """A quantize scratch dir (``FarmHostWork.scratch``) whose run was killed with -9 while it held it."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom tasks.farm import FarmContext\n"
            "from edgefarm.tasks.host import FarmHostWork\n"
            "ctx = FarmContext(run_id=1, db_url='', data_dir=sys.argv[1], inventory_dir='')\n"
            "with FarmHostWork(ctx, None, 'quantize').scratch('quantize-') as tmp:\n"
            "    (tmp / 'quantized').mkdir()\n"
            "    print(tmp, flush=True)\n"
            "    time.sleep(300)\n")
    run = subprocess.Popen([sys.executable, "-c", code, str(data)], stdout=subprocess.PIPE, text=True, cwd=REPO,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
    assert run.stdout is not None
    path = Path(run.stdout.readline().strip())
    run.kill()
    run.wait()
    return path


def test_gc_and_the_next_run_sweep_the_scratch_of_a_killed_run_never_a_live_one(tmp_path: Path) -> None:
    """issue 24 item 5: a SIGKILLed run's host/scratch/quantize-* was never removed (only fetch dirs were, by age)."""
    data, db = tmp_path / "data", tmp_path / "data" / "edgefarm.db"
    data.mkdir()
    assert CliRunner().invoke(app, ["db", "upgrade", "--db", f"sqlite:///{db}"]).exit_code == 0
    dead = _held_by_a_killed_run(data)
    ctx = FarmContext(run_id=2, db_url="", data_dir=str(data), inventory_dir="")
    assert dead.parent == ctx.scratch_dir and (dead / "quantized").is_dir()
    with FarmHostWork(ctx, None, "quantize").scratch("quantize-") as live:  # type: ignore[arg-type]
        result = CliRunner().invoke(app, ["gc", "--data-dir", str(data), "--db", f"sqlite:///{db}"])  # 14 days
        assert result.exit_code == 0, result.output
        assert "1 scratch dir(s) of dead runs removed" in result.output
        assert not dead.exists() and live.is_dir()
        again = _held_by_a_killed_run(data)
        assert sweep_dead_work(data) == [again]  # what a run does first
        assert live.is_dir()
    assert not live.exists()


def test_a_held_dir_survives_forks_made_by_other_threads(tmp_path: Path) -> None:
    """A fork that runs Python before exec (``preexec_fn``) clears the other threads' state in the child, which
    finalized their held dirs there: the child removed a running stage's fetch dir (seen as a FileNotFoundError
    reading its bench.json). The cleanup only ever runs in the owner process."""
    local = threading.local()
    held, done = threading.Event(), threading.Event()
    paths: list[Path] = []

    def stage() -> None:  # as fetch_scope keeps a stage's fetch dirs: in a thread-local list
        local.dirs = [contextlib.ExitStack()]
        paths.append(local.dirs[0].enter_context(held_dir(tmp_path, FETCH_PREFIX)))
        held.set()
        done.wait(60)
        local.dirs[0].close()

    worker = threading.Thread(target=stage)
    worker.start()
    try:
        assert held.wait(60)
        for _ in range(20):
            subprocess.run(["true"], preexec_fn=lambda: None, check=True)
        assert paths[0].is_dir()
    finally:
        done.set()
        worker.join()
    assert not paths[0].exists()  # removed by its owner when the block ended
