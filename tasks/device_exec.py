"""Run one command of a stage's toolchain on a leased device of a platform.

A device is leased in the database (never more than its ``max_jobs``, across processes and hosts). What the farm
knows of it comes from the agent it pushes there (``tasks.agent``: standard-library Python, nothing installed): its
environment once per run, and per toolchain whether the files the driver requires are there
(``DeviceStages.device_requirements``) and what the driver's own probe prints (``probe_step``). Inputs come
from the artifact store and are staged into the device's cache (``cache/<sha256>``, verified on transfer and
reused by later stages), after the agent made room under the cache's bound; each entry a stage uses is marked in use
by the run (``tasks.engines``). How a command ended is the toolchain's to say (``classify_exit``): a device set up
wrong (``DeviceConfigurationError``: a tool or library missing, a build of another release) quarantines the device at
once with that reason; an out-of-memory kill is a resource failure with the device's memory figures. An
infrastructure failure (unreachable, connection lost, a device set up wrong, ...) is recorded as an attempt on that
device, the device is avoided for the rest of the run, and the stage moves to another device of the same platform;
with none left, the InfrastructureError propagates (Prefect retries only those).
"""

from __future__ import annotations

import contextlib
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

from edgefarm.artifacts.inuse import held_dir
from edgefarm.artifacts.kinds import ArtifactKind, Packing
from edgefarm.artifacts.store import ArtifactRef, StoreError
from edgefarm.devices import agent_client
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import CommandResult, RemoteNameError, Transport, open_transport
from edgefarm.results import leases, liveness, quarantine
from edgefarm.results.errors import RunReaped
from edgefarm.results.models import ResultStatus
from edgefarm.tasks import device_cache, engines
from edgefarm.tasks.farm import Farm
from edgefarm.tasks.host_gate import HostGate, HostGateTimeout, gate_dir, shares_host
from edgefarm.toolchains.base import DeviceStep, ToolchainDriver, edgellm_exit
from edgefarm.toolchains.probe import probe_toolchain
from edgellm.errors import (
    ConfigurationError,
    DeviceConfigurationError,
    EdgeLLMError,
    ErrorKind,
    InfrastructureError,
    ResourceError,
)

log = logging.getLogger(__name__)

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
    # the device's environment (the agent's env) with what the toolchain's probe read under "toolchains"
    env: dict[str, Any]
    snapshots: tuple[dict[str, Any], dict[str, Any]] | None = None  # the environment just before and after it


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)[:150]


def ensure_on_device(farm: Farm, transport: Transport, ref: ArtifactRef) -> str:
    """Stage an artifact into the device cache once (a damaged entry is evicted and staged again); returns its
    path relative to the work dir."""
    remote = device_cache.entry(ref.sha256)
    if device_cache.usable(transport, ref.sha256, ref.packing):
        return remote
    with held_dir(farm.ctx.scratch_dir, "stage-") as tmp:
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
        for held in _fetches.dirs:
            held.close()
        _fetches.dirs = outer


def _fetch_dir(farm: Farm) -> Path:
    scope = getattr(_fetches, "dirs", None)
    if scope is None:
        farm.ctx.scratch_dir.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(dir=farm.ctx.scratch_dir, prefix=FETCH_PREFIX))
        log.warning("%s made outside a fetch scope: only gc will remove it", path)
        return path
    held = contextlib.ExitStack()
    scope.append(held)
    return held.enter_context(held_dir(farm.ctx.scratch_dir, FETCH_PREFIX))


def pushed(farm: Farm, toolchain: ToolchainDriver | None) -> list[ArtifactRef]:
    """The toolchain's files for its devices (``device_files``), in the store: staged like any input."""
    if toolchain is None:
        return []
    return [farm.store.put(path, ArtifactKind.OTHER) for path in toolchain.device().device_files()]


def toolchain_env(farm: Farm, device: Device, transport: Transport,
                  toolchain: ToolchainDriver | None) -> dict[str, Any]:
    """The device's environment, with what the toolchain's checks and probe read there (once per device, toolchain
    and run) under ``toolchains``. A device whose files contradict the driver's requirements or the inventory
    raises DeviceConfigurationError (quarantined by the caller)."""
    env = device_env_info(farm, device, transport)
    if toolchain is None:
        return env
    key = f"{device.id}\0{toolchain.name}"
    with farm.lock:
        known = farm.backend_versions.get(key)
    if known is None:
        known = probe_toolchain(device, transport, toolchain)
        with farm.lock:
            farm.backend_versions[key] = known
    return {**env, "toolchains": {toolchain.name: known}}


def device_env_info(farm: Farm, device: Device, transport: Transport) -> dict[str, Any]:
    """The device's environment (the agent's ``env``), once per run; the first contact of the run also sweeps what
    dead uploads left in its cache."""
    with farm.lock:
        known = farm.backend_versions.get(device.id)
    if known is not None:
        return known
    info = agent_client.run(device, transport, "env", "--work-dir", ".")
    with farm.lock:
        farm.backend_versions[device.id] = info
    device_cache.sweep_partials(transport)  # once per device and run, like this probe
    return info


def device_failed(farm: Farm, device: Device, exc: InfrastructureError) -> None:
    """Avoid ``device`` for the rest of the run; one set up wrong is also quarantined with the reason."""
    with farm.lock:
        farm.bad_devices.add(device.id)
    reason = str(exc).splitlines()[0]
    if isinstance(exc, DeviceConfigurationError) and quarantine.quarantine(farm.engine, device.id, reason):
        log.warning("%s quarantined: %s", device.id, str(exc).splitlines()[0])


def _acquire(farm: Farm, candidates: Sequence[Device], tried: set[str],
             exclusive: bool) -> tuple[Device, leases.Lease, float]:
    """A lease on one of ``candidates`` (not ``tried``), waiting as long as it takes. Devices this run's own leases
    fill are skipped without asking the database (each ask is a write transaction: a lab of 200 busy devices made
    every waiting stage write 200 times a round); when this run fills them all, the wait ends as soon as one of its
    leases ends (``Farm.slots_freed``); when the database refuses (another run holds the device) it polls."""
    t0 = time.monotonic()
    delay = 0.02
    placing = len(candidates) > 1  # a stage with a choice of devices (a build): placed, and counted where it lands
    refused: set[str] = set()  # devices the database refused this stage (another run's leases fill them)
    while True:
        if (ended := liveness.reaped(farm.ctx.run_id)) is not None:
            raise ended  # another run reaped this one (it was suspended): waiting for a device is pointless
        with farm.slots_freed:
            left = [d for d in candidates if d.id not in tried]
            if not left:
                raise InfrastructureError("no device left to try")
            free = [d for d in left if farm.held_slots.get(d.id, 0) + _slots(d, exclusive) <= d.max_jobs]
            if placing:  # not ahead of a device this run placed fewer on and keeps busy
                free = placeable(farm, left, free, refused, time.monotonic() - t0)
            if not free:  # this run fills every one (or every one it should place on): one of its leases ends first
                farm.slots_freed.wait(timeout=1.0)
                continue
            order = preferred(farm, free)
        for device in order:
            if not _hold(farm, device, exclusive):
                continue  # another stage of this run took it meanwhile
            try:
                lease = leases.try_acquire(farm.engine, device.id, device.max_jobs, ttl_s=liveness.stale_limit_s(),
                                           slots=_slots(device, exclusive))
            except BaseException:
                _unhold(farm, device, exclusive)
                raise
            if lease is not None:
                if placing:
                    with farm.slots_freed:
                        farm.placed[device.id] += 1
                return device, lease, time.monotonic() - t0
            refused.add(device.id)
            _unhold(farm, device, exclusive)
        if time.monotonic() - t0 > LEASE_WAIT_S:
            raise leases.LeaseTimeout(f"no free device among {', '.join(d.id for d in left)} "
                                      f"after {LEASE_WAIT_S:.0f} s")
        with farm.slots_freed:
            farm.slots_freed.wait(timeout=delay)
        delay = min(delay * 1.5, 0.2)


PLACEMENT_SLACK = 1  # how many more placements than the least-placed device a device may have and still be taken
PLACEMENT_WAIT_S = 30.0  # how long a placement waits for a less-placed device before any free one will do


def placeable(farm: Farm, left: Sequence[Device], free: Sequence[Device], refused: set[str],
              waited_s: float = 0.0) -> list[Device]:
    """The ``free`` devices a stage with a choice may be placed on (the caller holds ``farm.slots_freed``): those this
    run placed at most ``PLACEMENT_SLACK`` more stages on than on the least-placed of the devices ``left`` that work
    and that the database did not refuse. A build otherwise took whichever device was free at that moment: a device
    between its own stages (the stages pinned to its engines not yet started) looked free and took more builds, and
    one device of a platform ran 90 stages while a peer ran 25 (the busiest device's work is the run's wall). So a
    build waits for a device this run keeps busy rather than pile onto a free one; one another run holds does not
    hold it back, and failed devices stay as a last resort. After ``PLACEMENT_WAIT_S`` of waiting every free device
    is placeable: a device kept busy by one long stage (an hour's accuracy run) must not idle its platform's others."""
    if waited_s >= PLACEMENT_WAIT_S:
        return list(free)
    bad = farm.bad_devices
    counted = [d for d in left if d.id not in bad and d.id not in refused] or list(left)
    fewest = min(farm.placed[d.id] for d in counted)
    return [d for d in free if farm.placed[d.id] <= fewest + PLACEMENT_SLACK or d.id in bad]


def preferred(farm: Farm, free: Sequence[Device]) -> list[Device]:
    """The order a stage with a choice of devices (a build) asks for ``free`` ones in (the caller holds
    ``farm.slots_freed``): devices that failed in this run last; then fewest such stages this run placed there (see
    ``placeable``); then fewest of this run's stages waiting for that device alone; then fewest slots this run holds
    there; then the id."""
    bad = farm.bad_devices
    return sorted(free, key=lambda d: (d.id in bad, farm.placed[d.id], farm.pinned_waiting[d.id],
                                       farm.held_slots.get(d.id, 0), d.id))


@contextlib.contextmanager
def _waiting_for(farm: Farm, pinned: Sequence[Device]) -> Iterator[None]:
    """Count a stage pinned to ``pinned`` (empty: not pinned) as waiting for them while it acquires (``preferred``)."""
    with farm.slots_freed:
        farm.pinned_waiting.update(d.id for d in pinned)
    try:
        yield
    finally:
        with farm.slots_freed:
            farm.pinned_waiting.subtract(d.id for d in pinned)


def _slots(device: Device, exclusive: bool) -> int:
    return device.max_jobs if exclusive else 1


def _hold(farm: Farm, device: Device, exclusive: bool) -> bool:
    with farm.slots_freed:
        held = farm.held_slots.get(device.id, 0)
        if held + _slots(device, exclusive) > device.max_jobs:
            return False
        farm.held_slots[device.id] = held + _slots(device, exclusive)
        return True


def _unhold(farm: Farm, device: Device, exclusive: bool) -> None:
    with farm.slots_freed:
        farm.held_slots[device.id] = max(0, farm.held_slots.get(device.id, 0) - _slots(device, exclusive))
        farm.slots_freed.notify_all()


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
    only: Sequence[str] | None = None,  # the devices it may run on (e.g. the one holding its engine); None: any
    reserve: int = 0,  # bytes the command will add to the device's cache (e.g. an engine): room made first
    snapshots: bool = False,  # take the device's environment just before and after the command (benchmarks)
) -> DeviceRun:
    accepts = toolchain.device().drives if toolchain is not None else None
    candidates = [d for d in farm.inventory.select(platform=platform) if accepts is None or accepts(d)]
    if only is not None:
        held = [d for d in candidates if d.id in only]
        if not held:
            raise InfrastructureError(f"{what}: it must run on {', '.join(only)} (which holds its engine), and no "
                                      f"such {platform} device is in the inventory {farm.inventory.directory}")
        candidates = held
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
            # a stage with one device to run on (the one holding its engine) waits for it; one with a choice is
            # placed (_acquire)
            with _waiting_for(farm, candidates if len(candidates) == 1 else ()):
                device, lease, waited = _acquire(farm, candidates, tried, exclusive)
        except RunReaped:
            raise
        except InfrastructureError:
            break
        t0 = time.monotonic()
        try:
            try:
                # after the lease (every holder takes the two in this order): a benchmark on a device of this host
                # has the host to itself, any other stage there waits for it (tasks.host_gate)
                with leases.kept_alive(farm.engine, lease), _gated(farm, device, exclusive, what), \
                        open_transport(device) as transport:
                    run = _run_once(farm, device, transport, what, argv, [*inputs, *pushed(farm, toolchain)],
                                    fetch_on, timeout, waited, t0, toolchain, reserve, snapshots)
                    if after is not None:
                        after(transport, run)
                    return run
            finally:
                _unhold(farm, device, exclusive)  # the lease has ended
        except (StoreError, HostGateTimeout):
            raise  # the artifact store failed, or the host stayed busy, not this device: another would fare no better
        except InfrastructureError as exc:
            elapsed = time.monotonic() - t0
            tried.add(device.id)
            device_failed(farm, device, exc)
            failures.append(f"{device.id}: {str(exc).splitlines()[0]}")
            log.warning("%s: infrastructure failure on %s (%s); trying another %s device", what, device.id,
                        str(exc).splitlines()[0], platform)
            if on_attempt_failed is not None:
                on_attempt_failed(device, exc, elapsed)
    raise InfrastructureError(f"{what}: every {platform} device failed: " + "; ".join(failures))


def _gated(farm: Farm, device: Device, exclusive: bool, what: str) -> contextlib.AbstractContextManager[None]:
    """The host gate around a command on ``device`` when it runs on this host; else nothing."""
    if not shares_host(device):
        return contextlib.nullcontext()
    gate = HostGate(gate_dir(farm.ctx.data_dir))
    return gate.exclusive(f"{what} on {device.id}") if exclusive else gate.shared(f"{what} on {device.id}")


def _run_once(farm: Farm, device: Device, transport: Transport, what: str,
              argv: Callable[[Device, Transport, str], list[str] | DeviceStep], inputs: Sequence[ArtifactRef],
              fetch_on: Sequence[ResultStatus], timeout: float, waited: float, t0: float,
              toolchain: ToolchainDriver | None, reserve: int = 0, snapshots: bool = False) -> DeviceRun:
    job_dir = f"jobs/run-{farm.ctx.run_id}/{slug(what)}-{int(time.time() * 1000)}"
    device_env_info(farm, device, transport)  # first contact of the run: sweeps dead uploads before any staging
    env = toolchain_env(farm, device, transport, toolchain)
    _stage_inputs(farm, device, transport, inputs, reserve)
    transport.run(["mkdir", "-p", job_dir], timeout=60)
    made = argv(device, transport, job_dir)
    step = made if isinstance(made, DeviceStep) else DeviceStep(made)
    command, step_env, fetch = step.argv, step.env, step.fetch
    logs = farm.ctx.host_work_dir / "logs" / f"run-{farm.ctx.run_id}"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{slug(what)}-{device.id}.log"
    log_path.write_text(f"$ {' '.join(command)}\n", encoding="utf-8")
    before = agent_client.run(device, transport, "env", "--work-dir", ".") if snapshots else None
    result = transport.run(command, timeout=timeout, log=log_path, env={**device.env, **step_env} or None)
    after = agent_client.run(device, transport, "env", "--work-dir", ".") if snapshots else None
    status, kind, reason = judge_exit(farm, device, transport, toolchain, result, timeout, command)
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
                     env=env, step=step, snapshots=(before, after) if before is not None and after is not None
                     else None)


def _stage_inputs(farm: Farm, device: Device, transport: Transport, inputs: Sequence[ArtifactRef],
                  reserve: int) -> None:
    """Stage what the device's cache lacks, after making room for it (and ``reserve``) under the cache's bound;
    every input is marked in use by the run."""
    missing = [ref for ref in inputs if not device_cache.usable(transport, ref.sha256, ref.packing)]
    incoming = sum(ref.size or 0 for ref in missing) + reserve
    if incoming:
        engines.make_room(farm, device, transport, incoming)
    for ref in inputs:
        ensure_on_device(farm, transport, ref)
    engines.mark_in_use(farm, transport, [ref.sha256 for ref in inputs])


def judge_exit(farm: Farm, device: Device, transport: Transport, toolchain: ToolchainDriver | None,
               result: CommandResult, timeout: float, command: Sequence[str]
               ) -> tuple[ResultStatus, ErrorKind | None, str | None]:
    """(status, error kind, reason) of a finished command, by its toolchain's conventions (``classify_exit``);
    raises what is the device's fault (InfrastructureError, DeviceConfigurationError: the caller quarantines)."""
    if result.timed_out:
        return ResultStatus.FAIL, ErrorKind.TEST_FAILURE, f"timed out after {timeout:.0f} s (stage timeout)"
    error = toolchain.device().classify_exit(result) if toolchain is not None else edgellm_exit(result)
    if error is None:
        return ResultStatus.PASS, None, None
    if isinstance(error, InfrastructureError):
        raise type(error)(f"{device.id}: {error}")
    reason = str(error)
    if isinstance(error, ResourceError):
        reason = f"{reason}; {memory_figures(farm, device, transport, command)}"
    status = ResultStatus.FAIL if error.kind is ErrorKind.TEST_FAILURE else ResultStatus.ERROR
    if isinstance(error, EdgeLLMError) and error.kind is ErrorKind.CONFIGURATION and _not_applicable(error):
        status = ResultStatus.NOT_APPLICABLE
    return status, error.kind, reason[:2000]


def _not_applicable(error: EdgeLLMError) -> bool:
    from edgefarm.toolchains.base import NotApplicable

    return isinstance(error, NotApplicable)


def memory_figures(farm: Farm, device: Device, transport: Transport, command: Sequence[str]) -> str:
    """The device's memory and the kernel's record of the kill (its OOM-killer line for the tool), for a resource
    failure's reason; what cannot be read is said so."""
    try:
        found = agent_client.run(device, transport, "oom")
    except EdgeLLMError as exc:
        return f"memory figures unavailable ({str(exc).splitlines()[0][:200]})"
    mib = 2**20
    total, free = found.get("memory_total_bytes"), found.get("memory_available_bytes")
    parts = [f"device memory {total // mib} MiB, {free // mib} MiB available after the kill"
             if isinstance(total, int) and isinstance(free, int) else "device memory unknown"]
    tool = Path(command[0]).name[:15] if command else ""  # the kernel's comm: the first 15 characters
    kills = [k for k in found.get("kills") or [] if k.get("comm") == tool]
    if kills:
        last = kills[-1]
        rss = last.get("anon_rss_kb")
        parts.append(f"the kernel's OOM killer killed {tool} (pid {last.get('pid')}"
                     + (f", {rss // 1024} MiB resident" if isinstance(rss, int) else "") + ")")
    else:
        parts.append(f"no OOM-killer record of {tool} in the kernel log the agent can read")
    return "; ".join(parts)


def promote_to_cache(transport: Transport, job_path: str, sha256: str) -> None:
    """Move a directory the device built (fetched and stored as ``sha256``) into its cache, sealed."""
    target = device_cache.entry(sha256)
    if device_cache.usable(transport, sha256, Packing.TAR):
        transport.run(["rm", "-rf", "--", job_path], timeout=300)
        return
    transport.run(["mkdir", "-p", "cache"], timeout=60)
    transport.run(["mv", "-T", "--", job_path, target], timeout=300)
    device_cache.seal(transport, sha256, Packing.TAR)
