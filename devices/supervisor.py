"""The supervisor :func:`devices.lifetime.spawn` puts in front of a command: ``python -I -S supervisor.py SIGNAL
PARENT_PID ARGV...``. Standard library only (it runs without the farm's packages on the path).

It leads the command's process group. It asks the kernel for ``SIGNAL`` (a real-time one nothing else sends) when
the thread that started it dies (Linux ``PR_SET_PDEATHSIG``, set here rather than between fork and exec, so the
parent runs no Python in its forked child); when that comes, or when the parent is already gone by the time it
asked, it kills the whole group, itself included. A SIGTERM goes on to the command. It exits as the command did:
the same code, or the same signal.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys

PR_SET_PDEATHSIG = 1


def _kill_group(signum: int = 0, frame: object = None) -> None:
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> int:
    orphaned, parent, command = int(argv[0]), int(argv[1]), argv[2:]
    child: subprocess.Popen[bytes] | None = None

    def term(signum: int, frame: object) -> None:
        if child is not None:
            child.send_signal(signum)

    signal.signal(orphaned, _kill_group)
    signal.signal(signal.SIGTERM, term)
    if sys.platform == "linux":
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, orphaned, 0, 0, 0)
    if os.getppid() != parent:  # it died before the kernel was asked
        _kill_group()
    try:
        child = subprocess.Popen(command)
    except FileNotFoundError:
        sys.stderr.write(f"{command[0]}: command not found\n")
        return 127
    except PermissionError:
        sys.stderr.write(f"{command[0]}: permission denied\n")
        return 126
    code = child.wait()
    if code < 0:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
