"""Every process the farm starts on its host dies with it (issue 24 item 5): kill -9 of the process that ran a host
tool (``toolchains.process``: the quantizer's and onnxruntime-genai's builder's ``run_tool``, a probe's
``run_captured``; a toolchain install step, a local device command)
takes the tool and what the tool started with it, within seconds, never leaving them to init."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from edgefarm.devices import lifetime

REPO = Path(__file__).resolve().parents[1]
# a tool that starts a grandchild (as python -m venv starts ensurepip) and waits: sleeps with a marker duration
TOOL = "['/bin/sh', '-c', 'sleep 3141 & sleep 3142; wait']"
CALLERS = {
    "run_tool": "from edgefarm.toolchains.process import run_tool\n"
                f"run_tool({TOOL}, env={{}}, log=Path(sys.argv[1]) / 'tool.log', timeout=600)",
    # a toolchain's probe (stdin in, output captured), the runner's other shape
    "run_captured": "from edgefarm.toolchains.process import run_captured\n"
                    f"run_captured({TOOL}, env={{}}, timeout=600, stdin='{{}}')",
    # an environment's interpreter (the install's import probe) that is the tool
    "install-step": "from edgefarm.toolchains.tensorrt_edgellm.env import health\n"
                    "python = Path(sys.argv[1]) / 'env' / 'bin' / 'python'\n"
                    "python.parent.mkdir(parents=True)\n"
                    "python.write_text('#!/bin/sh\\nsleep 3141 & sleep 3142; wait\\n')\n"
                    "python.chmod(0o755)\n"
                    "health(python.parents[1])",
    "local-transport": "from edgefarm.devices.transport.local import LocalTransport\n"
                       f"LocalTransport('cpu', Path(sys.argv[1])).run({TOOL}, timeout=600)",
}


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _sleeps(parent: psutil.Process) -> list[psutil.Process]:
    found = []
    for p in parent.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.cmdline()[:1] == ["sleep"] and p.cmdline()[1:] in (["3141"], ["3142"]):
                found.append(p)
    return found


@pytest.mark.parametrize("caller", sorted(CALLERS))
def test_a_killed_orchestrator_takes_its_tools_and_their_children(caller: str, tmp_path: Path) -> None:
    code = f"import os, sys\nfrom pathlib import Path\n{CALLERS[caller]}\n"
    orchestrator = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO,
                                    env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        me = psutil.Process(orchestrator.pid)
        deadline = time.monotonic() + 60
        while len(sleeps := _sleeps(me)) < 2 and time.monotonic() < deadline and orchestrator.poll() is None:
            time.sleep(0.05)
        assert len(sleeps) == 2, f"the tool never started under {caller}"
        os.kill(orchestrator.pid, signal.SIGKILL)
        orchestrator.wait()
        gone_by = time.monotonic() + 10
        while any(_alive(p) for p in sleeps) and time.monotonic() < gone_by:
            time.sleep(0.05)
        left = [(p.pid, p.ppid()) for p in sleeps if _alive(p)]
        assert left == [], f"{caller}: the tool or its child outlived the killed orchestrator (pid, ppid): {left}"
    finally:
        if orchestrator.poll() is None:
            orchestrator.kill()
            orchestrator.wait()
        for p in psutil.process_iter():  # never leave a sleep behind, whatever broke
            with contextlib.suppress(psutil.Error):
                if p.cmdline()[:1] == ["sleep"] and p.cmdline()[1:] in (["3141"], ["3142"]):
                    p.kill()


def test_spawn_passes_the_exit_status_and_peak_memory_on() -> None:
    assert lifetime.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=60).returncode == 3
    done = lifetime.run(["sh", "-c", "kill -TERM $$"], timeout=60)
    assert done.returncode == -signal.SIGTERM
    missing = lifetime.run(["no-such-tool-here"], timeout=60)
    assert (missing.returncode, missing.stderr) == (127, "no-such-tool-here: command not found\n")
    proc = lifetime.spawn([sys.executable, "-c", "b = bytearray(200 * 2**20)"])
    _, status, usage = os.wait4(proc.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0 and usage.ru_maxrss * 1024 > 200 * 2**20
