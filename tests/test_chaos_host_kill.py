"""Chaos on the orchestrating host (issue 24 item 5): a real ``edgefarm run`` process SIGKILLed while NVIDIA's
quantizer runs for it, and while it installs that toolchain on first use.

  scenario 1  ``edgefarm run`` of a one-row list (stories260K int8_sq, quantize) with the session's real
              tensorrt-edgellm environment; SIGKILL once ``tensorrt-edgellm-quantize`` runs
  scenario 2  the same run on a fresh data dir, so it installs the pinned toolchain first (against a package
              registry that accepts and never answers: nothing is downloaded); SIGKILL while ``python -m venv``
              runs ensurepip, or failing that while pip runs

Expected: no toolchain process outlives the orchestrator (its whole tree, grandchildren included, and anything
whose command line names the run's data dir are gone within seconds); what they left (``host/scratch/quantize-*``,
``toolchains/.tensorrt-edgellm-<version>.*``) is there after the kill and removed by the next ``edgefarm gc``.
The table (fault, expected, observed, ok) goes to ``.data/test-artifacts/chaos-host.json``;
``benchmarks/chaos.py`` runs this test too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml
from typer.testing import CliRunner

from edgefarm.cli import app
from tests.helpers.toolchain_env import link_release

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / ".data" / "test-artifacts" / "chaos-host.json"
LIST = {"name": "chaos_quantize", "stage": "l0", "description": "one quantize on the host, killed halfway",
        "platforms": {"terms": ["thor"]},
        "defaults": {"max_seq_len": 256, "max_batch_size": 2, "max_input_len": 128, "stages": ["quantize"]},
        "tests": [{"model": "stories260K", "precision": "int8_sq"}]}


@dataclass
class Check:
    fault: str
    expected: str
    observed: list[str] = field(default_factory=list)
    ok: bool = True

    def see(self, ok: bool, what: str) -> None:
        self.observed.append(what if ok else f"NOT OK: {what}")
        self.ok = self.ok and ok


@dataclass
class Table:
    checks: list[Check] = field(default_factory=list)
    phases_s: dict[str, float] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    def write(self) -> None:
        TABLE.parent.mkdir(parents=True, exist_ok=True)
        rows = [{**asdict(c), "observed": "; ".join(c.observed)} for c in self.checks]
        TABLE.write_text(json.dumps({"test": "tests/test_chaos_host_kill.py::test_orchestrator_killed_on_the_host",
                                     "wall_s": round(time.monotonic() - self.started, 1), "phases_s": self.phases_s,
                                     "table": rows}, indent=2) + "\n")


@pytest.fixture
def silent_registry() -> Iterator[str]:
    """A package index that accepts connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/simple"


def _farm(root: Path) -> tuple[Path, Path, Path]:
    data, inventory, tests = root / "data", root / "inventory", root / f"{LIST['name']}.yml"
    inventory.mkdir(parents=True)
    (inventory / "cpu.yaml").write_text(yaml.safe_dump({"type": "x86-cpu", "transport": "local",
                                                        "work_dir": "devices/cpu"}))
    tests.write_text(yaml.safe_dump(LIST))
    return data, inventory, tests


def _env(registry: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PIP_", "EDGEFARM_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PIP_CONFIG_FILE": "/dev/null",
            "PIP_INDEX_URL": registry, "PIP_RETRIES": "0", "PIP_DEFAULT_TIMEOUT": "120"}


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _naming(text: str) -> list[psutil.Process]:
    """Live processes whose command line names ``text`` (the run's data dir: every tool it starts names it)."""
    return [p for p in psutil.process_iter() if _alive(p) and any(text in a for a in _cmdline(p))]


def _describe(proc: psutil.Process) -> str:
    cmd = _cmdline(proc)
    words = [Path(a).name for a in cmd[:2]] + [a for a in cmd[2:4] if not a.startswith("/")]
    return f"{' '.join(words) or '?'} (pid {proc.pid})"


def _kill_when(run: subprocess.Popen[bytes], wanted: Callable[[list[psutil.Process]], str | None],
               timeout: float = 240) -> tuple[str, list[psutil.Process]]:
    """SIGKILL ``run`` as soon as ``wanted(its descendants)`` names what it saw; (that, the descendants)."""
    me = psutil.Process(run.pid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and run.poll() is None:
        with contextlib.suppress(psutil.Error):
            tree = me.children(recursive=True)
            seen = wanted(tree)
            if seen is not None:
                tree = me.children(recursive=True)
                os.kill(run.pid, signal.SIGKILL)
                run.wait()
                return seen, tree
        time.sleep(0.05)
    output = run.stdout.read().decode(errors="replace")[-3000:] if run.poll() is not None and run.stdout else ""
    raise AssertionError(f"the moment to kill never came (exit {run.poll()}): {output}")


def _orphans(tree: list[psutil.Process], data: Path, grace_s: float = 15.0) -> tuple[list[psutil.Process], float]:
    """What outlived the killed orchestrator after ``grace_s``, and how long the rest took to go."""
    killed = time.monotonic()
    left = [p for p in tree if _alive(p)] + _naming(str(data))
    while left and time.monotonic() < killed + grace_s:
        time.sleep(0.1)
        left = [p for p in tree if _alive(p)] + _naming(str(data))
    return list({p.pid: p for p in left}.values()), time.monotonic() - killed


def _gc(data: Path) -> str:
    db = f"sqlite:///{data / 'edgefarm.db'}"
    if not (data / "edgefarm.db").exists():  # killed before its run opened the database
        assert CliRunner().invoke(app, ["db", "upgrade", "--db", db]).exit_code == 0
    result = CliRunner().invoke(app, ["gc", "--db", db, "--data-dir", str(data)])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def _quantizing(tree: list[psutil.Process]) -> str | None:
    tools = [p for p in tree if any(Path(a).name == "tensorrt-edgellm-quantize" for a in _cmdline(p)[:2])
             and "supervisor.py" not in " ".join(_cmdline(p))]
    return _describe(tools[0]) if tools else None


def _installing(tree: list[psutil.Process]) -> str | None:
    for marker in ("ensurepip", "pip"):
        found = [p for p in tree if marker in _cmdline(p) or f"{marker}.__main__" in " ".join(_cmdline(p))]
        if found and (marker == "ensurepip" or "install" in _cmdline(found[0])):
            return _describe(found[0])
    return None


def test_orchestrator_killed_on_the_host(trt_env: Path, tmp_path: Path, silent_registry: str,
                                         migrated_prefect_home: Callable[[Path], Path]) -> None:
    table = Table()
    q = Check("orchestrator (edgefarm run) SIGKILLed while tensorrt-edgellm-quantize runs",
              "the quantizer and everything the run started die with it (none left with PPID 1); its "
              "host/scratch/quantize-* dir is removed by the next edgefarm gc")
    i = Check("orchestrator (edgefarm run) SIGKILLed while it installs tensorrt-edgellm on first use",
              "python -m venv, ensurepip and pip die with it; its toolchains/.tensorrt-edgellm-<version>.* dir is "
              "removed by the next edgefarm gc")
    table.checks += [q, i]
    try:
        # -- 1: killed during quantize ------------------------------------------------------------------------------
        t0 = time.monotonic()
        data, inventory, tests = _farm(tmp_path / "quantize")
        link_release(data, trt_env)
        migrated_prefect_home(data / "prefect")  # the run's temporary Prefect server: a database already migrated
        run = subprocess.Popen([sys.executable, "-m", "edgefarm.cli", "run", "--priority", str(tests), "--inventory",
                                str(inventory), "--data-dir", str(data)], cwd=REPO, env=_env(silent_registry),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seen, tree = _kill_when(run, _quantizing)
        left, took = _orphans(tree, data)
        q.see(not left, f"killed while {seen} ran, with {len(tree)} processes under the orchestrator; "
                        + (f"survivors {[_describe(p) for p in left]}" if left else f"all gone within {took:.1f} s"))
        scratch = sorted(p.name for p in (data / "host" / "scratch").glob("quantize-*"))
        q.see(bool(scratch), f"left in host/scratch: {scratch}")
        said = _gc(data)
        after = sorted(p.name for p in (data / "host" / "scratch").iterdir())
        q.see(after == [] and f"{len(scratch)} scratch dir(s) of dead runs removed" in said,
              f"after edgefarm gc: host/scratch holds {after} ({said.split('; ')[2]})")
        table.phases_s["kill during quantize"] = round(time.monotonic() - t0, 1)

        # -- 2: killed during the first-use install ---------------------------------------------------------------
        t0 = time.monotonic()
        data, inventory, tests = _farm(tmp_path / "install")
        migrated_prefect_home(data / "prefect")
        run = subprocess.Popen([sys.executable, "-m", "edgefarm.cli", "run", "--priority", str(tests), "--inventory",
                                str(inventory), "--data-dir", str(data)], cwd=REPO, env=_env(silent_registry),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seen, tree = _kill_when(run, _installing)
        left, took = _orphans(tree, data)
        i.see(not left, f"killed while {seen} ran, with {len(tree)} processes under the orchestrator; "
                        + (f"survivors {[_describe(p) for p in left]}" if left else f"all gone within {took:.1f} s"))
        temporary = sorted(p.name for p in (data / "toolchains").glob(".tensorrt-edgellm-*"))
        i.see(bool(temporary), f"left in toolchains/: {temporary}")
        said = _gc(data)
        after = sorted(p.name for p in (data / "toolchains").iterdir())
        i.see(after == [] and f"{len(temporary)} leftover(s) of killed toolchain installs removed" in said,
              f"after edgefarm gc: toolchains/ holds {after} ({said.split('; ')[-1]})")
        table.phases_s["kill during install"] = round(time.monotonic() - t0, 1)
    finally:
        for p in _naming(str(tmp_path)):  # whatever broke, never leave a tool running
            with contextlib.suppress(psutil.Error):
                p.kill()
        table.write()
    failures = [f"{c.fault}: {o}" for c in table.checks for o in c.observed if o.startswith("NOT OK")]
    assert not failures and all(c.observed for c in table.checks), "\n".join(failures)
