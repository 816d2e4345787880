"""The SSH transport against real sshd hosts on 127.0.0.1 (tests/fixtures/sshd.py)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from edgefarm.devices.inventory import load_inventory
from edgefarm.devices.transport import TIMEOUT_EXIT_CODE, HostKeyError, open_transport
from edgefarm.devices.transport.base import transfer_counts, transfers_since
from edgefarm.devices.transport.ssh import SSHTransport
from edgellm.errors import ErrorKind, InfrastructureError
from tests.fixtures.sshd import SshHosts, free_port

MB = 1 << 20


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _dead(pid: int) -> bool:
    """Gone, or a zombie nobody reaps (PID 1 here does not reap; kill -0 succeeds on zombies)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


def _partials(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".partial-" in p.name) if directory.exists() else []


def _write_random(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_inventory_from_fixture_loads_both_pinning_styles(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    pinned = load_inventory(live_ssh_hosts.write_inventory(tmp_path / "pinned"), data_dir=tmp_path / "data")
    by_file = load_inventory(live_ssh_hosts.write_inventory(tmp_path / "kh", pin="known_hosts"),
                             data_dir=tmp_path / "data")
    assert [d.id for d in pinned] == ["dev-a", "dev-b", "dev-c"]
    for device in [*pinned, *by_file]:
        with open_transport(device) as link:
            result = link.run(["sh", "-c", 'echo "$DEVICE_NAME"'], timeout=30)
        assert result.exit_code == 0
        assert result.stdout.strip() == device.id  # really reached that host


def test_argv_is_quoted_no_injection(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = live_ssh_hosts[0]
    marker = Path(f"/tmp/edgefarm-pwned-{os.getpid()}")
    nasty = [
        "two words",
        "it's",
        'say "hi"',
        f"; touch {marker}",
        f"$(touch {marker})",
        f"`touch {marker}`",
        f"&& touch {marker} ||",
        "line\nbreak",
        "*",
        "$HOME",
        "",
    ]
    with open_transport(host.device()) as link:
        result = link.run(["printf", "%s\\0", *nasty], timeout=30, env={"X_VAL": "a b; c $(d)"})
        env_result = link.run(["sh", "-c", 'printf %s "$X_VAL"'], timeout=30, env={"X_VAL": "a b; c $(d)"})
        cwd_result = link.run(["pwd"], timeout=30, cwd="sub dir; x")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\0")[:-1] == nasty
    assert env_result.stdout == "a b; c $(d)"
    assert not marker.exists()
    assert cwd_result.exit_code == 1  # the directory does not exist: cd fails, nothing else runs
    assert "sub dir; x" in cwd_result.stderr


def test_exit_code_streams_and_log(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    log = tmp_path / "logs" / "cmd.log"
    with open_transport(live_ssh_hosts[0].device()) as link:
        seen_early: list[str] = []

        def watch() -> None:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                if log.exists() and "first" in log.read_text():
                    seen_early.append(log.read_text())
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        result = link.run(
            ["sh", "-c", "echo first; echo oops >&2; sleep 1.5; echo second; exit 3"], timeout=30, log=log
        )
        watcher.join()
    assert result.exit_code == 3 and not result.timed_out
    assert result.stdout == "first\nsecond\n"
    assert result.stderr == "oops\n"
    assert seen_early and "second" not in seen_early[0]  # the log got "first" while the command still ran
    assert set(log.read_text().split()) == {"first", "oops", "second"}


def test_timeout_kills_the_remote_process_group(live_ssh_hosts: SshHosts) -> None:
    host = live_ssh_hosts[0]
    with open_transport(host.device()) as link:
        script = "sleep 300 & echo $! > child.pid; echo $$ > shell.pid; wait"
        result = link.run(["sh", "-c", script], timeout=1.0)
        assert result.timed_out and result.exit_code == TIMEOUT_EXIT_CODE
        assert 1.0 <= result.duration < 15
        pids = [int((host.work_dir / name).read_text()) for name in ("child.pid", "shell.pid")]
        deadline = time.monotonic() + 5
        while not all(_dead(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_dead(pid) for pid in pids), pids
        assert link.run(["true"], timeout=30).exit_code == 0  # the connection is still usable


def test_background_leftovers_are_killed_when_the_command_ends(live_ssh_hosts: SshHosts) -> None:
    host = live_ssh_hosts[0]
    with open_transport(host.device()) as link:
        result = link.run(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $! > bg.pid"], timeout=30)
    assert result.exit_code == 0 and result.duration < 10
    pid = int((host.work_dir / "bg.pid").read_text())
    deadline = time.monotonic() + 5
    while not _dead(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(pid)


def test_a_client_killed_mid_command_takes_the_remote_command_with_it(live_ssh_hosts: SshHosts,
                                                                     tmp_path: Path) -> None:
    """kill -9 of the orchestrator while a stage runs on a device: sshd's session ends, and the watcher beside the
    command kills its process group (before the fix the command ran on until its own timeout)."""
    host = live_ssh_hosts[1]
    pid_file = f"victim-{os.getpid()}-{time.monotonic_ns()}.pid"
    device = host.device().model_dump_json()
    client = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\n"
         "from edgefarm.devices.inventory import Device\n"
         "from edgefarm.devices.transport.ssh import SSHTransport\n"
         "link = SSHTransport(Device.model_validate_json(sys.argv[1]))\n"
         "link.run(['sh', '-c', 'echo $$ > \"$0\"; exec sleep 300', sys.argv[2]], timeout=600)\n",
         device, pid_file], cwd=Path(__file__).parents[1])
    remote = host.work_dir / pid_file
    deadline = time.monotonic() + 60
    while not (remote.exists() and remote.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert client.poll() is None and remote.exists(), "the remote command never started"
    victim = int(remote.read_text())
    assert not _dead(victim)
    client.kill()
    client.wait()
    deadline = time.monotonic() + 15
    while not _dead(victim) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _dead(victim), "the remote command outlived the client that started it"
    remote.unlink()


def test_50mb_file_both_ways_and_directory(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = live_ssh_hosts[1]
    src = _write_random(tmp_path / "blob.bin", 50 * MB)
    tree = tmp_path / "tree"
    (tree / "sub dir" / "deeper").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / "a.txt").write_text("alpha\n")
    (tree / "sub dir" / "it's b.bin").write_bytes(os.urandom(3 * MB + 7))
    (tree / "sub dir" / "deeper" / "zero").write_bytes(b"")
    before = transfer_counts()
    with open_transport(host.device()) as link:
        link.put(src, "xfer/blob.bin")
        remote = host.work_dir / "xfer" / "blob.bin"
        assert _sha(remote) == _sha(src)
        link.get("xfer/blob.bin", tmp_path / "back" / "blob.bin")
        assert _sha(tmp_path / "back" / "blob.bin") == _sha(src)
    moved = transfers_since(before)[host.device().id]  # counted under the names that arrived, not temp names
    assert (moved.put_bytes, moved.get_bytes, moved.got_names) == (50 * MB, 50 * MB, {"blob.bin": 1})
    with open_transport(host.device()) as link:

        link.put(tree, "xfer/tree")
        (tree / "a.txt").write_text("alpha v2\n")
        link.put(tree, "xfer/tree")  # replaces the existing directory whole
        link.get("xfer/tree", tmp_path / "tree-back")
    assert (host.work_dir / "xfer" / "tree" / "a.txt").read_text() == "alpha v2\n"
    for rel in ("a.txt", "sub dir/it's b.bin", "sub dir/deeper/zero"):
        assert _sha(tmp_path / "tree-back" / rel) == _sha(tree / rel)
    assert (tmp_path / "tree-back" / "empty").is_dir()
    assert _partials(host.work_dir / "xfer") == [] and _partials(tmp_path) == []
    assert sorted(p.name for p in (host.work_dir / "xfer").iterdir()) == ["blob.bin", "tree"]


def test_wrong_host_key_is_refused_not_retryable(live_ssh_hosts: SshHosts) -> None:
    host_a, host_b = live_ssh_hosts[0], live_ssh_hosts[1]
    link = open_transport(host_a.device(host_key=host_b.host_key))
    with pytest.raises(HostKeyError) as caught:
        link.run(["true"], timeout=30)
    assert caught.value.kind is ErrorKind.CONFIGURATION  # not infrastructure: never retried
    assert "host key mismatch" in str(caught.value)
    assert f"127.0.0.1:{host_a.port}" in str(caught.value)


def test_unknown_host_in_known_hosts_is_refused(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text(f"[127.0.0.1]:1 {live_ssh_hosts[0].host_key}\n")
    link = open_transport(live_ssh_hosts[0].device(host_key=None, known_hosts=empty))
    with pytest.raises(HostKeyError, match="pins none"):
        link.run(["true"], timeout=30)


def test_unreachable_port_and_bad_key_are_infrastructure(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = live_ssh_hosts[0]
    with pytest.raises(InfrastructureError, match="unreachable") as caught:
        open_transport(host.device(port=free_port())).run(["true"], timeout=30)
    assert caught.value.kind is ErrorKind.INFRASTRUCTURE  # the only kind that is retried
    other_key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    with pytest.raises(InfrastructureError, match="authentication refused"):
        open_transport(host.device(key_file=other_key)).run(["true"], timeout=30)


def test_host_killed_mid_upload_leaves_no_file_and_cleans_up(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = live_ssh_hosts[2]
    src = tmp_path / "big.bin"
    with src.open("wb") as f:
        f.truncate(400 * MB)  # zeros: cheap to make, still sent byte by byte
    dest_dir = host.work_dir / "up"
    link = SSHTransport(host.device())
    errors: list[BaseException] = []

    def upload() -> None:
        try:
            link.put(src, "up/big.bin")
        except BaseException as err:
            errors.append(err)

    worker = threading.Thread(target=upload)
    worker.start()
    deadline = time.monotonic() + 30
    while not _partials(dest_dir) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _partials(dest_dir), "the upload never started"
    host.kill()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], InfrastructureError), errors
    assert errors[0].kind is ErrorKind.INFRASTRUCTURE
    assert not (dest_dir / "big.bin").exists()
    with pytest.raises(InfrastructureError):
        link.run(["true"], timeout=10)  # still down
    host.start()
    assert link.run(["true"], timeout=30).exit_code == 0  # reconnects
    assert _partials(dest_dir) == []  # and removed what the interrupted upload left
    link.close()


def test_host_killed_mid_download_leaves_no_local_file(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = live_ssh_hosts[2]
    with open_transport(host.device()) as link:
        assert link.run(["truncate", "-s", "400M", "down.bin"], timeout=30).exit_code == 0
    link = SSHTransport(host.device())
    dest = tmp_path / "dl" / "down.bin"
    errors: list[BaseException] = []

    def download() -> None:
        try:
            link.get("down.bin", dest)
        except BaseException as err:
            errors.append(err)

    worker = threading.Thread(target=download)
    worker.start()
    deadline = time.monotonic() + 30
    while not _partials(dest.parent) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _partials(dest.parent), "the download never started"
    host.kill()
    worker.join(timeout=60)
    assert len(errors) == 1 and isinstance(errors[0], InfrastructureError), errors
    assert not dest.exists() and _partials(dest.parent) == []
    link.close()


def test_reconnect_after_restart(live_ssh_hosts: SshHosts) -> None:
    host = live_ssh_hosts[2]
    with open_transport(host.device()) as link:
        assert link.run(["sh", "-c", 'echo "$DEVICE_NAME"'], timeout=30).stdout.strip() == host.id
        host.restart()
        again = link.run(["sh", "-c", 'echo "$DEVICE_NAME"'], timeout=30)
    assert again.exit_code == 0 and again.stdout.strip() == host.id
