"""A hostile or dying device over real sshd: unsafe names are refused, a death mid-command is infrastructure."""

from __future__ import annotations

import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest

from edgefarm.devices.transport import RemoteNameError
from edgefarm.devices.transport.base import check_remote_name, inside
from edgefarm.devices.transport.ssh import SSHTransport
from edgellm.errors import ConfigurationError, ErrorKind, InfrastructureError
from tests.fixtures.sshd import SshHost, SshHosts, _descendants, variant_host

HOSTILE_NAMES = [
    "../escape",
    "../../escape",
    "sub/../../escape",
    "/tmp/escape",
    "..",
    "bad\nname",
    "esc\x1b[31mape",
    "tab\tname",
    "caf\u00e9",
    "a//b",
    "back\\slash",
    "",
]


def test_remote_names_checked_like_openssh() -> None:
    for name in HOSTILE_NAMES:
        with pytest.raises(RemoteNameError, match="refusing the remote name"):
            check_remote_name(name, where="dev")
    for name in [
        "model.onnx",
        "model.onnx.data",
        "tokenizer.json",
        "sub/x-1_2+3=4@5,6",
        ".hidden",
        "sub dir/it's b.bin",
    ]:
        assert check_remote_name(name, where="dev") == name
    assert issubclass(RemoteNameError, ConfigurationError)  # not retried: a person must look at the device


def test_inside_refuses_a_symlink_that_leaves_the_target(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "link").symlink_to(tmp_path)
    assert inside(root, "a/b") == root / "a" / "b"
    with pytest.raises(RemoteNameError, match="outside"):
        inside(root, "link/escape")


def test_device_listing_hostile_names_writes_nothing_outside(ssh_hosts: SshHosts, tmp_path: Path) -> None:
    """The device's ``find`` lies (a PATH with planted tools, set by its sshd): every bad name is refused."""
    ssh_hosts.ensure_up()
    host = ssh_hosts[1]
    evil = host.home / f"evil-{uuid.uuid4().hex[:8]}"
    (evil / "bin").mkdir(parents=True)
    listing = evil / "listing"
    find = evil / "bin" / "find"
    find.write_text(f"#!/bin/sh\ncat {listing}\n")
    find.chmod(0o755)
    evil.chmod(0o755)
    listing.write_bytes(b"")
    listing.chmod(0o644)
    try:
        with variant_host(host, tmp_path / "sshd", {"PATH": f"{evil / 'bin'}:/usr/bin:/bin"}) as hostile:
            link = SSHTransport(hostile.device())
            assert link.run(["mkdir", "-p", "engine"], timeout=30).ok
            assert link.run(["sh", "-c", "echo hi > engine/ok.txt"], timeout=30).ok
            dest_root = tmp_path / "fetch"
            dest_root.mkdir()
            for name in [*HOSTILE_NAMES, "missing-dir/file"]:
                listing.write_bytes(f"f ok.txt\0f {name}\0".encode())
                with pytest.raises(RemoteNameError, match=r"refusing the remote name|but not its directory") as got:
                    link.get("engine", dest_root / "deep" / "engine")
                assert repr(name)[1:-1] in str(got.value) or name in str(got.value)
                assert got.value.kind is ErrorKind.CONFIGURATION  # not retried
            written = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*escape*"))
            assert written == []
            assert sorted(p.relative_to(dest_root).as_posix() for p in dest_root.rglob("*")) == []  # no partial
            listing.write_bytes(b"f ok.txt\0")  # an honest listing still works through the same device
            link.get("engine", dest_root / "deep" / "engine")
            assert (dest_root / "deep" / "engine" / "ok.txt").read_text() == "hi\n"
            link.close()
    finally:
        shutil.rmtree(evil, ignore_errors=True)


def test_real_file_named_with_a_newline_is_refused(live_ssh_hosts: SshHosts, tmp_path: Path) -> None:
    host = live_ssh_hosts[1]
    with SSHTransport(host.device()) as link:
        assert link.run(["rm", "-rf", "nl-engine"], timeout=30).ok
        assert link.run(["mkdir", "-p", "nl-engine"], timeout=30).ok
        assert link.run(["touch", "nl-engine/evil\nname", "nl-engine/ok"], timeout=30).ok
        with pytest.raises(RemoteNameError, match=r"evil\\nname"):
            link.get("nl-engine", tmp_path / "got")
    assert list(tmp_path.iterdir()) == []


def _remote_sleep_pids(host: SshHost, marker: str) -> list[int]:
    assert host.pid is not None
    found = []
    for pid in _descendants(host.pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[:2] == [b"sleep", marker.encode()]:
            found.append(pid)
    return found


def test_host_killed_while_a_command_runs_is_infrastructure(live_ssh_hosts: SshHosts) -> None:
    host = live_ssh_hosts[2]
    link = SSHTransport(host.device())
    marker = "97.5"  # a sleep no other test runs
    errors: list[BaseException] = []
    results: list[object] = []

    def command() -> None:
        try:
            results.append(link.run(["sleep", marker], timeout=120))
        except BaseException as err:
            errors.append(err)

    worker = threading.Thread(target=command)
    worker.start()
    deadline = time.monotonic() + 30
    while not _remote_sleep_pids(host, marker) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _remote_sleep_pids(host, marker), "the remote command never started"
    host.kill()  # the listener, the session and the command: a dead device mid-command
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert results == [], f"a dead device returned a result: {results}"
    assert len(errors) == 1 and isinstance(errors[0], InfrastructureError), errors
    assert errors[0].kind is ErrorKind.INFRASTRUCTURE and "sleep" in str(errors[0])
    host.start()
    link.close()
