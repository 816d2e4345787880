"""This machine as a device: argument lists in a subprocess, each in its own process group."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import IO

from edgefarm.devices.environment import stage_environ
from edgefarm.devices.lifetime import kill_group, spawn
from edgefarm.devices.transport.base import (
    MAX_KEPT_OUTPUT_BYTES,
    TIMEOUT_EXIT_CODE,
    CommandResult,
    OutputBuffer,
    Transport,
    check_argv,
    count_transfer,
    local_tree,
    make_local_temp,
    remove_local,
    replace_local,
    sha256_file,
)
from edgellm.errors import ConfigurationError, InfrastructureError


def _pump(stream: IO[bytes], sink: OutputBuffer, log: IO[bytes] | None, lock: threading.Lock) -> None:
    while chunk := stream.read1(65536):  # type: ignore[attr-defined]
        sink.extend(chunk)
        if log is not None:
            with lock:
                log.write(chunk)
                log.flush()


class LocalTransport(Transport):
    max_output_bytes = MAX_KEPT_OUTPUT_BYTES  # kept per stream of a command (devices.transport.base.OutputBuffer)

    def __init__(self, device_id: str, work_dir: Path, *, env: dict[str, str] | None = None) -> None:
        self.device_id = device_id
        self.work_dir = Path(work_dir)
        self.env = dict(env or {})

    def _path(self, path: str | Path) -> Path:
        return self.work_dir / path  # an absolute path stays as it is

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
        self.work_dir.mkdir(parents=True, exist_ok=True)
        directory = self._path(cwd) if cwd is not None else self.work_dir
        start = time.monotonic()
        if not directory.is_dir():
            return CommandResult(1, "", f"cd: {directory}: No such file or directory\n", 0.0)
        # its own process group, so a timeout kills everything it started; and it dies with the orchestrator
        # (kill -9 included). A command that is not there exits 127, one that cannot run 126.
        proc = spawn(
            argv,
            cwd=directory,
            env={**stage_environ(), **self.env, **(env or {})},  # no credential of ours reaches a device's tool
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = OutputBuffer(self.max_output_bytes), OutputBuffer(self.max_output_bytes)
        lock = threading.Lock()
        log_file = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log_file = log.open("ab")
        try:
            pumps = [
                threading.Thread(target=_pump, args=(proc.stdout, out, log_file, lock), daemon=True),
                threading.Thread(target=_pump, args=(proc.stderr, err, log_file, lock), daemon=True),
            ]
            for pump in pumps:
                pump.start()
            timed_out = False
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            # Kill the group either way: on timeout the command, otherwise anything it left in the background.
            kill_group(proc.pid)
            proc.wait()
            for pump in pumps:
                pump.join(timeout=10)
                if pump.is_alive():
                    raise InfrastructureError(
                        f"{self.device_id}: output of {argv[0]} still open 10 s after it ended "
                        "(a child left its process group?)"
                    )
        finally:
            if log_file is not None:
                log_file.close()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        code = TIMEOUT_EXIT_CODE if timed_out else proc.returncode
        return CommandResult(
            exit_code=code,
            stdout=out.text(),
            stderr=err.text(),
            duration=time.monotonic() - start,
            timed_out=timed_out,
            stdout_dropped=out.dropped,
            stderr_dropped=err.dropped,
        )

    def put(self, local_path: Path, remote_path: str) -> None:
        self._copy(Path(local_path), self._path(remote_path))
        count_transfer(self.device_id, "put", _files_of(Path(local_path)))

    def get(self, remote_path: str, local_path: Path) -> None:
        self._copy(self._path(remote_path), Path(local_path))
        count_transfer(self.device_id, "get", _files_of(Path(local_path)))

    def _copy(self, src: Path, dst: Path) -> None:
        if not src.exists():
            raise ConfigurationError(f"{self.device_id}: cannot copy {src}: no such file or directory")
        is_dir = src.is_dir()
        tree = local_tree(src) if is_dir else None
        tmp = make_local_temp(dst, directory=is_dir)
        try:
            pairs: list[tuple[Path, Path]]
            if tree is None:
                pairs = [(src, tmp)]
            else:
                dirs, files = tree
                for rel in dirs:
                    (tmp / rel).mkdir()
                pairs = [(src / rel, tmp / rel) for rel in files]
            for source, target in pairs:
                shutil.copyfile(source, target)
                if sha256_file(source) != sha256_file(target):
                    raise InfrastructureError(f"{self.device_id}: sha256 of {target} differs from {source}")
            replace_local(tmp, dst)
        except OSError as err:
            remove_local(tmp)
            raise InfrastructureError(f"{self.device_id}: copying {src} to {dst} failed: {err}") from err
        except BaseException:
            remove_local(tmp)
            raise

    def close(self) -> None:
        pass


def _files_of(path: Path) -> list[Path]:
    return sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
