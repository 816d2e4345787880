"""A remote device over SSH (paramiko): pinned host keys, shlex-quoted argument lists, killable commands.

Each command runs on the device as ``timeout --signal=KILL T argv...`` in the background of a POSIX login
shell, which waits for it and then SIGKILLs what is left of its process group. ``timeout`` puts the command
in a process group of its own and kills that whole group when T runs out, so a timed-out command and its
children are gone even if the connection dropped. A watcher beside it SIGKILLs that group as soon as the
shell's parent (sshd's session process) is gone: an orchestrator killed mid-command, or a dropped connection,
leaves no stage process running on the device until T. The client waits T + a grace period; past that the
transport itself is stuck: InfrastructureError. One transport is used by one thread at a time.
"""

from __future__ import annotations

import contextlib
import logging
import posixpath
import select
import shlex
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import paramiko

from edgefarm.devices.inventory import Device, known_hosts_name, parse_host_key
from edgefarm.devices.transport.base import (
    MAX_KEPT_OUTPUT_BYTES,
    TIMEOUT_EXIT_CODE,
    CommandResult,
    HostKeyError,
    OutputBuffer,
    RemoteNameError,
    Transport,
    check_argv,
    check_remote_name,
    count_transfer,
    inside,
    local_tree,
    make_local_temp,
    remove_local,
    replace_local,
    sha256_file,
    temp_name,
)
from edgellm.errors import ConfigurationError, EdgeLLMError, InfrastructureError

log = logging.getLogger(__name__)

GRACE_S = 30.0  # beyond the command's own timeout, before the transport is declared stuck
KEEPALIVE_S = 15
SHA_BATCH = 200
KILLED_BY_TIMEOUT = 128 + 9
NO_EXIT_STATUS = -1  # paramiko's exit status when the session closed without sending one
WATCH_S = 1  # how often a command's watcher checks that its session is still there


def remote_command(argv: list[str], *, timeout: float, cwd: str, env: dict[str, str] | None = None) -> str:
    """The shell line sent to the device; every piece of ``argv``/``env``/``cwd`` is shlex-quoted."""
    inner = ["timeout", "--signal=KILL", f"{timeout:.3f}"]
    if env:
        bad = [k for k in env if not k.isidentifier() or not k.isascii()]
        if bad:
            raise ConfigurationError(f"invalid environment variable names {bad}; use letters, digits and _")
        inner += ["env", *(f"{k}={v}" for k, v in env.items())]
    inner += argv
    # sshd's session process (the shell's parent) exits when the connection is gone; the shell and its command
    # would not. kill -0 can be refused by a parent of another user, so /proc is asked too (devices run Linux).
    parent_alive = 'kill -0 "$PPID" 2>/dev/null || [ -d "/proc/$PPID" ]'
    return (
        f"cd -- {shlex.quote(cwd)} || exit 1; {shlex.join(inner)} & pid=$!; "
        f"(while {parent_alive}; do sleep {WATCH_S}; done; kill -KILL -- -$pid) </dev/null >/dev/null 2>&1 & "
        "watch=$!; wait $pid; rc=$?; kill -KILL -- -$pid 2>/dev/null; kill -KILL $watch 2>/dev/null; exit $rc"
    )


def _fingerprint(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _Reject(paramiko.MissingHostKeyPolicy):
    """Like RejectPolicy, with an error that says what to do."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise HostKeyError(
            f"{hostname} offers host key {_fingerprint(key)} but the inventory pins none for it: "
            "verify it on the device and set host_key or known_hosts"
        )


class SSHTransport(Transport):
    max_output_bytes = MAX_KEPT_OUTPUT_BYTES  # kept per stream of a command (devices.transport.base.OutputBuffer)

    def __init__(self, device: Device) -> None:
        if device.host is None or device.user is None or device.key_file is None:
            raise ConfigurationError(f"{device.id}: an ssh device needs host, user and key_file")
        self.device = device
        self.device_id = device.id
        self._ssh: paramiko.SSHClient | None = None
        self._sftp_client: paramiko.SFTPClient | None = None
        self._stale: set[str] = set()  # temp paths a failed upload left on the device
        self._work_dir = device.work_dir  # made absolute on connect

    # -- connection ------------------------------------------------------------------------------------------

    @property
    def _where(self) -> str:
        return f"{self.device_id} ({self.device.user}@{self.device.host}:{self.device.port})"

    def _connect(self) -> paramiko.SSHClient:
        device = self.device
        client = paramiko.SSHClient()
        keys = client.get_host_keys()
        name = known_hosts_name(device.host or "", device.port)
        if device.host_key is not None:
            pinned = parse_host_key(device.host_key)
            keys.add(name, pinned.get_name(), pinned)
        elif device.known_hosts is not None:
            keys.load(str(device.known_hosts))
        client.set_missing_host_key_policy(_Reject())
        try:
            client.connect(
                device.host or "",
                port=device.port,
                username=device.user,
                key_filename=str(device.key_file),
                look_for_keys=False,
                allow_agent=False,
                timeout=device.connect_timeout,
                banner_timeout=device.connect_timeout,
                auth_timeout=device.connect_timeout,
            )
        except paramiko.BadHostKeyException as err:
            client.close()
            raise HostKeyError(
                f"{self._where}: host key mismatch: the device offers {_fingerprint(err.key)}, the inventory "
                f"pins {_fingerprint(err.expected_key)}. Not retrying: check the device (reinstalled? someone "
                "in the middle?) and update the inventory"
            ) from None
        except HostKeyError as err:
            client.close()
            raise HostKeyError(f"{self._where}: {err}") from None
        except paramiko.AuthenticationException as err:
            client.close()
            raise InfrastructureError(
                f"{self._where}: authentication refused with key {device.key_file}: {err}"
            ) from None
        except (paramiko.SSHException, OSError, EOFError) as err:
            client.close()
            raise InfrastructureError(f"{self._where}: unreachable: {err or type(err).__name__}") from None
        transport = client.get_transport()
        assert transport is not None
        transport.set_keepalive(KEEPALIVE_S)
        return client

    def _client(self) -> paramiko.SSHClient:
        if self._ssh is not None:
            transport = self._ssh.get_transport()
            if transport is not None and transport.is_active():
                return self._ssh
            log.info("%s: connection lost, reconnecting", self._where)
            self._drop()
        client = self._connect()
        # Create the work dir, learn its absolute path, and remove what an interrupted upload left behind.
        script = 'mkdir -p -- "$1" && cd -- "$1" && pwd -P && shift && rm -rf -- "$@"'
        setup = ["sh", "-c", script, "sh", self.device.work_dir, *sorted(self._stale)]
        result = self._exec(client, setup, timeout=60, log_path=None, env=None, cwd=".")
        if not result.ok:
            client.close()
            raise InfrastructureError(
                f"{self._where}: cannot create work dir {self.device.work_dir}: {result.stderr.strip()}"
            )
        self._work_dir = result.stdout.strip()
        self._stale.clear()
        self._ssh = client
        return self._ssh

    def _sftp(self) -> paramiko.SFTPClient:
        client = self._client()
        if self._sftp_client is None:
            self._sftp_client = client.open_sftp()
        return self._sftp_client

    def _drop(self) -> None:
        for thing in (self._sftp_client, self._ssh):
            if thing is not None:
                with contextlib.suppress(Exception):
                    thing.close()
        self._sftp_client = None
        self._ssh = None

    def close(self) -> None:
        self._drop()

    @contextlib.contextmanager
    def _infra(self, what: str) -> Iterator[None]:
        """Map connection failures to InfrastructureError (and forget the connection) and SFTP refusals."""
        try:
            yield
        except EdgeLLMError:
            raise
        except (FileNotFoundError, PermissionError, FileExistsError) as err:
            raise ConfigurationError(f"{self._where}: {what}: {err}") from None
        except (paramiko.SSHException, EOFError, OSError) as err:
            self._drop()
            raise InfrastructureError(
                f"{self._where}: connection lost during {what}: {err or type(err).__name__}"
            ) from err

    def _abs(self, path: str) -> str:
        """``path`` relative to the work dir (an absolute path stays as it is)."""
        self._client()
        return posixpath.join(self._work_dir, path)

    # -- commands --------------------------------------------------------------------------------------------

    def run(
        self,
        argv: list[str],
        *,
        timeout: float,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> CommandResult:
        argv = check_argv(argv)
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        directory = self._abs(cwd if cwd is not None else ".")
        merged = {**self.device.env, **(env or {})}
        return self._exec(self._client(), argv, timeout=timeout, log_path=log, env=merged, cwd=directory)

    def _exec(
        self,
        client: paramiko.SSHClient,
        argv: list[str],
        *,
        timeout: float,
        log_path: Path | None,
        env: dict[str, str] | None,
        cwd: str,
    ) -> CommandResult:
        command = remote_command(argv, timeout=timeout, cwd=cwd, env=env)
        start = time.monotonic()
        deadline = start + timeout + GRACE_S
        out, err = OutputBuffer(self.max_output_bytes), OutputBuffer(self.max_output_bytes)
        log_file: IO[bytes] | None = None
        if log_path is not None:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            log_file = log_path.open("ab")
        try:
            with self._infra(f"running {argv[0]}"):
                transport = client.get_transport()
                if transport is None or not transport.is_active():
                    raise EOFError("not connected")
                channel = transport.open_session(timeout=self.device.connect_timeout)
                try:
                    channel.exec_command(command)
                    self._drain(channel, transport, out, err, log_file, deadline, argv)
                    code = channel.recv_exit_status()  # ready: _drain returned after exit_status_ready()
                finally:
                    channel.close()
                if code == NO_EXIT_STATUS:
                    # the session ended without an exit status: the device (or its sshd) died under the command
                    raise EOFError(f"the device ended the session before {argv[0]} reported its exit status")
        finally:
            if log_file is not None:
                log_file.close()
        duration = time.monotonic() - start
        timed_out = code == KILLED_BY_TIMEOUT and duration >= timeout
        return CommandResult(
            exit_code=TIMEOUT_EXIT_CODE if timed_out else code,
            stdout=out.text(),
            stderr=err.text(),
            duration=duration,
            timed_out=timed_out,
            stdout_dropped=out.dropped,
            stderr_dropped=err.dropped,
        )

    def _drain(
        self,
        channel: paramiko.Channel,
        transport: paramiko.Transport,
        out: OutputBuffer,
        err: OutputBuffer,
        log_file: IO[bytes] | None,
        deadline: float,
        argv: list[str],
    ) -> None:
        """Copy output as it arrives until the command's exit status and end of output are in."""
        while True:
            select.select([channel], [], [], 0.2)
            got = False
            while channel.recv_ready():
                chunk = channel.recv(65536)
                if not chunk:
                    break
                got = True
                out.extend(chunk)
                if log_file is not None:
                    log_file.write(chunk)
            while channel.recv_stderr_ready():
                chunk = channel.recv_stderr(65536)
                if not chunk:
                    break
                got = True
                err.extend(chunk)
                if log_file is not None:
                    log_file.write(chunk)
            if got and log_file is not None:
                log_file.flush()
            if channel.exit_status_ready() and (channel.eof_received or channel.closed):
                if not channel.recv_ready() and not channel.recv_stderr_ready():
                    return
            elif channel.closed or not transport.is_active():
                raise EOFError(f"channel closed before {argv[0]} reported its exit status")
            if time.monotonic() > deadline:
                self._drop()
                raise InfrastructureError(
                    f"{self._where}: {argv[0]} did not end {GRACE_S:.0f} s after its timeout: transport stuck"
                )
            if not got and channel.eof_received:
                channel.status_event.wait(0.1)  # output ended, exit status not in yet: don't spin on select

    # -- files -----------------------------------------------------------------------------------------------

    def _remote_sha256(self, paths: list[str], *, cwd: str) -> list[str]:
        sums: list[str] = []
        for i in range(0, len(paths), SHA_BATCH):
            batch = paths[i : i + SHA_BATCH]
            argv = ["sha256sum", "--", *batch]
            result = self._exec(self._client(), argv, timeout=3600, log_path=None, env=None, cwd=cwd)
            if not result.ok:
                raise InfrastructureError(f"{self._where}: sha256sum failed ({result.exit_code}): {result.stderr}")
            lines = result.stdout.splitlines()
            if len(lines) != len(batch):
                raise InfrastructureError(f"{self._where}: sha256sum printed {len(lines)} lines for {len(batch)}")
            sums.extend(line.lstrip("\\")[:64] for line in lines)  # "\\" prefix: an escaped file name
        return sums

    def put(self, local_path: Path, remote_path: str) -> None:
        src = Path(local_path)
        if not src.exists():
            raise ConfigurationError(f"{self.device_id}: cannot put {src}: no such file or directory")
        dest = self._abs(remote_path).rstrip("/")
        parent = posixpath.dirname(dest) or "/"
        tmp = temp_name(dest)
        if src.is_dir():
            dirs, files = local_tree(src)
        else:
            dirs, files = [], [""]
        with self._infra(f"put {src} -> {dest}"):
            argv = ["mkdir", "-p", "--", parent]
            mkdir = self._exec(self._client(), argv, timeout=60, log_path=None, env=None, cwd="/")
            if not mkdir.ok:
                raise ConfigurationError(f"{self._where}: cannot create {parent}: {mkdir.stderr.strip()}")
            sftp = self._sftp()
            self._stale.add(tmp)  # until verified and renamed
            try:
                if src.is_dir():
                    sftp.mkdir(tmp)
                    for rel in dirs:
                        sftp.mkdir(posixpath.join(tmp, rel))
                for rel in files:
                    sftp.put(str(src / rel), posixpath.join(tmp, rel) if rel else tmp, confirm=True)
                expected = [sha256_file(src / rel) for rel in files]
                targets = [posixpath.join(tmp, rel) if rel else tmp for rel in files]
                if self._remote_sha256(targets, cwd="/") != expected:
                    raise InfrastructureError(f"{self._where}: sha256 of the uploaded {dest} differs from {src}")
                self._replace_remote(sftp, tmp, dest)
                self._stale.discard(tmp)
                count_transfer(self.device_id, "put", [src / rel if rel else src for rel in files])
            finally:
                if tmp in self._stale and self._ssh is not None:
                    with contextlib.suppress(Exception):
                        self._exec(self._ssh, ["rm", "-rf", "--", tmp], timeout=60, log_path=None, env=None, cwd="/")
                        self._stale.discard(tmp)

    def _replace_remote(self, sftp: paramiko.SFTPClient, tmp: str, dest: str) -> None:
        try:
            existing = sftp.stat(dest)
        except FileNotFoundError:
            existing = None
        tmp_is_dir = stat.S_ISDIR(sftp.stat(tmp).st_mode or 0)
        if existing is not None and (tmp_is_dir or stat.S_ISDIR(existing.st_mode or 0)):
            old = temp_name(dest) + ".old"
            sftp.rename(dest, old)
            sftp.rename(tmp, dest)
            self._exec(self._client(), ["rm", "-rf", "--", old], timeout=600, log_path=None, env=None, cwd="/")
        else:
            sftp.posix_rename(tmp, dest)

    def get(self, remote_path: str, local_path: Path) -> None:
        src = self._abs(remote_path).rstrip("/")
        dst = Path(local_path)
        with self._infra(f"get {src} -> {dst}"):
            sftp = self._sftp()
            try:
                mode = sftp.stat(src).st_mode or 0
            except FileNotFoundError:
                raise ConfigurationError(f"{self._where}: cannot get {src}: no such file or directory") from None
            if stat.S_ISDIR(mode):
                dirs, files = self._remote_tree(src)
                expected = self._remote_sha256(files, cwd=src) if files else []
            else:
                dirs, files = [], [""]
                expected = self._remote_sha256([src], cwd="/")
            tmp = make_local_temp(dst, directory=stat.S_ISDIR(mode))
            try:
                for rel in dirs:
                    inside(tmp, rel).mkdir()
                for rel, digest in zip(files, expected, strict=True):
                    target = inside(tmp, rel) if rel else tmp
                    sftp.get(posixpath.join(src, rel) if rel else src, str(target))
                    if sha256_file(target) != digest:
                        raise InfrastructureError(f"{self._where}: sha256 of the downloaded {rel or src} differs")
                replace_local(tmp, dst)
            except BaseException:
                remove_local(tmp)
                raise
            count_transfer(self.device_id, "get", [inside(dst, rel) if rel else dst for rel in files])

    def _remote_tree(self, root: str) -> tuple[list[str], list[str]]:
        argv = ["find", root, "-mindepth", "1", "-printf", r"%y %P\0"]
        result = self._exec(self._client(), argv, timeout=600, log_path=None, env=None, cwd="/")
        if not result.ok:
            raise InfrastructureError(f"{self._where}: listing {root} failed: {result.stderr.strip()}")
        dirs, files = [], []
        for entry in filter(None, result.stdout.split("\0")):
            kind, rel = entry[0], entry[2:]
            check_remote_name(rel, where=f"{self._where}: listing {root}")
            if kind == "d":
                dirs.append(rel)
            elif kind == "f":
                files.append(rel)
            else:
                raise ConfigurationError(f"{self._where}: {root}/{rel}: only regular files and directories are copied")
        known = set(dirs)
        orphans = [rel for rel in [*dirs, *files] if posixpath.dirname(rel) not in known | {""}]
        if orphans:
            raise RemoteNameError(f"{self._where}: listing {root} names {orphans[0]!r} but not its directory")
        return sorted(dirs), sorted(files)
