"""Tie a child process's life to its parent's, so a parent killed without warning (``kill -9``, OOM) takes its
children with it instead of orphaning them. The one place that decides how the farm starts processes on this host.

:func:`die_with_parent` is Linux ``PR_SET_PDEATHSIG`` set in the child before it execs: the child gets SIGKILL when
the thread that started it dies. It reaches that one child only, never what the child starts (``python -m venv``
runs ensurepip, a tool may fork workers), so :func:`spawn` puts a small supervisor in front of the command: it leads
a process group of its own (the command and everything it starts, unless they leave the group), gets a signal when
its parent dies and then kills the whole group (``devices/supervisor.py``). It passes the command's exit status on
unchanged (a signal as the same signal), and its rusage at ``wait4`` covers the command's (``ru_maxrss``: the
largest child).

For :func:`die_with_parent`, libc and its ``prctl`` are resolved here, in the parent, so the child between fork and
exec only makes one call.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl if sys.platform == "linux" \
    else None

SUPERVISOR = Path(__file__).with_name("supervisor.py")  # standard library only: runs with -I -S
# The supervisor's parent-death signal: a real-time one, so it is never mistaken for a SIGTERM someone sent (the
# signal also comes when only the starting thread dies, while getppid() still names the process).
ORPHANED = signal.SIGRTMIN + 1


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL this child when the thread that started it dies; exit now if it already has."""
    if _prctl is None:
        return
    parent = os.getppid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def supervised(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the supervisor (what :func:`spawn` runs)."""
    return [sys.executable, "-I", "-S", str(SUPERVISOR), str(int(ORPHANED)), str(os.getpid()), *argv]


def spawn(argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """Start ``argv`` (``subprocess.Popen`` keywords but ``start_new_session``/``preexec_fn``) in a process group of
    its own that dies with the calling thread, kill -9 included; ``proc.pid`` is the group's id. A command that is
    not there exits 127 (``<name>: command not found`` on its stderr), one that cannot run 126."""
    if "start_new_session" in popen or "preexec_fn" in popen:
        raise TypeError("spawn decides start_new_session and preexec_fn itself")
    # no preexec_fn: Python code in a forked child of a threaded process can finalize other threads' objects
    # there (a held scratch dir's cleanup ran in the child and removed the parent's dir); the supervisor asks for
    # its parent-death signal itself
    return subprocess.Popen(supervised(argv), start_new_session=True, **popen)


def kill_group(pgid: int) -> None:
    """SIGKILL a process group :func:`spawn` started (nothing when it is gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def run(argv: Sequence[str], *, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True)`` through :func:`spawn`: past ``timeout``
    (``subprocess.TimeoutExpired``) or when the caller is interrupted (Ctrl-C, a SIGTERM turned into an exception),
    the command's whole group is killed before the exception goes on."""
    proc = spawn(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:
        kill_group(proc.pid)
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
        raise
    kill_group(proc.pid)  # what it left running in the background
    return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C's KeyboardInterrupt inside :func:`terminate_as_interrupt`."""


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """While the block runs (in the main thread; elsewhere nothing changes), SIGTERM raises :class:`Terminated`, so
    the block's cleanups run (its commands' groups killed, temporary files removed) as on Ctrl-C; then the process
    ends by SIGTERM all the same (or the handler that was there gets it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    previous = signal.SIG_DFL if previous is None else previous  # None: set outside Python
    if previous == signal.SIG_IGN:
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except Terminated:
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)  # the default ends the process here
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
