"""Run one ``edgellm`` command for a stage on a leased device of a platform.

A device is leased in the database (never more than its ``max_jobs``, across processes and hosts). Inputs come
from the artifact store and are staged into the device's cache (``cache/<sha256>``, verified on transfer and
reused by later stages). An infrastructure failure (unreachable, connection lost, ...) is recorded as an
attempt on that device, the device is avoided for the rest of the run, and the stage moves to another device of
the same platform; with none left, the InfrastructureError propagates (Prefect retries only those).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifacts.inuse import mark_in_use, release
from artifacts.kinds import ArtifactKind, Packing
from artifacts.store import ArtifactRef
from devices.inventory import Device
from devices.transport import CommandResult, RemoteNameError, Transport, open_transport
from edgellm.errors import ConfigurationError, ErrorKind, InfrastructureError
from results import leases, quarantine
from results.models import ResultStatus
from stages.outcome import classify, last_line
from tasks import device_cache
from tasks.farm import Farm
from toolchains.base import DeviceStep, ToolchainDriver

log = logging.getLogger(__name__)

LEASE_TTL_S = 60.0
LEASE_WAIT_S = 6 * 3600.0  # a busy platform queues work; it is not an error to wait for it
STAGING_TIMEOUT_S = 600.0


@dataclass
class DeviceRun:
    device: Device
    result: CommandResult
    status: ResultStatus
    error_kind: ErrorKind | None
    reason: str | None
    fetched: dict[str, Path]  # output name -> local path (only when the command ran)
    step: DeviceStep  # what ran
    log: ArtifactRef | None
    duration_s: float
    lease_wait_s: float
    job_dir: str
    env: dict[str, Any]  # `edgellm env` of the device (the toolchain version there is read from it)


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:150]


def ensure_on_device(farm: Farm, transport: Transport, ref: ArtifactRef) -> str:
    """Stage an artifact into the device cache once (a damaged entry is evicted and staged again); returns its
    path relative to the work dir."""
    remote = device_cache.entry(ref.sha256)
    if device_cache.usable(transport, ref.sha256, ref.packing):
        return remote
    with tempfile.TemporaryDirectory(dir=_scratch(farm)) as tmp:
        local = Path(tmp) / ref.sha256
        if ref.packing is Packing.TAR:
            farm.store.extract(ref.sha256, local)
        else:
            farm.store.get_file(ref.sha256, local)
        transport.run(["mkdir", "-p", "cache"], timeout=60)
        try:
            transport.put(local, remote)
        except (ConfigurationError, OSError):
            # another stage staged the same artifact meanwhile: the cache entry is there and verified
            if transport.run(["test", "-e", remote], timeout=60).exit_code != 0:
                raise
        device_cache.seal(transport, ref.sha256, ref.packing)  # put verified every file: record their digests
    return remote


FETCH_PREFIX = "fetch-"
_fetches = threading.local()  # the fetch dirs made by the stage running in this thread


@contextlib.contextmanager
def fetch_scope() -> Iterator[None]:
    """Fetch dirs made inside this block (by run_stage, for the stage body to read) are removed when it ends;
    while it runs they are marked in use, so gc leaves them alone."""
    outer = getattr(_fetches, "dirs", None)
    _fetches.dirs = []
    try:
        yield
    finally:
        for path, lock in _fetches.dirs:
            shutil.rmtree(path, ignore_errors=True)
            release(lock)
        _fetches.dirs = outer


def _fetch_dir(farm: Farm) -> Path:
    path = Path(tempfile.mkdtemp(dir=_scratch(farm), prefix=FETCH_PREFIX))
    held = getattr(_fetches, "dirs", None)
    if held is None:
        log.warning("%s made outside a fetch scope: only gc will remove it", path)
    else:
        held.append((path, mark_in_use(path)))
    return path


def _scratch(farm: Farm) -> Path:
    path = farm.ctx.host_work_dir / "scratch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def pushed(farm: Farm, toolchain: ToolchainDriver | None) -> list[ArtifactRef]:
    """The toolchain's files for its devices (``device_files``), in the store: staged like any input."""
    if toolchain is None:
        return []
    return [farm.store.put(path, ArtifactKind.OTHER) for path in toolchain.device_files()]


def toolchain_env(farm: Farm, device: Device, transport: Transport,
                  toolchain: ToolchainDriver | None) -> dict[str, Any]:
    """The device's ``edgellm env``, with what the toolchain's own probe printed there (once per device, toolchain
    and run) under ``toolchains``; the toolchain's files are staged first."""
    env = device_env_info(farm, device, transport)
    probe = toolchain.probe_step(device) if toolchain is not None else None
    if toolchain is None or probe is None:
        return env
    key = f"{device.id}\0{toolchain.name}"
    with farm.lock:
        known = farm.backend_versions.get(key)
    if known is None:
        for ref in pushed(farm, toolchain):
            ensure_on_device(farm, transport, ref)
        res = transport.run(probe.argv, timeout=120, env={**device.env, **probe.env} or None)
        if res.exit_code != 0:
            raise InfrastructureError(f"{device.id}: the {toolchain.name} probe failed: {last_line(res.stderr)}")
        try:
            known = json.loads(res.stdout)
        except json.JSONDecodeError:
            raise InfrastructureError(f"{device.id}: the {toolchain.name} probe printed no JSON: "
                                      f"{res.stdout[:200]!r}") from None
        with farm.lock:
            farm.backend_versions[key] = known
    return {**env, "toolchains": {toolchain.name: known}}


def device_env_info(farm: Farm, device: Device, transport: Transport) -> dict[str, Any]:
    """``edgellm env`` on the device, once per run (keys engine caches by the backend version there); the first
    contact of the run also sweeps what dead uploads left in its cache."""
    with farm.lock:
        known = farm.backend_versions.get(device.id)
    if known is not None:
        return known
    res = transport.run([device.interpreter, "-m", "edgellm", "env"], timeout=120, env=device.env or None)
    if res.exit_code != 0:
        raise InfrastructureError(f"{device.id}: `edgellm env` failed: {last_line(res.stderr)}")
    try:
        info = json.loads(res.stdout)
    except json.JSONDecodeError:
        raise InfrastructureError(f"{device.id}: `edgellm env` printed no JSON: {res.stdout[:200]!r}") from None
    with farm.lock:
        farm.backend_versions[device.id] = info
    device_cache.sweep_partials(transport)  # once per device and run, like this probe
    return info


def _acquire(farm: Farm, candidates: Sequence[Device], tried: set[str],
             exclusive: bool) -> tuple[Device, leases.Lease, float]:
    t0 = time.monotonic()
    delay = 0.02
    while True:
        with farm.lock:
            bad = set(farm.bad_devices)
        order = sorted((d for d in candidates if d.id not in tried), key=lambda d: (d.id in bad, d.id))
        if not order:
            raise InfrastructureError("no device left to try")
        for device in order:
            lease = leases.try_acquire(farm.engine, device.id, device.max_jobs, ttl_s=LEASE_TTL_S,
                                       slots=device.max_jobs if exclusive else 1)
            if lease is not None:
                return device, lease, time.monotonic() - t0
        if time.monotonic() - t0 > LEASE_WAIT_S:
            raise leases.LeaseTimeout(f"no free device among {', '.join(d.id for d in order)} "
                                      f"after {LEASE_WAIT_S:.0f} s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


def run_stage(
    farm: Farm,
    *,
    platform: str,
    what: str,  # names the job and stage in logs and attempts
    # (device, transport, job dir) -> argv, or a DeviceStep (argv, the extra environment the toolchain needs and
    # the outputs to fetch back: what the step actually made names them)
    argv: Callable[[Device, Transport, str], list[str] | DeviceStep],
    inputs: Sequence[ArtifactRef] = (),
    fetch_on: Sequence[ResultStatus] = (ResultStatus.PASS,),
    timeout: float,
    on_attempt_failed: Callable[[Device, InfrastructureError, float], None] | None = None,
    after: Callable[[Transport, DeviceRun], None] | None = None,  # runs while the lease is still held
    exclusive: bool = False,  # hold every slot of the device (benchmarks: nothing runs beside them)
    # the job's toolchain: only the platform's devices it drives; its files staged, its probe run (toolchain_env)
    toolchain: ToolchainDriver | None = None,
) -> DeviceRun:
    accepts = toolchain.drives if toolchain is not None else None
    candidates = [d for d in farm.inventory.select(platform=platform) if accepts is None or accepts(d)]
    if not candidates:
        raise ConfigurationError(f"no device of platform {platform} in the inventory {farm.inventory.directory}"
                                 + (" that the job's toolchain can drive" if accepts is not None else ""))
    held = quarantine.active(farm.engine)
    if held:
        candidates = [d for d in candidates if d.id not in held]
        if not candidates:
            raise InfrastructureError(f"every {platform} device is quarantined: " + "; ".join(
                f"{d}: {q.reason}" for d, q in sorted(held.items())))
    tried: set[str] = set()
    failures: list[str] = []
    while len(tried) < len(candidates):
        try:
            device, lease, waited = _acquire(farm, candidates, tried, exclusive)
        except InfrastructureError:
            break
        t0 = time.monotonic()
        try:
            with leases.kept_alive(farm.engine, lease), open_transport(device) as transport:
                run = _run_once(farm, device, transport, what, argv, [*inputs, *pushed(farm, toolchain)], fetch_on,
                                timeout, waited, t0, toolchain)
                if after is not None:
                    after(transport, run)
                return run
        except InfrastructureError as exc:
            elapsed = time.monotonic() - t0
            tried.add(device.id)
            with farm.lock:
                farm.bad_devices.add(device.id)
            failures.append(f"{device.id}: {str(exc).splitlines()[0]}")
            log.warning("%s: infrastructure failure on %s (%s); trying another %s device", what, device.id,
                        str(exc).splitlines()[0], platform)
            if on_attempt_failed is not None:
                on_attempt_failed(device, exc, elapsed)
    raise InfrastructureError(f"{what}: every {platform} device failed: " + "; ".join(failures))


def _run_once(farm: Farm, device: Device, transport: Transport, what: str,
              argv: Callable[[Device, Transport, str], list[str] | DeviceStep], inputs: Sequence[ArtifactRef],
              fetch_on: Sequence[ResultStatus], timeout: float, waited: float, t0: float,
              toolchain: ToolchainDriver | None) -> DeviceRun:
    job_dir = f"jobs/run-{farm.ctx.run_id}/{slug(what)}-{int(time.time() * 1000)}"
    device_env_info(farm, device, transport)  # first contact of the run: sweeps dead uploads before any staging
    for ref in inputs:
        ensure_on_device(farm, transport, ref)
    env = toolchain_env(farm, device, transport, toolchain)
    transport.run(["mkdir", "-p", job_dir], timeout=60)
    made = argv(device, transport, job_dir)
    step = made if isinstance(made, DeviceStep) else DeviceStep(made)
    command, step_env, fetch = step.argv, step.env, step.fetch
    logs = farm.ctx.host_work_dir / "logs" / f"run-{farm.ctx.run_id}"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{slug(what)}-{device.id}.log"
    log_path.write_text(f"$ {' '.join(command)}\n", encoding="utf-8")
    result = transport.run(command, timeout=timeout, log=log_path, env={**device.env, **step_env} or None)
    status, kind, reason = classify(result, timeout)
    fetched: dict[str, Path] = {}  # only what the step made names
    if status in fetch_on and fetch:
        local_dir = _fetch_dir(farm)
        for name, rel in fetch.items():
            dest = local_dir / name
            try:
                transport.get(f"{job_dir}/{rel}", dest)
                fetched[name] = dest
            except RemoteNameError:
                raise  # a hostile or broken device: never mistaken for a missing output
            except ConfigurationError:
                pass  # not written (the stage failed before it): judged below
            if name not in fetched and status is ResultStatus.PASS:
                shutil.rmtree(local_dir, ignore_errors=True)
                raise ConfigurationError(f"{what}: {device.id} passed but wrote no {rel}")
    log_ref = farm.store.put(log_path, ArtifactKind.LOG)
    return DeviceRun(device=device, result=result, status=status, error_kind=kind, reason=reason, fetched=fetched,
                     log=log_ref, duration_s=time.monotonic() - t0, lease_wait_s=waited, job_dir=job_dir,
                     env=env, step=step)


def promote_to_cache(transport: Transport, job_path: str, sha256: str) -> None:
    """Move a directory the device built (fetched and stored as ``sha256``) into its cache, sealed."""
    target = device_cache.entry(sha256)
    if device_cache.usable(transport, sha256, Packing.TAR):
        transport.run(["rm", "-rf", "--", job_path], timeout=300)
        return
    transport.run(["mkdir", "-p", "cache"], timeout=60)
    transport.run(["mv", "-T", "--", job_path, target], timeout=300)
    device_cache.seal(transport, sha256, Packing.TAR)
