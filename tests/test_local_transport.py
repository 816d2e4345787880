"""The local transport: real subprocesses, process-group timeouts, verified atomic copies."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from edgefarm.devices.inventory import load_inventory
from edgefarm.devices.transport import TIMEOUT_EXIT_CODE, open_transport
from edgefarm.devices.transport.local import LocalTransport
from edgefarm.flows.settings import Settings
from edgellm.errors import ConfigurationError


def _dead(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_dead(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while not _dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _dead(pid)


def test_argv_is_never_a_shell(tmp_path: Path) -> None:
    link = LocalTransport("local-test", tmp_path / "work")
    marker = tmp_path / "pwned"
    nasty = ["two words", "it's", f"; touch {marker}", f"$(touch {marker})", "*", "$HOME", ""]
    result = link.run(["printf", "%s\\0", *nasty], timeout=30)
    assert result.exit_code == 0
    assert result.stdout.split("\0")[:-1] == nasty
    assert not marker.exists()
    with pytest.raises(TypeError, match="list of strings"):
        link.run("echo hi", timeout=5)  # type: ignore[arg-type]


def test_exit_codes_env_cwd_and_log(tmp_path: Path) -> None:
    link = LocalTransport("local-test", tmp_path / "work", env={"FROM_DEVICE": "d"})
    (tmp_path / "work" / "sub").mkdir(parents=True)
    log = tmp_path / "logs" / "run.log"
    result = link.run(
        ["sh", "-c", 'echo "$FROM_DEVICE $X"; pwd; echo bad >&2; exit 5'],
        timeout=30,
        log=log,
        env={"X": "y"},
        cwd="sub",
    )
    assert result.exit_code == 5 and not result.ok and not result.timed_out
    assert result.stdout.splitlines() == ["d y", str(tmp_path / "work" / "sub")]
    assert result.stderr == "bad\n"
    assert set(log.read_text().split()) == {"d", "y", str(tmp_path / "work" / "sub"), "bad"}
    assert link.run(["no-such-program-xyz"], timeout=5).exit_code == 127
    missing = link.run(["true"], timeout=5, cwd="nope")
    assert missing.exit_code == 1 and "nope" in missing.stderr


def test_timeout_kills_the_process_group(tmp_path: Path) -> None:
    link = LocalTransport("local-test", tmp_path)
    script = "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"
    result = link.run(["sh", "-c", script], timeout=1.0)
    assert result.timed_out and result.exit_code == TIMEOUT_EXIT_CODE
    assert 1.0 <= result.duration < 10
    for name in ("child.pid", "shell.pid"):
        assert _wait_dead(int((tmp_path / name).read_text())), name


def test_background_leftovers_are_killed(tmp_path: Path) -> None:
    link = LocalTransport("local-test", tmp_path)
    result = link.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $! > bg.pid"], timeout=30)
    assert result.exit_code == 0 and result.duration < 10
    assert _wait_dead(int((tmp_path / "bg.pid").read_text()))


def test_copy_file_and_directory_atomically(tmp_path: Path) -> None:
    link = LocalTransport("local-test", tmp_path / "work")
    src = tmp_path / "blob.bin"
    src.write_bytes(os.urandom(5 << 20))
    link.put(src, "in/blob.bin")
    link.get("in/blob.bin", tmp_path / "out" / "blob.bin")
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    assert hashlib.sha256((tmp_path / "out" / "blob.bin").read_bytes()).hexdigest() == digest

    tree = tmp_path / "tree"
    (tree / "a b" / "c").mkdir(parents=True)
    (tree / "a b" / "c" / "f.txt").write_text("one")
    link.put(tree, "in/tree")
    (tree / "a b" / "c" / "f.txt").write_text("two")
    link.put(tree, "in/tree")
    assert (tmp_path / "work" / "in" / "tree" / "a b" / "c" / "f.txt").read_text() == "two"
    leftovers = [p.name for p in (tmp_path / "work" / "in").iterdir()]
    assert sorted(leftovers) == ["blob.bin", "tree"]  # no temp or old copies
    with pytest.raises(ConfigurationError, match="no such file"):
        link.put(tmp_path / "missing", "x")
    assert not (tmp_path / "work" / "x").exists()


def test_packaged_local_cpu_device_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EDGEFARM_DATA_DIR", raising=False)
    monkeypatch.delenv("EDGEFARM_INVENTORY", raising=False)
    default = Settings.resolve(create=False)  # the embedded default: ./.data, the packaged inventory
    device = load_inventory(default.inventory_dir, data_dir=default.data_dir).get("local-cpu")
    assert device.work_dir == str(tmp_path / ".data" / "devices" / "local-cpu")
    monkeypatch.setenv("EDGEFARM_DATA_DIR", str(tmp_path / "data"))
    settings = Settings.resolve()
    device = load_inventory(settings.inventory_dir, data_dir=settings.data_dir).get("local-cpu")
    assert device.work_dir == str(tmp_path / "data" / "devices" / "local-cpu")
    with open_transport(device) as link:
        result = link.run([device.interpreter, "-c", "import os; print(os.getcwd())"], timeout=60)
    assert result.stdout.strip() == device.work_dir
