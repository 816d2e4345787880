"""The one way a toolchain runs a command on this host (an exporter, a quantizer, a model builder, a probe).

Every command gets this process's environment less its credentials (``devices.environment.stage_environ``) plus
what the caller adds; runs in a process group of its own that dies with the orchestrator (``devices.lifetime``);
and past its limit is killed with the whole group, which raises InfrastructureError naming the command. Two shapes:
:func:`run_tool` (output to a log file; wall time and the child's peak RSS) and :func:`run_captured` (stdin given,
stdout and stderr captured as text: a short probe).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from edgefarm.devices.environment import stage_environ
from edgefarm.devices.lifetime import kill_group, spawn
from edgellm.errors import InfrastructureError

LOG_TAIL_LINES = 12
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colours some tools print even into a file


@dataclass(frozen=True)
class ToolRun:
    argv: list[str]
    returncode: int
    wall_s: float
    peak_rss_bytes: int  # the child's maximum resident set (Linux ru_maxrss, KiB -> bytes)
    log: Path

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def error_line(self) -> str:
        """The most telling line of a failed run: the last exception or error line of the log (no colour codes).
        When that exception wraps another (a chained traceback), the first of the chain leads: ``torch.export``
        wraps the model's own error in a generic one ("TypeError: FP16Linear expects float16 input, got
        torch.float32 (raised as TorchExportError: Failed to export the model with torch.export ...)")."""
        raw = _ANSI.sub("", self.log.read_text(encoding="utf-8", errors="replace"))
        text = [ln.strip() for ln in raw.splitlines()]
        errors = [ln for ln in text if ln and _is_error_line(ln)]
        if not errors:
            return next((ln for ln in reversed(text) if ln), "(no output)")[:400]
        last, first = errors[-1], errors[0]
        if first == last or not any(c in ln for ln in text for c in _CHAINED):
            return last[:400]
        return f"{first[:300]} (raised as {last[:200]})"


_CHAINED = ("The above exception was the direct cause", "During handling of the above exception")


def _is_error_line(line: str) -> bool:
    return line.split(":", 1)[0].endswith(("Error", "Exception")) or line.startswith("ERROR")


def _environ(env: Mapping[str, str]) -> dict[str, str]:
    return {**stage_environ(), **env}


def _past_limit(argv: list[str], what: str | None, timeout: float, log: Path | None) -> InfrastructureError:
    where = f" (log: {log})" if log is not None else ""
    return InfrastructureError(f"{what or Path(argv[0]).name} ran past its {timeout:.0f} s limit and was "
                               f"killed{where}")


def run_tool(argv: list[str], *, env: Mapping[str, str], log: Path, timeout: float, cwd: Path | None = None,
             what: str | None = None) -> ToolRun:
    """Run ``argv`` with ``env`` added to ours less our credentials; stdout and stderr go to ``log``. A run past
    ``timeout`` is killed with its whole process group and raises InfrastructureError naming ``what`` (default:
    the program's name)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "wb") as out:
        # its own process group, dying with the orchestrator (kill -9 included) and taking what it started along
        proc = spawn(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                     env=_environ(env), cwd=cwd)
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid == proc.pid:
                    break
                if time.monotonic() - start > timeout:
                    raise _past_limit(argv, what, timeout, log)
                time.sleep(0.1)
        except BaseException:  # timeout, Ctrl-C, cancellation: never leave the tool running
            kill_group(proc.pid)
            os.wait4(proc.pid, 0)
            proc.returncode = -signal.SIGKILL
            raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    return ToolRun(list(argv), proc.returncode, time.monotonic() - start, usage.ru_maxrss * 1024, log)


def run_captured(argv: list[str], *, env: Mapping[str, str], timeout: float, stdin: str | None = None,
                 what: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with ``env`` added to ours less our credentials, ``stdin`` as its input (none: empty); its
    stdout and stderr come back as text. Past ``timeout`` (or interrupted) its whole process group is killed; past
    ``timeout`` that raises InfrastructureError naming ``what`` (default: the program's name)."""
    proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env=_environ(env))
    try:
        out, err = proc.communicate(stdin or "", timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        proc.communicate()
        raise _past_limit(argv, what, timeout, None) from None
    except BaseException:  # Ctrl-C, cancellation: never leave the probe running
        kill_group(proc.pid)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file() and not p.is_symlink())
