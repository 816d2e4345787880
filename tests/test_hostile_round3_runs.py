"""Hostile inputs, round three (issue 40): runs that hang, crash or reap the living, and a reaped run that came
back as passed. Each test replays a probe that did not hold."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _edgefarm(args: list[str], env: dict[str, str], timeout: float = 60,
              prefix: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*(prefix or []), sys.executable, "-m", "flows.cli", *args], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EDGEFARM_"))}
    env.update({"EDGEFARM_DATA_DIR": str(data), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)})
    return env


# item 9 ------------------------------------------------------------------------------------------------------------
def test_a_matrix_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """`nightly --matrix FIFO` opened the FIFO and waited for a writer forever."""
    fifo = tmp_path / "matrix.yml"
    os.mkfifo(fifo)
    done = _edgefarm(["nightly", "--matrix", str(fifo), "--data-dir", str(tmp_path / "data")], _env(tmp_path / "d"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{fifo}: is a FIFO, not a regular file" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_an_inventory_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """`devices list` over an inventory holding a FIFO named like a device file hung forever."""
    inventory = tmp_path / "inventory"
    inventory.mkdir()
    os.mkfifo(inventory / "board.yml")
    done = _edgefarm(["devices", "list", "--inventory", str(inventory)], _env(tmp_path / "d"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{inventory / 'board.yml'}: is a FIFO, not a regular file" in done.stderr, done.stderr


# item 10 -----------------------------------------------------------------------------------------------------------
def test_db_upgrade_of_a_read_only_database_is_infrastructure_naming_it(tmp_path: Path) -> None:
    """On a read-only file system (a bind mount made read-only in a user namespace: root ignores file modes)
    `db upgrade` crashed with a traceback (exit 1) opening its migration lock."""
    data = tmp_path / "data"
    env = _env(data)
    made = _edgefarm(["db", "upgrade", "--revision", "0013"], env)
    assert made.returncode == 0, made.stderr
    (data / "edgefarm.db.migrate.lock").unlink()
    read_only = ["unshare", "--map-root-user", "--mount", "sh", "-c", f'mount --bind -o ro "{data}" "{data}" && '
                 'exec "$@"', "sh"]
    done = _edgefarm(["db", "upgrade"], env, prefix=read_only)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert f"cannot migrate database 'sqlite:///{data / 'edgefarm.db'}'" in done.stderr, done.stderr
    assert "read-only" in done.stderr, done.stderr
