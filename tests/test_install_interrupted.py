"""A toolchain install stopped halfway (issue 24 item 11): SIGTERM or Ctrl-C kill its steps' process groups and
remove its temporary directory before the installer ends; what a killed install (kill -9) left is removed by the
next install and by ``edgefarm gc``, never what a running install is making. The package registry is a local
socket that accepts and never answers, so pip hangs where a real download would take minutes; nothing is fetched."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from edgefarm.artifacts.inuse import held_dir
from edgefarm.cli import app
from edgefarm.toolchains.tensorrt_edgellm.env import install
from edgellm.errors import InfrastructureError

REPO = Path(__file__).resolve().parents[1]
VERSION = "0.11.0"
LEFTOVERS = f".tensorrt-edgellm-{VERSION}.*"


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """An index URL whose server accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/simple"


def _pip_env(index: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": "/dev/null", "PIP_INDEX_URL": index, "PIP_RETRIES": "0",
            "PIP_DEFAULT_TIMEOUT": "120", "PYTHONPATH": str(REPO)}


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_for_pip(installer: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The installer's descendants once its pip step runs (the venv step, ensurepip included, is behind it)."""
    me = psutil.Process(installer.pid)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and installer.poll() is None:
        tree = me.children(recursive=True)
        with contextlib.suppress(psutil.Error):
            if any("pip" in p.cmdline() and "install" in p.cmdline() for p in tree):
                return tree
        time.sleep(0.1)
    raise AssertionError(f"no pip step started (installer exit {installer.poll()})")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_install_kills_its_steps_and_leaves_no_temporary_dir(sig: signal.Signals, tmp_path: Path,
                                                                       silent_registry: str) -> None:
    installer = subprocess.Popen([sys.executable, "-m", "edgefarm.cli", "toolchains", "install",
                                  f"tensorrt-edgellm=={VERSION}", "--data-dir", str(tmp_path)], cwd=REPO,
                                 env=_pip_env(silent_registry), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        tree = _wait_for_pip(installer)
        assert list((tmp_path / "toolchains").glob(LEFTOVERS))  # the environment being built
        installer.send_signal(sig)
        installer.wait(timeout=60)
        assert installer.returncode != 0
        if sig == signal.SIGTERM:
            assert installer.returncode == -signal.SIGTERM  # ends as SIGTERM does, once cleaned up
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p.cmdline()[:4] for p in tree if _alive(p)] == []
        assert list((tmp_path / "toolchains").glob(LEFTOVERS)) == []
    finally:
        if installer.poll() is None:
            installer.kill()
            installer.wait()


def _held_by_a_killed_install(root: Path) -> Path:
    """An install's temporary directory whose installer was killed with -9 while it built there."""
    code = ("import sys, time\nfrom pathlib import Path\nfrom artifacts.inuse import held_dir\n"
            f"with held_dir(Path(sys.argv[1]), '.tensorrt-edgellm-{VERSION}.') as tmp:\n"
            "    (tmp / 'bin').mkdir()\n    print(tmp, flush=True)\n    time.sleep(300)\n")
    installer = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE, text=True,
                                 cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert installer.stdout is not None
    path = Path(installer.stdout.readline().strip())
    installer.kill()
    installer.wait()
    return path


def test_the_next_install_and_gc_remove_what_killed_installs_left(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "toolchains"
    dead = _held_by_a_killed_install(root)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # refused at once: the install fails fast
    monkeypatch.setenv("PIP_RETRIES", "0")
    with held_dir(root, f".tensorrt-edgellm-{VERSION}.") as running:  # another install, still running
        with pytest.raises(InfrastructureError, match="package registry unreachable"):
            install(root, VERSION)
        assert not dead.exists() and running.is_dir()
        again = _held_by_a_killed_install(root)
        db = f"sqlite:///{tmp_path / 'edgefarm.db'}"
        assert CliRunner().invoke(app, ["db", "upgrade", "--db", db]).exit_code == 0
        result = CliRunner().invoke(app, ["gc", "--db", db, "--data-dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "1 leftover(s) of killed toolchain installs removed" in result.output
        assert not again.exists() and running.is_dir()
