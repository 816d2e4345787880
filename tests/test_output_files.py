"""Output files are written whole or not at all, only over a regular file, never through a planted link."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from edgellm import BUNDLED_MODEL_DIR
from edgellm.errors import ConfigurationError
from edgellm.files import atomic_output, write_json_atomic, write_text_atomic


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def _edgellm(*args: str, preexec: Callable[[], None] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgellm", *args],
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=preexec,
        check=False,
    )


def test_planted_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    out = tmp_path / "report.json"
    out.symlink_to(victim)
    with pytest.raises(ConfigurationError, match=r"report.json is a symbolic link; refusing to replace it"):
        write_json_atomic(out, {"a": 1})
    assert victim.read_text() == "precious\n" and out.is_symlink()
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "not-yet")
    with pytest.raises(ConfigurationError, match="symbolic link"):
        write_text_atomic(dangling, "x")
    assert not (tmp_path / "not-yet").exists()
    assert _leftovers(tmp_path) == []


def test_directory_and_fifo_are_refused_without_leftovers(tmp_path: Path) -> None:
    (tmp_path / "out.json").mkdir()
    with pytest.raises(ConfigurationError, match=r"out\.json is a directory"):
        write_json_atomic(tmp_path / "out.json", {})
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ConfigurationError, match="pipe is a FIFO"):
        write_text_atomic(tmp_path / "pipe", "x")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe").st_mode)
    assert _leftovers(tmp_path) == []


def test_failure_mid_write_keeps_the_old_file_and_no_temp(tmp_path: Path) -> None:
    out = tmp_path / "o.bin"
    out.write_bytes(b"old")
    out.chmod(0o640)
    with pytest.raises(RuntimeError, match="boom"), atomic_output(out) as f:
        f.write(b"new, half")
        raise RuntimeError("boom")
    assert out.read_bytes() == b"old" and _leftovers(tmp_path) == []
    write_text_atomic(out, "new")
    assert out.read_text() == "new" and stat.S_IMODE(out.stat().st_mode) == 0o640  # mode kept
    write_text_atomic(tmp_path / "fresh.txt", "x")
    assert stat.S_IMODE((tmp_path / "fresh.txt").stat().st_mode) == 0o644


@pytest.mark.parametrize("command", [["inspect", str(BUNDLED_MODEL_DIR)], ["env"], ["capabilities"]])
def test_cli_refuses_a_device_node_output_exit_2(command: list[str]) -> None:
    proc = _edgellm(*command, "--output", "/dev/null")
    assert proc.stdout == ""  # refused before anything is printed or written
    assert proc.returncode == 2, proc.stderr
    assert "output /dev/null is a character device; refusing to replace it" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_cli_output_symlink_and_directory_exit_2(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "inv.json").symlink_to(victim)
    (tmp_path / "dir.json").mkdir()
    for name, what in [("inv.json", "a symbolic link"), ("dir.json", "a directory")]:
        proc = _edgellm("inspect", str(BUNDLED_MODEL_DIR), "--output", str(tmp_path / name))
        assert proc.returncode == 2 and f"is {what}; refusing" in proc.stderr, proc.stderr
    assert victim.read_text() == "keep" and _leftovers(tmp_path) == []
    ok = _edgellm("inspect", str(BUNDLED_MODEL_DIR), "--output", str(tmp_path / "new.json"))
    assert ok.returncode == 0 and json.loads((tmp_path / "new.json").read_text())["ok"] is True


def _tiny_file_size_limit() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))


def test_storage_exhausted_is_infrastructure_exit_3(tmp_path: Path) -> None:
    """A write the machine cannot take (EFBIG under RLIMIT_FSIZE, like a full disk) is exit 3, no temp left."""
    out = tmp_path / "inv.json"
    proc = _edgellm("inspect", str(BUNDLED_MODEL_DIR), "--output", str(out), preexec=_tiny_file_size_limit)
    assert proc.returncode == 3, proc.stderr
    assert f"error (infrastructure): cannot write output {out}: File too large" in proc.stderr
    assert not out.exists() and _leftovers(tmp_path) == []
