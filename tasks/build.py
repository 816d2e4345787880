"""Build: ONNX -> engine on a device of the target platform, cached by content; the engine stays on that device.

Key (``build_key``; the generic body looks it up) = (ONNX sha256, platform, the job's toolchain and its version on
the device, what the toolchain adds of the device's install (route, stand-in) and of what its probe read there (e.g.
the runtime library's release), build parameters); an engine is remembered only once its precision was read back.
The product is an engine manifest (``tasks.engines.DeviceEngine``): the engine itself is sealed into the building
device's cache and never crosses back, but for the files the toolchain reads back to check it (and all of it when
``fetch_engines`` asks). A hit counts only while its device still holds the engine, re-hashed there to the digest
the farm recorded when it built it (``engine_present``; an entry that differs is evicted and built again). The
toolchain driver says how to build, where the engine lands and how its precision is read back (never a fixed
backend: a platform runs only the toolchains its device type names). The precision read back from the built engine
must be the one asked for.

Where the toolchain builds from the checkpoint on the platform's devices (a route with ``from_checkpoint``: a vendor's
direct, ONNX-less builder), the build reads the checkpoint the export was made from (staged into the device's cache
from the store) instead of the export, its key adds that checkpoint's digest, the build runs only on devices of that
route, the engine is read back against the checkpoint, and its manifest names the checkpoint every later stage stages
with it (it reads its weights from there at run time).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgefarm import stages
from edgefarm.artifacts.inuse import held_dir
from edgefarm.artifacts.kinds import ArtifactKind
from edgefarm.artifacts.store import ArtifactRef
from edgefarm.devices.inventory import Device
from edgefarm.devices.transport import Transport, open_transport
from edgefarm.results.models import ResultStatus
from edgefarm.stages import Stage
from edgefarm.stages.job import CheckpointRef, JobSpec
from edgefarm.stages.outcome import Keyed, StageOutcome
from edgefarm.tasks import engines
from edgefarm.tasks.common import attempt_recorder, from_device_run, work_again
from edgefarm.tasks.device_exec import DeviceRun, device_failed, run_stage, toolchain_env
from edgefarm.tasks.farm import Farm, FarmContext
from edgefarm.toolchains.base import DeviceStep, Route, ToolchainDriver, job_driver
from edgellm.errors import BugError, ConfigurationError, EdgeLLMError, ErrorKind, InfrastructureError

log = logging.getLogger(__name__)


def platform_env(farm: Farm, platform: str, toolchain: ToolchainDriver,
                 on_failed: Callable[[Device, InfrastructureError, float], None] | None = None,
                 ) -> tuple[Device, dict[str, Any]]:
    """The platform's first reachable device the toolchain drives, and its env there (no lease: a probe). A device
    that fails is avoided for the run (one set up wrong is quarantined), its failure given to ``on_failed`` (an
    attempt on it), and the next one asked."""
    errors = []
    with farm.lock:
        bad = set(farm.bad_devices)
    usable = [d for d in farm.inventory.select(platform=platform) if toolchain.device().drives(d)]
    for device in sorted(usable, key=lambda d: (d.id in bad, d.id)):
        t0 = time.monotonic()
        try:
            with open_transport(device) as transport:
                return device, toolchain_env(farm, device, transport, toolchain)
        except InfrastructureError as exc:
            device_failed(farm, device, exc)
            errors.append(f"{device.id}: {str(exc).splitlines()[0]}")
            if on_failed is not None:
                on_failed(device, exc, time.monotonic() - t0)
    raise InfrastructureError(f"no reachable {platform} device to ask for its toolchain version: {'; '.join(errors)}")


def engine_key_inputs(onnx_sha: str, job: JobSpec, version: str, runtime: dict[str, Any],
                      installed: dict[str, Any]) -> dict[str, object]:
    """An engine's cache key inputs: ``runtime`` what the toolchain takes of its probe on the device
    (``DeviceStages.runtime_key_inputs``), ``installed`` what its install contributes (``build_key_inputs``)."""
    return {"stage": "build", "onnx_sha256": onnx_sha, "platform": job.platform, "toolchain": job.toolchain,
            "toolchain_version": version, **runtime, **installed, **job.build_params}


def build_key(ctx: FarmContext, job: JobSpec, exported: StageOutcome) -> Keyed:
    """The table's cache key function: the export's ONNX, built by the toolchain as a device of the platform has it
    (probed, not leased)."""
    farm = Farm.get(ctx)
    toolchain = job_driver(job, ctx.data_dir)
    device_stages = toolchain.device()
    probe, env = platform_env(farm, job.platform, toolchain, attempt_recorder(farm, job, Stage.BUILD, toolchain))
    version = device_stages.device_version(probe, env)
    facts = (env.get("toolchains") or {}).get(toolchain.name) or {}
    inputs = engine_key_inputs(exported.outputs["onnx"].sha256, job, version, device_stages.runtime_key_inputs(facts),
                               device_stages.build_key_inputs(probe))
    route = toolchain.route(probe)
    if route is not None and route.from_checkpoint:  # the engine is the checkpoint's product, not the export's
        # (the export's digest stays in the key, as the table names it for every build: such an engine is made again
        # when the export changes, never reused for another checkpoint)
        inputs["checkpoint_sha256"] = _checkpoint(exported).sha256
    return Keyed(inputs, toolchain=job.toolchain, toolchain_version=version, route=route,
                 standin=device_stages.standin(probe))


def _checkpoint(exported: StageOutcome) -> CheckpointRef:
    """The checkpoint the export was made from (what a build from the checkpoint reads)."""
    found = exported.outputs.get("checkpoint")
    if not isinstance(found, CheckpointRef):
        raise BugError("the export handed on no checkpoint (a build from the checkpoint needs it)")
    return found


def _route_devices(farm: Farm, job: JobSpec, toolchain: ToolchainDriver, route: Route | None) -> list[str]:
    """The platform's devices the toolchain drives by ``route`` (the key's: an engine is made the way its key says)."""
    return [d.id for d in farm.inventory.select(platform=job.platform)
            if toolchain.device().drives(d) and toolchain.route(d) == route]


def engine_present(ctx: FarmContext, job: JobSpec, ref: ArtifactRef) -> bool:
    """Whether a cached engine manifest's engine can still be used: its bytes are in the store, or its device is in
    the inventory, not quarantined and still holds it, hashing to the digest the farm recorded (a miss builds it
    again)."""
    farm = Farm.get(ctx)
    try:
        engine = engines.load(farm, ref)
        if engine.stored is not None and farm.store.has(engine.stored):
            return True
        device = farm.inventory.devices.get(engine.device)
        if device is None:
            return False
        with open_transport(device) as transport:  # re-hashed against the farm's digest; a mismatch is evicted
            return engines.verified(device, transport, engine.digest)
    except (EdgeLLMError, OSError) as exc:
        log.info("build %s: cached engine %s not usable: %s", job.key, ref.sha256[:12], str(exc).splitlines()[0])
        return False


def build(ctx: FarmContext, job: JobSpec, exported: StageOutcome, *, keyed: Keyed) -> StageOutcome:
    """A cache miss: build the export's ONNX into an engine on a leased device of the platform; it stays there."""
    farm, onnx = Farm.get(ctx), exported.outputs["onnx"]
    toolchain = job_driver(job, ctx.data_dir)
    device_stages = toolchain.device()
    route = Route(keyed.route) if keyed.route is not None else None
    checkpoint = None
    source = onnx  # what the build reads: the export, or the checkpoint it was made from
    if route is not None and route.from_checkpoint:
        checkpoint = _checkpoint(exported)
        source = farm.store.put(Path(checkpoint.path), ArtifactKind.CHECKPOINT)

    def step(device: Device, transport: Transport, job_dir: str) -> DeviceStep:
        return device_stages.build_step(device, f"cache/{source.sha256}", f"{job_dir}/engine", job.build_params)

    made: dict[str, Any] = {}
    held = contextlib.ExitStack()  # the engine's read-back files, until it is judged

    def keep(transport: Transport, run: DeviceRun) -> None:
        if run.status is not ResultStatus.PASS:
            return
        sealed = engines.seal_built(farm, run.device, transport, run.job_dir)
        made["readback"] = engines.read_back(transport, sealed, device_stages.engine_readback(),
                                             held.enter_context(held_dir(farm.ctx.scratch_dir, "engine-")))
        stored = None
        if farm.ctx.fetch_engines:  # a policy asks for the bytes: the engine then also runs elsewhere
            with held_dir(farm.ctx.scratch_dir, "fetched-engine-") as tmp:
                transport.get(f"cache/{sealed.digest}", Path(tmp) / "engine")
                stored = farm.store.put(Path(tmp) / "engine", ArtifactKind.ENGINE)
            made["stored"] = stored
        made["engine"] = engines.DeviceEngine(
            digest=sealed.digest, device=run.device.id, platform=job.platform, toolchain=toolchain.name,
            toolchain_version=device_stages.device_version(run.device, run.env), bytes=sealed.bytes, files=sealed.files,
            stored=stored.sha256 if stored is not None else None, onnx=onnx.sha256,
            checkpoint=source.sha256 if checkpoint is not None else None)

    with held:
        run = run_stage(farm, platform=job.platform, what=f"build-{job.key}", argv=step, inputs=[source],
                        fetch_on=(), timeout=job.timeout(Stage.BUILD),
                        on_attempt_failed=attempt_recorder(farm, job, Stage.BUILD, toolchain),
                        after=keep, toolchain=toolchain, reserve=source.size or 0,
                        only=_route_devices(farm, job, toolchain, route))
        return _judged(farm, job, toolchain, run, onnx, made, keyed, checkpoint)


def _judged(farm: Farm, job: JobSpec, toolchain: ToolchainDriver, run: DeviceRun, onnx: ArtifactRef,
            made: dict[str, Any], keyed: Keyed, checkpoint: CheckpointRef | None) -> StageOutcome:
    out = from_device_run(Stage.BUILD, run, toolchain)
    if "engine" not in made:
        return out
    engine: engines.DeviceEngine = made["engine"]
    ref = engines.store(farm, engine)
    out.outputs["engine"] = ref
    out.artifacts.append(ref)
    if "stored" in made:
        out.artifacts.append(made["stored"])
    out.metrics["engine_bytes"] = (float(engine.bytes), "B")
    with held_dir(farm.ctx.scratch_dir, "engine-check-") as tmp:
        onnx_dir = None
        if toolchain.device().needs_onnx_for_check() and checkpoint is None:
            onnx_dir = Path(tmp) / "onnx"
            farm.store.extract(onnx.sha256, onnx_dir)
        try:
            if checkpoint is not None:
                found = toolchain.device().check_engine_from_checkpoint(made["readback"], Path(checkpoint.path),
                                                               job.build_params)
            else:
                found = toolchain.device().check_engine(made["readback"], onnx_dir, job.build_params)
        except ConfigurationError as exc:
            raise ConfigurationError(f"the engine on {engine.device} (cache/{engine.digest[:12]}) could not be read "
                                     f"back: {exc}") from None
    out.metrics.update(found.metrics)
    if found.precision != job.precision.value:  # never count an engine of another precision as evidence
        out.status, out.error_kind = ResultStatus.FAIL, ErrorKind.TEST_FAILURE
        out.reason = f"asked for {job.precision.value} but the built engine holds {found.precision} weights"
    else:
        keyed.made(ref, out.toolchain_version)  # only once read back: a hit's precision was checked
        out.reason = f"{found.detail}; engine {engine.digest[:12]} stays on {engine.device}"
    return out


def with_engine(ctx: FarmContext, job: JobSpec, stage: str, holder: StageOutcome,
                attempt: Callable[[StageOutcome], StageOutcome]) -> StageOutcome:
    """Run a stage that uses the engine ``holder`` hands on (``outputs["engine"]``). When the device keeping that
    engine is lost for the run (it failed for infrastructure reasons) and no copy of its bytes was fetched, the
    engine is built again from the same export on another device of the platform (the build cache then names the
    new one) and the stage runs once more with it; its reason says so. (An engine of the checkpoint-direct route is
    not built again here: its stage fails as the lost device's infrastructure error.)"""
    farm = Farm.get(ctx)
    engine = engines.load(farm, holder.outputs["engine"])

    def lost() -> bool:
        with farm.lock:
            return (engine.device in farm.bad_devices and engine.stored is None and engine.onnx is not None
                    and engine.checkpoint is None)  # an engine built from the checkpoint is not built again here

    if not lost():
        try:
            return attempt(holder)
        except InfrastructureError:
            if not lost():
                raise
    export = stages.spec(Stage.EXPORT).cache
    assert export is not None and engine.onnx is not None
    exported = StageOutcome(stage=Stage.EXPORT, status=ResultStatus.PASS,
                            outputs={"onnx": farm.store.ref(engine.onnx, export.kind, export.packing)})
    log.warning("%s: engine %s was lost with %s; building it again", job.key, engine.digest[:12], engine.device)
    rebuilt = work_again(ctx, Stage.BUILD, job, [exported])
    if not rebuilt.passed or "engine" not in rebuilt.outputs:  # judged as the build was (infrastructure raised)
        return StageOutcome(stage=stage, status=ResultStatus.ERROR if rebuilt.passed else rebuilt.status,
                            error_kind=rebuilt.error_kind or ErrorKind.BUG, device=rebuilt.device,
                            reason=f"engine {engine.digest[:12]} was lost with {engine.device}, and building it "
                                   f"again did not pass: {rebuilt.reason}"[:2000]).done()
    again = copy.copy(holder)
    again.outputs = {**holder.outputs, "engine": rebuilt.outputs["engine"]}
    out = attempt(again)
    new = engines.load(farm, rebuilt.outputs["engine"])
    note = (f"engine built again on {new.device} ({new.digest[:12]}): {engine.device}, which held "
            f"{engine.digest[:12]}, was lost")
    out.reason = f"{out.reason}; {note}" if out.reason else note
    return out
