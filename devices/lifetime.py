"""Tie a child process's life to its parent's: Linux ``PR_SET_PDEATHSIG`` set in the child before it execs, so
a parent killed without warning (``kill -9``, OOM) takes its children with it instead of orphaning them.

Used as ``preexec_fn`` (with ``start_new_session=True`` the child still gets its own process group). libc and
its ``prctl`` are resolved here, in the parent, so the child between fork and exec only makes one call.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl if sys.platform == "linux" \
    else None


def die_with_parent() -> None:
    """``preexec_fn``: SIGKILL this child when the thread that started it dies; exit now if it already has."""
    if _prctl is None:
        return
    parent = os.getppid()
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)
