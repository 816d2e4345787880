"""The supervisor :func:`devices.lifetime.spawn` puts in front of a command: ``python -I -S supervisor.py SIGNAL
PARENT_PID ARGV...``. Standard library only (it runs without the farm's packages on the path).

It leads the command's process group. ``SIGNAL`` is its parent-death signal (a real-time one nothing else sends):
when it comes, the thread that started it has died (the orchestrator was killed), and it kills the whole group,
itself included. A SIGTERM goes on to the command. It exits as the command did: the same code, or the same signal.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main(argv: list[str]) -> int:
    orphaned, parent, command = int(argv[0]), int(argv[1]), argv[2:]
    child: subprocess.Popen[bytes] | None = None

    def parent_died(signum: int, frame: object) -> None:
        os.killpg(0, signal.SIGKILL)

    def term(signum: int, frame: object) -> None:
        if child is not None:
            child.send_signal(signum)

    signal.signal(orphaned, parent_died)
    signal.signal(signal.SIGTERM, term)
    if os.getppid() != parent:  # it died before the handler was there
        os.killpg(0, signal.SIGKILL)
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
