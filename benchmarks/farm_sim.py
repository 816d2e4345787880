"""A simulated lab for benchmarks/bench_farm_scale.py: N devices, M rows, through the farm's real plan, flow, leases,
retries, results database and docs; only the devices and the toolchain's tools are stand-ins.

- The toolchain is ``sim-lab``: tests/helpers/toy_toolchain.py's toy driver (the one the generic layers are proven
  with) under another name, its host stages (quantize, export) sleeping a drawn duration before writing their small
  real artifacts into the store, its cache keys per model (every simulated model reads the same checkpoint file).
- The devices are SSH devices of the x86-cpu type on hosts that do not exist (``sim-0001``...): their transport is
  ``SimTransport``, a local directory per device where every command the farm sends runs for real (the agent, the
  cache scripts, ``mkdir``...) except the toolchain's tool, which runs in the calling thread: it sleeps the stage's
  drawn duration and writes what the toy's tool writes; with the failure rates given it exits as an infrastructure
  failure (the farm moves the stage to another device and Prefect retries) or as a test failure.
- Durations are drawn (seeded, log-normal around the median) from per-stage times this farm recorded
  (``STAGE_TIMES``: a nightly's results, ``stage_times_from_db``), times ``time_scale``.

Everything here is installed into the farm by ``install(...)``, a context manager that patches the registries
(toolchains, x86-cpu's device type, the catalog) and the SSH transport class for the duration of the benchmark.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from edgefarm.devices.transport.base import CommandResult  # noqa: E402
from edgefarm.devices.transport.local import LocalTransport  # noqa: E402
from edgellm.errors import ErrorKind  # noqa: E402
from edgellm.types import Precision  # noqa: E402
from tests.helpers import toy_toolchain  # noqa: E402

NAME = "sim-lab"
# every device type of the farm takes the lab's toolchain; a row is (model, precision, platform), and a model's
# quantize (per precision) and export (per precision and toolchain) serve all its platforms, as in the field's matrix
PLATFORMS = ("orin", "thor", "x86-a30", "x86-cpu", "x86-h200", "x86-rtx5080")
PRECISIONS = ("fp16", "int8_sq", "int4_awq")  # what every one of those types runs
QUANTIZED = ("int8_sq", "int4_awq")
STAGES = ("quantize", "export", "build", "infer", "accuracy", "bench")
# seconds per stage (median, and the spread of its log), from the embedded nightly's results on this machine
# (2026-12-02, `stage_times_from_db` on .data/edgefarm.db): overridden by --stage-times-db
STAGE_TIMES: dict[str, tuple[float, float]] = {
    "quantize": (20.0, 0.5), "export": (4.0, 0.5), "build": (2.0, 0.4), "infer": (3.0, 0.4),
    "accuracy": (4.0, 0.4), "bench": (6.0, 0.3),
}
CHECKPOINT = ROOT / "edgellm" / "assets" / "stories260K"


@dataclass
class Work:
    """What the simulated tools were asked to do: (stage, device or "host", seconds slept, job)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    done: list[tuple[str, str, float, str]] = field(default_factory=list)
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    commands: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # device commands run for real, by kind
    device_cpu_s: float = 0.0  # CPU the devices' commands took in this process (the agent, run in the caller's thread)
    running: int = 0  # device tool commands running now, and the most at once
    peak_running: int = 0

    def started(self) -> None:
        with self.lock:
            self.running += 1
            self.peak_running = max(self.peak_running, self.running)

    def ended(self) -> None:
        with self.lock:
            self.running -= 1

    def add_cpu(self, seconds: float) -> None:
        with self.lock:
            self.device_cpu_s += seconds

    def add(self, stage: str, where: str, seconds: float, job: str) -> None:
        with self.lock:
            self.done.append((stage, where, seconds, job))


@dataclass
class Lab:
    devices: int
    time_scale: float = 1.0
    infra_failure_rate: float = 0.0
    test_failure_rate: float = 0.0
    seed: int = 0
    stage_times: Mapping[str, tuple[float, float]] = field(default_factory=lambda: dict(STAGE_TIMES))
    work: Work = field(default_factory=Work)
    _rng: random.Random = field(default_factory=random.Random)
    _rng_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng.seed(self.seed)

    def draw(self, stage: str) -> tuple[float, str | None]:
        """A duration for one run of ``stage`` and how it ends (None: passes; else an ErrorKind value)."""
        median, sigma = self.stage_times[stage]
        with self._rng_lock:
            seconds = median * math.exp(self._rng.gauss(0.0, sigma)) * self.time_scale
            roll = self._rng.random()
        if roll < self.infra_failure_rate:
            return seconds, ErrorKind.INFRASTRUCTURE.value
        if roll < self.infra_failure_rate + self.test_failure_rate:
            return seconds, ErrorKind.TEST_FAILURE.value
        return seconds, None


LAB: Lab | None = None  # the lab installed (install())
TOOL_NAME = toy_toolchain.TOOL.name
_DEVICE_STAGE = {"build": "build", "infer": "infer", "eval": "accuracy", "bench": "bench"}
_PATH_ARGS = {"build": (0, 1), "infer": (0, 1, 2), "eval": (0, 1, 2), "bench": (0, 2)}


def _kind(argv: list[str]) -> str:
    """A device command's kind for the counts: the agent's subcommand, a script's first word, or the program."""
    if "-S" in argv and len(argv) > argv.index("-S") + 2:
        return "agent " + argv[argv.index("-S") + 2]
    if argv[0] == "sh" and len(argv) > 2:
        return "sh " + argv[2].split()[0]
    return argv[0]


def _slug(key: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", key)[:150]


def _row(args: list[str]) -> str:
    """The row a device command serves, from its job dir (``jobs/run-N/<stage>[-i]-<job key slug>-<ms>``)."""
    import re

    for arg in args:
        found = re.search(r"jobs/run-\d+/(?:build|infer|accuracy|bench-\d+)-(.+)-\d+(?:/|$)", arg)
        if found:
            return found.group(1)
    return "?"


_AGENT_PATH_FLAGS = ("--work-dir", "--cache", "--within", "--seal")


class _ThreadOutput:
    """sys.stdout / sys.stderr for this process: what a thread running the agent writes goes to that thread's
    buffers, everything else to the real streams."""

    def __init__(self) -> None:
        self.local = threading.local()
        self.real = (sys.stdout, sys.stderr)

    def capture(self) -> tuple[io.StringIO, io.StringIO]:
        self.local.buffers = (io.StringIO(), io.StringIO())
        return self.local.buffers

    def release(self) -> None:
        self.local.buffers = None

    def stream(self, index: int) -> Any:
        buffers = getattr(self.local, "buffers", None)
        return buffers[index] if buffers else self.real[index]


class _Stream:
    def __init__(self, owner: _ThreadOutput, index: int) -> None:
        self.owner, self.index = owner, index

    def __getattr__(self, name: str) -> Any:
        return getattr(self.owner.stream(self.index), name)


_OUTPUT = _ThreadOutput()


def _sysroot(work_dir: Path) -> Path:
    root = work_dir.parent / ".sysroot"
    root.mkdir(parents=True, exist_ok=True)
    return root


class SimTransport(LocalTransport):
    """A simulated device: its work dir is a local directory; the toolchain's tool runs in the calling thread."""

    def __init__(self, device: Any) -> None:
        super().__init__(device.id, Path(device.work_dir), env=device.env)
        self.tool = toy_toolchain.pushed_path(toy_toolchain.TOOL)

    def run(self, argv: list[str], *, timeout: float, log: Path | None = None, env: dict[str, str] | None = None,
            cwd: str | None = None) -> CommandResult:
        base = self._path(cwd) if cwd is not None else self.work_dir
        if len(argv) >= 3 and argv[1] == self.tool:
            return self._tool(base, argv[2], argv[3:], log)
        assert LAB is not None
        kind = _kind(argv)
        LAB.work.commands[kind] += 1
        if kind.startswith("agent "):  # the farm's real agent, in this thread (a device's CPU is not the host's)
            return self._agent(base, argv[argv.index("-S") + 2:])
        # a command over SSH runs on the device: a plain child here, without the host's process supervisor
        # (LocalTransport's, which keeps a local command from outliving the orchestrator)
        start = time.monotonic()
        if not base.is_dir():
            return CommandResult(1, "", f"cd: {base}: No such file or directory\n", 0.0)
        done = subprocess.run(argv, cwd=base, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env, **(env or {})})
        return CommandResult(done.returncode, done.stdout, done.stderr, time.monotonic() - start)

    def _agent(self, base: Path, args: list[str]) -> CommandResult:
        from edgefarm.devices import agent

        assert LAB is not None
        absolute = [str(base / a) if i > 0 and (args[i - 1] in _AGENT_PATH_FLAGS or (args[0] == "hash" and i == 1))
                    and not a.startswith("/") else a for i, a in enumerate(args)]
        if absolute[0] in ("env", "oom") and "--root" not in absolute:  # the device's own (empty) filesystem, not
            absolute[1:1] = ["--root", str(_sysroot(self.work_dir))]  # this host's (its dpkg database: 75 ms a read)
        start, cpu = time.monotonic(), time.thread_time()
        out, err = _OUTPUT.capture()
        try:
            code = agent.main(absolute)
        finally:
            _OUTPUT.release()
            LAB.work.add_cpu(time.thread_time() - cpu)
        return CommandResult(code, out.getvalue(), err.getvalue(), time.monotonic() - start)

    def _tool(self, base: Path, command: str, args: list[str], log: Path | None) -> CommandResult:
        assert LAB is not None
        start = time.monotonic()
        if command == "env":
            out = json.dumps({"version": f"{toy_toolchain.VERSION}-device", "python": sys.version.split()[0]})
            return CommandResult(0, out + "\n", "", time.monotonic() - start)
        stage = _DEVICE_STAGE[command]
        seconds, ending = LAB.draw(stage)
        LAB.work.started()
        try:
            time.sleep(seconds)
        finally:
            LAB.work.ended()
        LAB.work.add(stage, self.device_id, seconds, _row(args))
        if ending is not None:
            LAB.work.failures[f"{stage}:{ending}"] += 1
            code = ErrorKind(ending).exit_code
            return CommandResult(code, "", f"sim-lab: simulated {ending} in {command}\n", time.monotonic() - start)
        paths = [str(base / a) if i in _PATH_ARGS[command] else a for i, a in enumerate(args)]
        code = toy_toolchain._device_main([command, *paths])
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("a") as f:
                f.write(f"sim-lab {command}: {seconds:.3f} s simulated\n")
        return CommandResult(code, "", "", time.monotonic() - start)


class SimHostStages(toy_toolchain.ToyHostStages):
    """The toy's host stages, taking their time, keyed per model."""

    def quantize_key_inputs(self, job: Any, quantize_device: str, version: str) -> dict[str, Any]:
        return {**super().quantize_key_inputs(job, quantize_device, version), "model": job.model,
                "precision": str(job.precision)}

    def export_key_inputs(self, checkpoint_sha: str, job: Any, version: str) -> dict[str, Any]:
        return {**super().export_key_inputs(checkpoint_sha, job, version), "model": job.model}

    def quantize(self, work: Any, job: Any, keyed: Any) -> Any:
        _host_sleep("quantize", job)
        return super().quantize(work, job, keyed)

    def export(self, work: Any, job: Any, checkpoint: Any, quantized_linears: int, keyed: Any) -> Any:
        _host_sleep("export", job)
        return super().export(work, job, checkpoint, quantized_linears, keyed)


class SimDeviceStages(toy_toolchain.ToyDeviceStages):
    def standin(self, device: Any) -> bool:
        return True  # simulated tools on simulated devices: never evidence of support, on any page


class SimLab(toy_toolchain.ToyEcho):
    """The toy driver as a lab's toolchain: more precisions, host stages that take their time, keys per model."""

    name = NAME
    HOST_STAGES = SimHostStages
    DEVICE_STAGES = SimDeviceStages

    def precisions(self) -> tuple[Precision, ...]:
        return tuple(Precision(p) for p in PRECISIONS)

    def quantizes(self) -> tuple[Precision, ...]:
        return tuple(Precision(p) for p in QUANTIZED)


def _host_sleep(stage: str, job: Any) -> None:
    assert LAB is not None
    seconds, _ = LAB.draw(stage)  # host stages of the stand-in never fail: the failures are the devices'
    time.sleep(seconds)
    LAB.work.add(stage, "host", seconds, _slug(job.key))


def platforms_of(devices: int) -> dict[str, str]:
    """Device id -> platform, as ``write_inventory`` writes them."""
    return {f"sim-{i:04d}": PLATFORMS[i % len(PLATFORMS)] for i in range(devices)}


def write_inventory(directory: Path, work_root: Path, devices: int) -> None:
    """``devices`` SSH devices on hosts that do not exist (SimTransport reaches them), the platforms in turn."""
    import yaml

    directory.mkdir(parents=True, exist_ok=True)
    key = directory.parent / "sim_key"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    host_key = " ".join(key.with_suffix(".pub").read_text().split()[:2])
    for name, platform in platforms_of(devices).items():
        (directory / f"{name}.yaml").write_text(yaml.safe_dump({
            "type": platform, "transport": "ssh", "host": name, "user": "sim",
            "key_file": str(key), "host_key": host_key, "work_dir": str(work_root / name), "python": sys.executable,
            "env": {"PYTHONPATH": str(ROOT)}, "max_jobs": 1}))


def write_catalog(path: Path, models: int) -> list[str]:
    """``models`` catalog entries, all reading the bundled stories260K (the driver's keys tell them apart)."""
    import yaml

    names = [f"sim-model-{i:04d}" for i in range(models)]
    path.write_text(yaml.safe_dump({"models": {n: {"path": str(CHECKPOINT)} for n in names}}))
    return names


def write_matrix(path: Path, models: list[str], precisions: tuple[str, ...] = PRECISIONS,
                 platforms: tuple[str, ...] = PLATFORMS) -> None:
    import yaml

    path.write_text(yaml.safe_dump({
        "name": "sim-lab", "models": models, "precisions": list(precisions), "platforms": list(platforms),
        "toolchains": [NAME], "defaults": {"max_seq_len": 64, "max_batch_size": 1, "max_input_len": 32,
                                           "stages": ["export", "build", "infer", "accuracy", "bench"]}}))


@contextmanager
def install(lab: Lab, catalog_file: Path) -> Iterator[Lab]:
    """The lab's toolchain registered, every device type naming it, the catalog read from ``catalog_file`` and SSH
    devices reached through SimTransport; undone on exit."""
    global LAB
    import edgefarm.devices.transport.ssh as ssh
    from edgefarm import registries
    from edgefarm.test_lists import catalog
    from edgefarm.toolchains import base as toolchains

    toolchains.register_toolchain(SimLab)
    built = registries.build(registries.current().site_dir)
    lab_registries = built.with_device_types(*(built.device_types[p].model_copy(
        update={"toolchains": (*built.device_types[p].toolchains, NAME)}) for p in PLATFORMS))
    original_load, original_ssh = catalog.Catalog.load, ssh.SSHTransport
    catalog.Catalog.load = classmethod(lambda cls, path=catalog_file, *, registries=None: original_load.__func__(
        cls, catalog_file, registries=registries))
    ssh.SSHTransport = SimTransport  # type: ignore[misc,assignment]
    _OUTPUT.real = (sys.stdout, sys.stderr)
    sys.stdout, sys.stderr = _Stream(_OUTPUT, 0), _Stream(_OUTPUT, 1)  # type: ignore[assignment]
    LAB = lab
    try:
        with registries.using(lab_registries):
            yield lab
    finally:
        LAB = None
        sys.stdout, sys.stderr = _OUTPUT.real
        ssh.SSHTransport = original_ssh  # type: ignore[misc]
        catalog.Catalog.load = original_load  # type: ignore[method-assign]
        toolchains.unregister_toolchain(NAME)


def stage_times_from_db(url: str) -> dict[str, tuple[float, float]]:
    """Per stage: the median of the recorded durations of passing, uncached runs, and the spread of their logs."""
    import statistics

    from sqlalchemy import text

    from edgefarm.results.db import read_only_engine

    engine = read_only_engine(url)
    found: dict[str, list[float]] = defaultdict(list)
    with engine.connect() as conn:
        for stage, seconds in conn.execute(text(
                "SELECT stage, duration_s FROM results WHERE status = 'pass' AND duration_s > 0")):
            found[stage].append(float(seconds))
    engine.dispose()
    times = dict(STAGE_TIMES)
    for stage, values in found.items():
        if stage in times and len(values) >= 2:
            logs = [math.log(v) for v in values]
            times[stage] = (statistics.median(values), min(1.0, statistics.pstdev(logs)))
    return times
